"""Kernel notice -> OwnerBackEvent on NATS: p50/p99 on the host (sim transport), ratio in the VM.

  python -m bench.kmod_bridge [--rounds 300] [--vm] [--vm-rounds 20]

Host: a nats-server, the kernel stand-in and the bridge each run as their own
process (``python -m gpushare_sim.kernel``, ``python -m gpushare_kmod_bridge``
with the sim transport and the cgroup source). The owners are real processes,
each alone in a pid namespace and in a cgroup named as a pod's container (so
a writable cgroup hierarchy is needed: root). Each round this process plays
solver and workload: ``detect`` a namespace over NATS, report an ioctl on the
stand-in's hook socket, wait for the OwnerBackEvent, ``release`` it. Figures: the event's own
``notice_to_publish_ms`` (stand-in's CLOCK_MONOTONIC hit time -> the bridge's
publish), the same to delivery here, and the release request round trip.

VM (``--vm``): the same rounds against the real module in the qemu guest
(software emulation, so absolute times mean little); the figure is the
notice -> publish p50 as a ratio to the same run's release round trip p50.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from gpushare_common import events
from gpushare_common.bus import Bus, BusError
from gpushare_common.settings import NatsSettings
from gpushare_sim.shorttmp import short_mkdtemp

from bench.procs import process
from bench.report import Row, emit, median, percentile
from tests.support.nats import NatsServer

NODE = "bench-node"
PART = "kmod-bridge"
OWNERS = 8
PATTERN = r"gpushare-bench-\w+/(?P<namespace>[^_/]+)_(?P<pod>[^_/]+)_(?P<container>[^_/]+)_(?P<container_id>\w+)$"
Owner = tuple[int, int]  # pid namespace, host pid


def _child_of(pid: int, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise RuntimeError(f"unshare (pid {pid}) started no child within {timeout}s")


@contextlib.contextmanager
def owners(count: int) -> Iterator[list[Owner]]:
    """``count`` owners, each a process alone in a pid namespace, in a cgroup the bridge's cgroup
    source maps to a pod's container."""
    bases = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))
    base = next((b for b in bases if (b / "cgroup.procs").exists() and os.access(b, os.W_OK)), None)
    if base is None:
        raise RuntimeError(f"none of {', '.join(map(str, bases))} is a writable cgroup hierarchy (run as root)")
    top = base / f"gpushare-bench-{uuid.uuid4().hex[:8]}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        found = []
        for i in range(count):
            leaf = top / f"bench_owner-{i}_main_{i:012x}"
            leaf.mkdir(parents=True)
            procs.append(subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sleep", "3600"]))
            child = _child_of(procs[-1].pid)
            (leaf / "cgroup.procs").write_text(str(child))
            found.append((os.stat(f"/proc/{child}/ns/pid").st_ino, child))
        yield found
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        _remove_cgroups(top)


def _remove_cgroups(top: Path, timeout: float = 10) -> None:
    """rmdir each leaf once its process (killed with its unshare) has been reaped."""
    deadline = time.monotonic() + timeout
    for leaf in [*sorted(top.glob("*/"), reverse=True), top]:
        while leaf.exists():
            try:
                leaf.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


async def wait_path(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(path.exists):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear within {timeout}s")
        await asyncio.sleep(0.02)


async def hook_ioctl(path: str, owner: Owner) -> None:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(json.dumps({"pidns": owner[0], "pid": owner[1], "type": 0x46}).encode() + b"\n")
    await reader.readline()
    writer.close()


@contextlib.asynccontextmanager
async def subscriber(settings: NatsSettings) -> AsyncIterator[tuple[Bus, asyncio.Queue[tuple[int, events.AnyEvent]]]]:
    bus = Bus(settings, "bench-solver")
    await bus.connect()
    got: asyncio.Queue[tuple[int, events.AnyEvent]] = asyncio.Queue()

    async def on_event(event: events.AnyEvent) -> None:
        got.put_nowait((time.monotonic_ns(), event))

    await bus.subscribe(bus.subjects.event(NODE, "ownerback"), on_event)
    try:
        yield bus, got
    finally:
        await bus.drain()


async def ready(bus: Bus) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(BusError):  # not serving yet
            reply = await bus.request(bus.subjects.kmod_cmd(NODE, "stats"), events.KmodCommand(node=NODE, op="stats"))
            if isinstance(reply, events.KmodReply) and reply.status == 0:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("the bridge did not become ready within 60s")


async def rounds(bus: Bus, got: asyncio.Queue[tuple[int, events.AnyEvent]], hook: str,
                 count: int, owners: list[Owner]) -> tuple[list[float], list[float], list[float]]:
    publish, delivered, rtt = [], [], []
    subject = bus.subjects.kmod_requests(NODE, "solver")  # detect and release: the solver's
    for i in range(count):
        owner = owners[i % len(owners)]
        pidns = owner[0]
        detect = await bus.request(subject, events.KmodCommand(node=NODE, op="detect", pidns=(pidns,)))
        assert isinstance(detect, events.KmodReply) and detect.status == 0, detect
        call = asyncio.create_task(hook_ioctl(hook, owner))
        arrived, event = await asyncio.wait_for(got.get(), 10)
        assert isinstance(event, events.OwnerBackEvent)
        start = time.perf_counter()
        await bus.request(subject, events.KmodCommand(node=NODE, op="release", pidns=(pidns,)))
        rtt.append((time.perf_counter() - start) * 1000)
        await call
        publish.append(event.notice_to_publish_ms)
        delivered.append((arrived - event.kernel_ts_ns) / 1e6)
    return publish, delivered, rtt


async def host_bench(count: int) -> list[Row]:
    server = NatsServer().start()
    tmp = short_mkdtemp("kbb-")
    settings = NatsSettings(url=server.url, prefix="bench.v1", stream="BENCHKMOD", kv_prefix="benchkmod")
    env = {"GPUSHARE_NODE_NAME": NODE, "GPUSHARE_NATS_URL": server.url, "GPUSHARE_NATS_PREFIX": "bench.v1",
           "GPUSHARE_NATS_ENSURE_LAYOUT": "true",
           "GPUSHARE_NATS_KV_PREFIX": "benchkmod", "GPUSHARE_KMOD_TRANSPORT": "sim",
           "GPUSHARE_KMOD_SIM_SOCKET": str(tmp / "k.sock"), "GPUSHARE_KMOD_SOURCES": "cgroup",
           "GPUSHARE_KMOD_CGROUP_PATTERN": PATTERN,
           "GPUSHARE_HTTP_HOST": "127.0.0.1", "GPUSHARE_HTTP_PORT": "0", "GPUSHARE_LOG_LEVEL": "WARNING"}
    kernel = [sys.executable, "-m", "gpushare_sim.kernel", "--socket", str(tmp / "k.sock"),
              "--hook-socket", str(tmp / "h.sock")]
    try:
        with owners(OWNERS) as found, process(kernel, quiet=True), \
                process([sys.executable, "-m", "gpushare_kmod_bridge"], env, quiet=True):
            await wait_path(tmp / "h.sock")
            async with subscriber(settings) as (bus, got):
                await ready(bus)
                await rounds(bus, got, str(tmp / "h.sock"), 20, found)  # warm-up
                publish, delivered, rtt = await rounds(bus, got, str(tmp / "h.sock"), count, found)
    finally:
        server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    p99 = percentile(publish, 99)
    return [
        Row(PART, "notice->publish p50 (sim, host)", median(publish), "ms"),
        Row(PART, "notice->publish p99 (sim, host)", p99, "ms", "<= 5", p99 <= 5),
        Row(PART, "notice->delivered p50 (sim, host)", median(delivered), "ms"),
        Row(PART, "notice->delivered p99 (sim, host)", percentile(delivered, 99), "ms"),
        Row(PART, "release round trip p50 (sim, host)", median(rtt), "ms"),
    ]


def vm_bench(count: int) -> list[Row]:
    from tests.kmod_bridge.test_vm import run_bridge_vm

    run = run_bridge_vm(count, timeout_s=900)
    found = run.results().get("ownerback")
    if found is None:
        raise RuntimeError(f"the VM run printed no ownerback result:\n{run.output[-3000:]}")
    latency, rtt = int(found["latency_p50_us"]) / 1000, int(found["rtt_p50_us"]) / 1000
    return [
        Row(PART, "notice->publish p50 (netlink, VM)", latency, "ms"),
        Row(PART, "release round trip p50 (netlink, VM)", rtt, "ms"),
        Row(PART, "notice->publish / release rtt (VM)", latency / rtt, "ratio"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kmod_bridge")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--vm", action="store_true", help="also run the real module in the qemu VM")
    parser.add_argument("--vm-rounds", type=int, default=20)
    args = parser.parse_args()
    rows = asyncio.run(host_bench(args.rounds))
    if args.vm:
        rows += vm_bench(args.vm_rounds)
    emit(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Kernel notice -> OwnerBackEvent on NATS: p50/p99 on the host (sim transport), ratio in the VM.

  python -m bench.kmod_bridge [--rounds 300] [--vm] [--vm-rounds 20]

Host: a nats-server, the kernel stand-in and the bridge each run as their own
process (``python -m gpushare_sim.kernel``, ``python -m gpushare_kmod_bridge``
with the sim transport). Each round this process plays solver and workload:
``detect`` a namespace over NATS, report an ioctl on the stand-in's hook
socket, wait for the OwnerBackEvent, ``release`` it. Figures: the event's own
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
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from gpushare_common import events
from gpushare_common.bus import Bus
from gpushare_common.settings import NatsSettings

from bench.procs import process
from bench.report import Row, emit, median, percentile
from tests.support.nats import NatsServer

NODE = "bench-node"
PART = "kmod-bridge"


async def wait_path(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(path.exists):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear within {timeout}s")
        await asyncio.sleep(0.02)


async def hook_ioctl(path: str, pidns: int) -> None:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(json.dumps({"pidns": pidns, "pid": os.getpid(), "type": 0x46}).encode() + b"\n")
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
        with contextlib.suppress(Exception):
            reply = await bus.request(bus.subjects.kmod_cmd(NODE), events.KmodCommand(node=NODE, op="stats"))
            if isinstance(reply, events.KmodReply) and reply.status == 0:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("the bridge did not become ready within 60s")


async def rounds(bus: Bus, got: asyncio.Queue[tuple[int, events.AnyEvent]], hook: str,
                 count: int) -> tuple[list[float], list[float], list[float]]:
    publish, delivered, rtt = [], [], []
    subject = bus.subjects.kmod_cmd(NODE)
    for i in range(count):
        pidns = 4026540000 + i % 50
        await bus.request(subject, events.KmodCommand(node=NODE, op="detect", pidns=(pidns,)))
        call = asyncio.create_task(hook_ioctl(hook, pidns))
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
    tmp = Path(tempfile.mkdtemp(prefix="kbb-", dir="/tmp"))
    settings = NatsSettings(url=server.url, prefix="bench.v1", stream="BENCHKMOD", kv_prefix="benchkmod")
    env = {"GPUSHARE_NODE_NAME": NODE, "GPUSHARE_NATS_URL": server.url, "GPUSHARE_NATS_PREFIX": "bench.v1",
           "GPUSHARE_NATS_ENSURE_LAYOUT": "true",
           "GPUSHARE_NATS_KV_PREFIX": "benchkmod", "GPUSHARE_KMOD_TRANSPORT": "sim",
           "GPUSHARE_KMOD_SIM_SOCKET": str(tmp / "k.sock"), "GPUSHARE_KMOD_SOURCES": "",
           "GPUSHARE_HTTP_HOST": "127.0.0.1", "GPUSHARE_HTTP_PORT": "0", "GPUSHARE_LOG_LEVEL": "WARNING"}
    kernel = [sys.executable, "-m", "gpushare_sim.kernel", "--socket", str(tmp / "k.sock"),
              "--hook-socket", str(tmp / "h.sock")]
    try:
        with process(kernel, quiet=True), process([sys.executable, "-m", "gpushare_kmod_bridge"], env, quiet=True):
            await wait_path(tmp / "h.sock")
            async with subscriber(settings) as (bus, got):
                await ready(bus)
                await rounds(bus, got, str(tmp / "h.sock"), 20)  # warm-up
                publish, delivered, rtt = await rounds(bus, got, str(tmp / "h.sock"), count)
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

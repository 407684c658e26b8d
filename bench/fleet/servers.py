"""The benchmark's NATS cluster: three nats-server processes with routes on loopback and their
HTTP monitoring endpoint, each one killable and restartable with its store; what each costs
(CPU seconds and resident memory from /proc) and what JetStream holds (``/jsz``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare_common.bus import Bus, Transient
from gpushare_common.retry import Backoff, retry
from gpushare_common.settings import NatsSettings
from gpushare_sim import natsd
from gpushare_sim.run.lifeline import owned
from gpushare_sim.run.procs import wait_ports

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Holdings:
    """What JetStream holds, as the servers report it."""

    streams: int
    consumers: int  # durable ones (those of key-value listings come and go)
    raft_groups: int  # the meta group, one per stream, one per durable consumer


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def proc_rss(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class NatsCluster:
    """Servers that bind their own ports (any free ones) and report them in ``nats/ports``; a
    restart takes back the ports its server bound."""

    def __init__(self, work: Path, size: int = 3) -> None:
        names = [f"nats-{i}" for i in range(1, size + 1)]
        self.ports = work / "nats" / "ports"
        self.members = {m.name: m for m in natsd.members(names, work / "nats", self.ports, leaves=True)}
        self.work = work
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.cpu_gone: dict[str, float] = dict.fromkeys(self.members, 0.0)  # CPU of killed instances

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{m.client_port}" for m in self.members.values())

    @property
    def addresses(self) -> str:
        return ",".join(f"127.0.0.1:{m.client_port}" for m in self.members.values())

    def settings(self, **overrides: Any) -> NatsSettings:
        return NatsSettings(url=self.url, stream_replicas=min(3, len(self.members)), reconnect_wait_s=0.2,
                            **overrides)  # fmt: skip

    def start(self, name: str | None = None) -> None:
        """Every server, one after another (each dials those bound before it), or ``name`` again."""
        self.ports.mkdir(parents=True, exist_ok=True)
        if name is not None:
            if (running := self.procs.get(name)) is not None and running.poll() is None:
                raise RuntimeError(f"{name} is still running (pid {running.pid}): kill it before starting it again")
            wait_ports(self.ports, self._spawn(self.members[name]))
            return
        started: list[natsd.Member] = []
        for member in list(self.members.values()):
            ports = wait_ports(self.ports, self._spawn(natsd.seeded(member, started)))
            started.append(natsd.bound(member, ports, natsd.leaf_listener(ports)))  # where the leaves connect
        self.members = {m.name: m for m in natsd.meshed(started)}
        for member in self.members.values():  # a restart dials every other server
            self._config(member)

    def _config(self, member: natsd.Member) -> Path:
        config = self.work / "nats" / f"{member.name}.conf"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(natsd.server_config(member))
        return config

    def _spawn(self, member: natsd.Member) -> subprocess.Popen[bytes]:
        config = self._config(member)
        with (self.work / "nats" / f"{member.name}.log").open("ab") as log:
            proc = subprocess.Popen(owned([natsd.server_binary(), "-c", str(config)]),
                                    stdout=log, stderr=log, stdin=subprocess.DEVNULL)  # fmt: skip
        self.procs[member.name] = proc
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL: a crash, no leadership handed over."""
        proc = self.procs[name]
        self.cpu_gone[name] += proc_cpu_s(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    async def install(self, settings: NatsSettings) -> None:
        """The installer's step: the stream and every bucket, at the cluster's replica count."""
        bus = Bus(settings, "installer")
        await bus.connect()
        try:
            await retry(bus.ensure_layout, (Transient,), "create the stream and buckets", backoff=Backoff(0.1, 1.0),
                        deadline_s=60)  # fmt: skip
        finally:
            await bus.drain()

    # --- what they cost and hold ---------------------------------------------

    def cpu_s(self) -> dict[str, float]:
        return {n: self.cpu_gone[n] + proc_cpu_s(p.pid) for n, p in self.procs.items()}

    def rss(self) -> dict[str, int]:
        return {n: proc_rss(p.pid) for n, p in self.procs.items()}

    def monitor(self, name: str, path: str, timeout: float = 10.0) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.members[name].monitor_port}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            doc: dict[str, Any] = json.loads(answer.read())
        return doc

    def holdings(self) -> Holdings:
        """Streams, durable consumers and raft groups, as the first live server that answers sees
        them (the layout's assets have 3 replicas: each server holds all of them)."""
        failure: Exception | None = None
        for name, proc in self.procs.items():
            if proc.poll() is None:
                try:
                    return _holdings(self.monitor(name, "/jsz?streams=true&consumers=true&config=true&raft=true",
                                                  timeout=60))  # fmt: skip
                except (OSError, ValueError) as err:
                    failure = err
        raise RuntimeError(f"no server answered /jsz: {failure!r}")

    def healthy(self, name: str) -> bool:
        """The server's JetStream is up and every asset it holds is current (``/healthz``)."""
        try:
            return self.monitor(name, "/healthz").get("status") == "ok"
        except (OSError, ValueError):
            return False

    def wait_healthy(self, timeout: float = 60.0) -> float:
        """Wait until every server is healthy; the seconds it took."""
        start = time.monotonic()
        while not all(self.healthy(name) for name in self.members):
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"the NATS cluster was not healthy within {timeout}s")
            time.sleep(0.1)
        return time.monotonic() - start

    def stream_leader(self, stream: str, wait_s: float = 30.0) -> str | None:
        """The server leading ``stream``; None when none reports one within ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                with contextlib.suppress(OSError, ValueError):
                    if proc.poll() is None and (leader := self._leader(name, stream)):
                        return leader
            time.sleep(0.5)
        return None

    def _leader(self, name: str, stream: str) -> str:
        doc = self.monitor(name, "/jsz?streams=true", timeout=30)
        for account in doc.get("account_details") or []:
            for detail in account.get("stream_detail") or []:
                if detail["name"] == stream:
                    return str((detail.get("cluster") or {}).get("leader") or "")
        return ""


def _holdings(doc: dict[str, Any]) -> Holdings:
    streams = [s for a in doc.get("account_details") or [] for s in a.get("stream_detail") or []]
    groups = {s["stream_raft_group"] for s in streams if s.get("stream_raft_group")}
    durable = [c for s in streams for c in s.get("consumer_detail") or []
               if (c.get("config") or {}).get("durable_name")]  # a listing's consumers come and go
    groups |= {c["cluster"]["raft_group"] for c in durable if (c.get("cluster") or {}).get("raft_group")}
    return Holdings(streams=len(streams), consumers=len(durable),
                    raft_groups=len(groups) + (1 if doc.get("meta_cluster") else 0))

"""The emulated fleet as the benchmark drives it: worker processes, their commands and counters."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpushare_common.layout import Layout
from gpushare_sim.run.lifeline import owned

from bench.fleet.model import Profile
from bench.fleet.servers import proc_cpu_s


@dataclass
class FleetStats:
    """The workers' counters added up (cumulative, except the clock lag: since the last stats)."""

    nodes: int = 0
    ready: int = 0
    refused: int = 0
    cpu_s: float = 0.0
    sent: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    lag_ms_p50: float = 0.0  # the worst worker's
    lag_ms_max: float = 0.0
    connected: int = 0
    links: int = 0
    losses: int = 0
    dropped: int = 0

    def add(self, doc: dict[str, Any], cpu_s: float) -> None:
        self.nodes += doc["nodes"]
        self.ready += doc["ready"]
        self.refused += doc["refused"]
        self.cpu_s += cpu_s
        for name in ("sent", "answers", "errors"):
            getattr(self, name).update(doc[name])
        self.lag_ms_p50 = max(self.lag_ms_p50, doc["lag_ms_p50"])
        self.lag_ms_max = max(self.lag_ms_max, doc["lag_ms_max"])
        for name in ("connected", "links", "losses", "dropped"):
            setattr(self, name, getattr(self, name) + doc[name])


class Fleet:
    def __init__(self, addresses: str, layout: Layout, profile: Profile, workers: int, logs: Path) -> None:
        self.addresses, self.layout, self.profile = addresses, layout, profile
        self.count, self.logs = workers, logs
        self.procs: list[asyncio.subprocess.Process] = []
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        profile = json.dumps(asdict(self.profile))
        for index in range(self.count):
            argv = [sys.executable, "-m", "bench.fleet.worker", "--servers", self.addresses, "--index", str(index),
                    "--workers", str(self.count), "--prefix", self.layout.prefix, "--stream", self.layout.stream,
                    "--kv-prefix", self.layout.kv_prefix, "--profile", profile]  # fmt: skip
            with (self.logs / f"fleet-worker-{index}.log").open("ab") as log:
                self.procs.append(await asyncio.create_subprocess_exec(
                    *owned(argv), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log))

    async def command(self, op: str, wait_s: float = 60.0, **fields: Any) -> list[dict[str, Any]]:
        """Send one command to every worker; their answers, in worker order."""
        async with self._lock:
            line = (json.dumps({"op": op, **fields}) + "\n").encode()
            for proc in self.procs:
                assert proc.stdin is not None
                proc.stdin.write(line)
                await proc.stdin.drain()
            return [await asyncio.wait_for(self._answer(proc), wait_s) for proc in self.procs]

    @staticmethod
    async def _answer(proc: asyncio.subprocess.Process) -> dict[str, Any]:
        assert proc.stdout is not None
        line = await proc.stdout.readline()
        if not line:
            raise RuntimeError(f"fleet worker {proc.pid} exited with {await proc.wait()} (see its log)")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def grow(self, nodes: int, rate: float, timeout: float, servers: list[str] | None = None) -> float:
        """Grow to ``nodes`` (``rate`` a second in all; ``servers``: node ``i``'s own server, its
        leaf, at ``i``); the seconds it took."""
        own = {"servers": servers} if servers else {}
        answers = await self.command("grow", timeout + nodes / rate + 30, nodes=nodes, rate=rate / self.count,
                                     timeout=timeout, **own)  # fmt: skip
        return max(float(a["seconds"]) for a in answers)

    async def pause(self) -> None:
        await self.command("pause")

    async def resume(self) -> None:
        await self.command("resume")

    async def stats(self) -> FleetStats:
        total = FleetStats()
        for proc, doc in zip(self.procs, await self.command("stats"), strict=True):
            total.add(doc, proc_cpu_s(proc.pid))
        return total

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.returncode is None and proc.stdin is not None:
                proc.stdin.write(b'{"op": "stop"}\n')
                proc.stdin.close()
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()

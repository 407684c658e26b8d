"""The promises the soak checks while it runs, each a named invariant.

- ``owner-back``: every owner's call is let go only once its borrowers' processes are all gone
  (the kernel stand-in's guard looks at the instant of the release: see ``gpushare_sim.kernel``);
  a release by the kernel's timeout while a borrower lived is a violation too.
- ``evicted-once``: every eviction record is the only ``evicted`` one of its pod.
- ``evicted-only-borrowers``: only pods the soak made as borrowers or sharers are evicted.
- ``device-exclusive``: the kubelet stand-ins never give one device to two containers.
- ``no-termination``: no JetStream message was terminated (the soak sends no bad input, so
  every termination would have been for a failure that may pass).
- ``recovery``: every service is ready again within the bound after each fault, and no part
  exits by itself (a crash the faults did not cause).
- ``share-running``: a SharePod runs within the bound while the node has room for it.
- ``released``: when no fault stops a part of a node (``kill``, ``leaf``), every owner's call is
  let go by the solver's release, never by the kernel's deadline: faults off the node (the NATS
  cluster, the API server) leave the owner-back and the release on the node.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpushare_common import events

from gpushare_sim.run.cluster import Cluster
from gpushare_sim.run.procs import http_json, http_text

INVARIANTS = ("owner-back", "evicted-once", "evicted-only-borrowers", "device-exclusive", "no-termination",
              "recovery", "share-running", "released")  # fmt: skip
NODE_FAULTS = frozenset({"kill", "leaf"})  # faults that stop a part of a node: the kernel's deadline may act


@dataclass(frozen=True, slots=True)
class Violation:
    at: float  # seconds into the soak
    invariant: str
    detail: str


@dataclass
class Checks:
    cluster: Cluster
    started: float = field(default_factory=time.monotonic)
    violations: list[Violation] = field(default_factory=list)
    borrowers: set[str] = field(default_factory=set)
    sharers: set[str] = field(default_factory=set)
    evicted: Counter[str] = field(default_factory=Counter)
    verdicts_seen: dict[str, int] = field(default_factory=dict)  # node -> verdicts read
    owner_backs: int = 0  # guarded owner-backs settled
    deaths: set[tuple[str, int]] = field(default_factory=set)  # (part, its start) seen dead
    records_seen: int = 0
    terminated: dict[str, float] = field(default_factory=dict)  # metric line -> count reported
    late: set[str] = field(default_factory=set)  # SharePods reported as not running in time
    expect_release: bool = False  # no fault stops a part of a node: every owner is let go by RELEASE

    def fail(self, invariant: str, detail: str) -> None:
        self.violations.append(Violation(round(time.monotonic() - self.started, 1), invariant, detail))

    def on_record(self, record: events.EvictionRecord) -> None:
        if record.outcome != "evicted":
            return
        self.evicted[record.pod] += 1
        if self.evicted[record.pod] > 1:
            self.fail("evicted-once", f"{record.pod} evicted {self.evicted[record.pod]} times ({record.reason})")
        if record.pod not in self.borrowers | self.sharers:
            self.fail("evicted-only-borrowers", f"{record.pod} evicted ({record.reason}) but the soak made it "
                      "neither a borrower nor a sharer")  # fmt: skip

    def running_in_time(self, sharing: dict[str, tuple[str, float]], running: set[str],
                        bound_s: float) -> None:  # fmt: skip
        """Every SharePod created more than ``bound_s`` ago runs (each is reported once)."""
        now = time.monotonic()
        for name, (node, created) in sharing.items():
            if name not in running and now - created > bound_s and name not in self.late:
                self.late.add(name)
                self.fail("share-running", f"SharePod {name} on {node} not running {now - created:.0f}s after "
                          "it was created")  # fmt: skip

    async def poll(self) -> None:
        """The checks that read the cluster's state: run every few seconds and at the end."""
        for node in self.cluster.nodes:
            await self._guards(node.name, str(node.hook_socket))
            await self._devices(node.name)
            await self._terminations(node.name)

    async def _guards(self, node: str, hook: str) -> None:
        verdicts = await ask_kernel(hook, {"op": "verdicts"})
        listed = verdicts.get("verdicts") if isinstance(verdicts, dict) else None
        if not isinstance(listed, list):
            return
        for verdict in listed[self.verdicts_seen.get(node, 0):]:
            self.owner_backs += 1
            if verdict.get("alive"):
                self.fail("owner-back", f"{node}: the owner's call was let go ({verdict.get('how')}) while "
                          f"borrower processes {verdict.get('alive')} still ran")  # fmt: skip
            if self.expect_release and verdict.get("how") != "release":
                self.fail("released", f"{node}: the owner's call was let go by {verdict.get('how')}, not by the "
                          "solver's release, though nothing on the node was stopped")  # fmt: skip
        self.verdicts_seen[node] = len(listed)

    async def _devices(self, node: str) -> None:
        status = await _json(f"{self.cluster.child(f'node@{node}').http}/status")
        held: dict[tuple[str, str], list[str]] = {}
        for allocation in ((status or {}).get("devices") or {}).get("allocations") or []:
            holder = f"{allocation['namespace']}/{allocation['pod']}/{allocation['container']}"
            for resource, ids in (allocation.get("devices") or {}).items():
                for device in ids:
                    held.setdefault((resource, device), []).append(holder)
        for (resource, device), holders in held.items():
            if len(holders) > 1:
                self.fail("device-exclusive", f"{node}: {resource} {device} given to {holders}")

    async def _terminations(self, node: str) -> None:
        url = f"{self.cluster.child(f'solver@{node}').http}/metrics"
        try:
            text = await asyncio.to_thread(http_text, url, 2.0)
        except OSError:
            return  # the solver is being restarted
        for line in text.splitlines():
            if not line.startswith("gpushare_bus_terminated_total{"):
                continue
            name, value = line.rsplit(" ", 1)
            if float(value) > self.terminated.get(f"{node} {name}", 0.0):
                self.terminated[f"{node} {name}"] = float(value)
                self.fail("no-termination", f"{node}: {line}")


async def ask_kernel(hook: str, line: dict[str, Any]) -> Any:
    """One line to a kernel stand-in's hook socket, its answer decoded."""
    try:
        reader, writer = await asyncio.open_unix_connection(hook)
    except OSError:
        return {}
    try:
        writer.write(json.dumps(line).encode() + b"\n")
        await writer.drain()
        return json.loads(await reader.readline() or b"{}")
    finally:
        writer.close()


async def _json(url: str) -> dict[str, Any] | None:
    try:
        return dict(await asyncio.to_thread(http_json, url, 3.0))
    except (OSError, ValueError):
        return None

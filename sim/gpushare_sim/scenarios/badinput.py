"""Scenario 5, bad input: bad annotations fail clearly, malformed events are counted.

A pod whose cross-pod device annotation is malformed, and one whose
cross-pod reference carries no signature, must fail to start with the
runtime's clear error in their status. Malformed messages published on
every gpushare subject are dropped and counted by the services
(``gpushare_bus_messages_total{outcome="undecodable"}``) and nothing stops.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from gpushare_common.ids import ANN_DEVICES_FROM, ANN_DEVICES_IDS

from gpushare_sim.run.procs import http_text
from gpushare_sim.scenarios.kit import GPU, Obj, Scenario, ScenarioError, container, pod_body, scenario, wait_until

BAD_PODS = {
    "malformed-ref": {f"{ANN_DEVICES_FROM}main": "not//a/valid/reference"},
    "unsigned-ref": {f"{ANN_DEVICES_FROM}main": "victim/their-pod/main"},
    "unsigned-ids": {f"{ANN_DEVICES_IDS}main": json.dumps({GPU: ["GPU-gpu-node-1-0"]})},
}
MALFORMED: tuple[bytes, ...] = (
    b"not json at all",
    b"{}",
    b'{"type": "no-such-event", "node": "x"}',
    b'{"type": "shadow", "node": 7}',
    b'{"type": "eviction"}',
    b"\xff\xfe\x00binary",
)
UNDECODABLE = 'gpushare_bus_messages_total{outcome="undecodable"}'


def failure_text(pod: Obj | None) -> str:
    """The failure a pod's status carries (message, reason, container states), or ''."""
    status = (pod or {}).get("status") or {}
    parts = [str(status.get("message", "")), str(status.get("reason", ""))]
    for item in status.get("containerStatuses") or []:
        for state in (item.get("state") or {}).values():
            parts += [str(state.get("reason", "")), str(state.get("message", ""))]
    return " ".join(p for p in parts if p and p != "None").strip()


async def bad_pod_fails(s: Scenario, name: str, annotations: dict[str, str]) -> str:
    await s.create(pod_body(name, [container("main", ["sleep", "3600"])], annotations))

    async def probe() -> str | None:
        pod = await s.pod(name)
        text = failure_text(pod)
        return text if "StartError" in text or "Failed" in text else None

    text = await wait_until(probe, 60, f"pod {name} failing with an error in its status", s.cluster)
    pod = await s.pod(name)
    if pod is not None and (pod.get("status") or {}).get("phase") == "Running":
        raise ScenarioError(f"pod {name} with a bad annotation is running")
    return text


def _reason(text: str) -> str:
    """The runtime's own words from a start error (after the OCI wrapper's prefix)."""
    core = text.split(": create ", 1)[-1]
    return core.split(": ", 1)[-1].removesuffix(": unknown")


def undecodable(s: Scenario) -> dict[str, float]:
    counts = {}
    for name, child in s.cluster.children.items():
        if not child.http:
            continue
        try:
            text = http_text(f"{child.http}/metrics")
        except OSError:
            continue
        counts[name] = sum(float(line.split()[-1]) for line in text.splitlines()
                           if line.startswith(UNDECODABLE))  # fmt: skip
    return counts


def subjects(s: Scenario) -> list[str]:
    subj = s.bus.subjects
    found = []
    for node in (n.name for n in s.cluster.nodes):
        found += [subj.event(node, k) for k in ("shadow", "share", "generic", "spot", "lowpower", "ownerback")]
        found += [subj.health(node, "gpushare/spot-gpu"), subj.health(node, "gpushare/share-gpu-4"),
                  subj.capacity(node, "gpushare/vcpu"), subj.kmod_requests(node, "detector"),
                  subj.kmod_requests(node, "solver"), subj.eviction(node)]  # fmt: skip
    return found


async def malformed_events(s: Scenario) -> dict[str, float]:
    before = await asyncio.to_thread(undecodable, s)
    targets = subjects(s)
    for subject in targets:  # on the node's own leaf server: the cluster may not publish there
        bus = await s.on(s.bus.subjects.parse(subject).node)
        for payload in MALFORMED:
            await bus.publish_bytes(subject, payload)
    for bus in s.leaves.values():
        await bus.flush()
    s.say(f"published {len(MALFORMED)} malformed messages on each of {len(targets)} subjects")

    def counted() -> dict[str, float] | None:
        after = undecodable(s)
        grew = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
        return grew if {k.split("@")[0] for k in grew} >= {"solver", "deviceplugin", "kmod-bridge"} else None

    return await wait_until(lambda: asyncio.to_thread(counted), 30, "malformed messages counted", s.cluster)


async def still_ready(s: Scenario) -> None:
    for name, child in s.cluster.children.items():
        if child.http:
            await child.wait_ready("/healthz" if name == "shadow-controller" else "/readyz", timeout=30)
    s.cluster.check()


async def bad_pods(s: Scenario) -> str:
    if not all(n.containerd for n in s.cluster.nodes):
        s.say("bad annotations: skipped, the nodes run plain processes (the gpushare runtime checks them)")
        return "bad annotations not checked (plain processes)"
    started = time.monotonic()
    for name, bad in BAD_PODS.items():
        text = await bad_pod_fails(s, name, bad)
        s.say(f"pod {name} did not start: {_reason(text)}")
    s.hop("bad annotations -> pods failed with a clear error", time.monotonic() - started)
    return f"{len(BAD_PODS)} bad pods failed clearly"


@scenario("badinput", containers=False)
async def badinput(s: Scenario) -> str:
    pods = await bad_pods(s)
    grew: dict[str, Any] = await malformed_events(s)
    s.say("malformed messages dropped and counted", **{k: int(v) for k, v in sorted(grew.items())})
    await still_ready(s)
    s.say("every service is still ready")
    return f"{pods}; malformed messages counted by {len(grew)} services"

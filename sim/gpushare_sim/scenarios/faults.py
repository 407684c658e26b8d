"""Scenario 4, faults: restarts in the middle of ShareGPU and spot steal.

With two SharePods on a ShadowPod, the solver, the device-plugin service,
the kubelet stand-in (its socket re-created, as a kubelet restart does), the
node's NATS leaf server (which holds the node's stream and state) and the
cluster's nats-server are restarted one after the other: the solver's mapping
cache comes back as it was, every plugin registers again, and deleting the
ShadowPod afterwards evicts each sharer exactly once. Then, with a borrower
on an away owner's card, the solver, the leaf and nats-server are restarted
again and the owner's return still evicts the borrower exactly once and
releases the owner.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from gpushare_sim.run.procs import http_json
from gpushare_sim.scenarios.kit import SYSTEM_NAMESPACE, Scenario, ScenarioError, scenario, wait_until
from gpushare_sim.scenarios.sharegpu import expect_shadows, fill
from gpushare_sim.scenarios.spot import lend, narrate_trial, owner_back, setup_owner

SHARERS = ["sharer-1", "sharer-2"]


async def status(s: Scenario, name: str) -> dict[str, object]:
    doc = await asyncio.to_thread(http_json, f"{s.cluster.child(name).http}/status")
    return dict(doc)


async def restart(s: Scenario, name: str) -> None:
    started = time.monotonic()
    await s.cluster.restart(name)
    s.hop(f"{name} restarted -> ready again", time.monotonic() - started)


async def mapping_of(s: Scenario, solver: str, owner: str) -> dict[str, str]:
    mapping = (await status(s, solver)).get("mapping") or {}
    assert isinstance(mapping, dict)
    return dict(mapping.get(owner) or {})


async def plugins(s: Scenario, node: str) -> set[str]:
    doc = await status(s, f"node@{node}")
    return set(doc.get("plugins") or [])  # type: ignore[call-overload]


async def same_plugins(s: Scenario, node: str, before: set[str], what: str) -> None:
    started = time.monotonic()

    async def probe() -> bool:
        return (await plugins(s, node)) >= before

    await wait_until(probe, 60, f"every plugin registered again after {what}", s.cluster)
    s.hop(f"{what} -> all {len(before)} device plugins registered again", time.monotonic() - started)


async def share_faults(s: Scenario) -> None:
    await fill(s, "share-gpu-2", SHARERS)
    (shadow,) = await expect_shadows(s, 1, "one ShadowPod for two SharePods")
    node = str(((await s.shadow_pod(shadow)) or {}).get("spec", {}).get("nodeName", ""))
    owner, solver = f"{SYSTEM_NAMESPACE}/{shadow}", f"solver@{node}"

    async def mapped() -> dict[str, str] | None:
        users = await mapping_of(s, solver, owner)
        keys = [f"{s.namespace}/{n}" for n in SHARERS]
        return users if all(any(u.startswith(k) for u in users.values()) for k in keys) else None

    before = await wait_until(mapped, 30, "the solver's mapping of both sharers", s.cluster)
    s.say(f"ShadowPod {shadow} lends its devices", mapping=before)
    await restart(s, solver)
    after = await wait_until(mapped, 60, "the mapping cache restored after the restart", s.cluster)
    if after != before:
        raise ScenarioError(f"mapping cache changed across the solver restart: {before} -> {after}")
    s.say("the solver's mapping cache is restored as it was")
    registered = await plugins(s, node)
    await restart(s, f"deviceplugin@{node}")
    await same_plugins(s, node, registered, "device-plugin service restart")
    await asyncio.to_thread(http_json, f"{s.cluster.child(f'node@{node}').http}/kubelet/restart", 5.0, "POST")
    s.say("kubelet stand-in restarted (kubelet.sock re-created)")
    await same_plugins(s, node, registered, "kubelet restart")
    await restart_nats(s, node)
    started = time.monotonic()
    await s.delete_shadow(shadow)
    for name in SHARERS:
        await s.wait_gone(name)
    s.hop("ShadowPod deleted after the restarts -> both sharers evicted", time.monotonic() - started)
    await once_each(s, [f"{s.namespace}/{n}" for n in SHARERS])


async def restart_nats(s: Scenario, node: str) -> None:
    """The node's leaf server (the node's stream and state, on its disk), then the cluster's server."""
    await restart(s, s.cluster.leaf(node).child)
    await restart(s, s.cluster.nats[0].name)  # "nats-server", or the first server of a cluster
    await all_ready(s)


async def all_ready(s: Scenario) -> None:
    started = time.monotonic()
    for name, child in s.cluster.children.items():
        if child.http:
            await child.wait_ready("/healthz" if name == "shadow-controller" else "/readyz", timeout=60)
    s.hop("leaf and nats-server restarted -> every service ready again", time.monotonic() - started)


async def once_each(s: Scenario, pods: list[str]) -> None:
    """Each pod was evicted exactly once (no eviction lost, none repeated)."""
    def settled() -> bool:
        evicted = evictions(s)
        return all(evicted[p] >= 1 for p in pods)

    await wait_until(settled, 30, f"eviction records of {pods}", s.cluster)
    counts = {p: evictions(s)[p] for p in pods}
    if any(n != 1 for n in counts.values()):
        raise ScenarioError(f"each pod must be evicted exactly once: {counts}")
    s.say("each pod was evicted exactly once", **{p.split("/")[-1]: n for p, n in counts.items()})


def evictions(s: Scenario) -> Counter[str]:
    return Counter(e.pod for e in s.evictions if e.outcome == "evicted")


async def spot_faults(s: Scenario, node: str) -> None:
    await expect_shadows(s, 0, "no ShadowPod left before the spot part")
    card, report_dir = await setup_owner(s, node)
    await lend(s, node, card, "borrower")
    await restart(s, f"solver@{node}")
    await restart_nats(s, node)
    s.say("the owner's workload touches its card after the restarts")
    trial = await owner_back(s, report_dir, "borrower")
    narrate_trial(s, trial)
    await once_each(s, [f"{s.namespace}/borrower"])


@scenario("faults")
async def faults(s: Scenario) -> str:
    await share_faults(s)
    await spot_faults(s, s.cluster.nodes[0].name)
    repeated = {p: n for p, n in evictions(s).items() if n > 1}
    if repeated:
        raise ScenarioError(f"evictions repeated during the scenario: {repeated}")
    return ("mapping restored, plugins re-registered, each eviction exactly once across solver, "
            "device-plugin, kubelet, leaf and nats-server restarts")  # fmt: skip

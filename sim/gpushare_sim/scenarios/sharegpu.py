"""Scenario 2, ShareGPU: SharePods on a ShadowPod's card.

Four inference pods asking for ``gpushare/share-gpu-4`` get exactly one
ShadowPod and all see its card; a fifth gets a second ShadowPod; deleting a
ShadowPod evicts its sharers; a ShadowPod left without users is retired after
the idle timeout. The same for dev machines on ``gpushare/share-dev-gpu-2``.
"""

from __future__ import annotations

import time

from gpushare_sim.scenarios.kit import (
    LIST_DEVICES,
    SYSTEM_NAMESPACE,
    Obj,
    Scenario,
    ScenarioError,
    container,
    pod_body,
    scenario,
    wait_until,
)


def share_pod(name: str, resource: str) -> Obj:
    return pod_body(name, [container("main", LIST_DEVICES, {f"gpushare/{resource}": "1"})])


async def fill(s: Scenario, resource: str, names: list[str]) -> str:
    """Create SharePods, wait until they run, check they all see one and the same card."""
    started = time.monotonic()
    for name in names:
        await s.create(share_pod(name, resource))
    s.say(f"created {len(names)} SharePods asking for gpushare/{resource}", pods=",".join(names))
    seen = {name: await s.devices_seen(name, timeout=90) for name in names}
    s.hop(f"{len(names)} x {resource} created -> all running on a ShadowPod's card", time.monotonic() - started)
    cards = {tuple(v) for v in seen.values()}
    if len(cards) != 1 or len(next(iter(cards))) != 1:
        raise ScenarioError(f"SharePods should all see one and the same card, saw {seen}")
    card = next(iter(cards))[0]
    s.say(f"every SharePod sees the same device node {card}")
    return card


async def shadow_names(s: Scenario) -> list[str]:
    names = sorted(p["metadata"]["name"] for p in await s.shadow_pods())
    s.seen.update(names)
    return names


def extra_shadows(s: Scenario, expected: int) -> None:
    """Narrate ShadowPods created beyond what the demand needed (later retired as idle)."""
    if len(s.seen) > expected:
        s.warn(f"{len(s.seen) - expected} extra ShadowPod(s) were created and later retired as idle",
               seen=",".join(sorted(s.seen)))


async def expect_shadows(s: Scenario, count: int, why: str, timeout: float = 30.0) -> list[str]:
    async def probe() -> list[str] | None:
        names = await shadow_names(s)
        return names if len(names) == count else None

    if count == 0:
        await wait_until(lambda: _no_shadows(s), timeout, why, s.cluster)
        return []
    return await wait_until(probe, timeout, why, s.cluster)


async def _no_shadows(s: Scenario) -> bool:
    return not await s.shadow_pods(alive=False)


async def users_of(s: Scenario, shadow: str) -> list[str]:
    owner = f"{SYSTEM_NAMESPACE}/{shadow}"
    return sorted(p["metadata"]["name"] for p in await s.pods()
                  if (p["metadata"].get("annotations") or {}).get("gpushare.k8s.io/device-owner") == owner)


async def share_inference(s: Scenario) -> str:
    first = await fill(s, "share-gpu-4", [f"infer-{i}" for i in range(1, 5)])
    (shadow1,) = await expect_shadows(s, 1, "exactly one ShadowPod for four SharePods")
    s.say(f"exactly one ShadowPod {shadow1} serves the four SharePods")
    extra_shadows(s, 1)
    second = await fill(s, "share-gpu-4", ["infer-5"])
    shadows = await expect_shadows(s, 2, "a second ShadowPod for the fifth SharePod")
    if second == first:
        raise ScenarioError(f"the fifth SharePod shares the full card {first}")
    shadow2 = next(n for n in shadows if n != shadow1)
    s.say(f"the fifth SharePod got a second ShadowPod {shadow2} on {second}")
    sharers = await wait_until(lambda: _users(s, shadow1, 4), 30, f"device-owner of 4 sharers of {shadow1}", s.cluster)
    started = time.monotonic()
    await s.delete_shadow(shadow1)
    s.say(f"deleted ShadowPod {shadow1}: its sharers must be evicted", sharers=",".join(sharers))
    for name in sharers:
        await s.wait_gone(name)
    s.hop("ShadowPod deleted -> its 4 sharers evicted", time.monotonic() - started)
    reasons = {e.reason for e in s.evictions if e.pod.split("/")[-1] in sharers}
    s.say("sharers evicted", reasons=",".join(sorted(reasons)) or "-")
    await retire(s, shadow2, ["infer-5"])
    return "1 ShadowPod for 4 SharePods, a 2nd for the 5th, sharers evicted, idle ShadowPod retired"


async def _users(s: Scenario, shadow: str, count: int) -> list[str] | None:
    users = await users_of(s, shadow)
    return users if len(users) == count else None


async def retire(s: Scenario, shadow: str, users: list[str]) -> None:
    for name in users:
        await s.delete(name)
        await s.wait_gone(name)
    started = time.monotonic()
    idle = s.cluster.settings.services.idle_timeout_s
    s.say(f"ShadowPod {shadow} has no users: retired after the idle timeout ({idle}s here)")
    await wait_until(lambda: _gone(s, shadow), idle + 30, f"ShadowPod {shadow} retired", s.cluster)
    s.hop(f"last user gone -> ShadowPod retired (idle timeout {idle}s)", time.monotonic() - started)


async def _gone(s: Scenario, name: str) -> bool:
    return await s.shadow_pod(name) is None


async def share_dev(s: Scenario) -> str:
    card = await fill(s, "share-dev-gpu-2", ["dev-a", "dev-b"])
    (shadow,) = await expect_shadows(s, 1, "one ShadowPod for two dev machines")
    s.say(f"two dev machines share ShadowPod {shadow} on {card}")
    await retire(s, shadow, ["dev-a", "dev-b"])
    return "2 dev machines on one share-dev-gpu-2 ShadowPod, retired when idle"


@scenario("sharegpu")
async def sharegpu(s: Scenario) -> str:
    inference = await share_inference(s)
    await expect_shadows(s, 0, "no ShadowPod left before the dev machines")
    dev = await share_dev(s)
    return f"{inference}; {dev}"

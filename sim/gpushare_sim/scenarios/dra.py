"""Scenario: gpushare through Dynamic Resource Allocation, beside a device-plugin node.

A DRA node joins the cluster (the DRA driver instead of the device plugins; the first node
keeps its device plugins). gpushare's DeviceClasses are installed and the node's
ResourceSlice lists its cards with their topology. Four claims of 25 shares land on one card
and a fifth on another; the shares' containers all see the same device node and carry their
caps. Then spot: a lendable dev machine holds a card through an ``exclusive`` claim and goes
away, its card's spot device appears in the slice, a ``spot`` claim borrows it; the owner's
first ioctl is held until the borrower is killed and evicted (the same path and guarantee as
the ``spot`` scenario), the spot device is tainted ``NoExecute``, and the taint goes when the
owner is away again and the card lent again. In between, one SharePod spec
(``gpushare/share-gpu-4: 1``, nothing DRA in it) runs on both nodes (:mod:`.dra_unchanged`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from gpushare_common import dra
from gpushare_common.adapters.kube import TAINT_API as TAINTS
from gpushare_common.adapters.kube import Conflict, NotFound, resource_path

from gpushare_sim.fakegpu import vendor
from gpushare_sim.run.cluster import Node
from gpushare_sim.run.procs import http_json
from gpushare_sim.scenarios.dra_unchanged import unchanged
from gpushare_sim.scenarios.kit import (
    GPU,
    LIST_DEVICES,
    Obj,
    Scenario,
    ScenarioError,
    container,
    pod_body,
    scenario,
    wait_until,
)
from gpushare_sim.scenarios.spot import LENDABLE, OWNER_LOOP, narrate_trial, owner_back, pinned, spot_health, spot_id

REPORT = ["sh", "-c", "ls -l /dev > /run/gpuload/devs; env > /run/gpuload/env; exec sleep 3600"]
QUARTER = {"deviceClassName": dra.SHARE_CLASS, "capacity": {"requests": {dra.SHARES: "25"}}}
HALF = {"deviceClassName": dra.SHARE_CLASS, "capacity": {"requests": {dra.SHARES: "50"}}}
WHOLE = {"deviceClassName": dra.EXCLUSIVE_CLASS}
SPOT = {"deviceClassName": dra.SPOT_CLASS}


async def dra_node(s: Scenario) -> Node:
    """The cluster's DRA node, started the first time it is needed."""
    found = next((n for n in s.cluster.nodes if n.dra), None)
    if found is None:
        started = time.monotonic()
        found = await s.cluster.add_node(dra=True)
        s.hop("DRA node and its services started", time.monotonic() - started)
    await side_by_side(s, found)
    return found


async def side_by_side(s: Scenario, node: Node) -> None:
    """The DRA node offers no device-plugin resource: a pod asking for a card the device-plugin
    way lands on the device-plugin node, while claims go to the DRA node."""
    allocatable = ((await s.kube.get_node(node.name)).get("status") or {}).get("allocatable") or {}
    offered = sorted(r for r, n in allocatable.items() if "/" in r and n not in ("0", 0))
    if offered:
        raise ScenarioError(f"the DRA node {node.name} should offer no device-plugin resource, it offers {offered}")
    await s.create(pod_body("plain-gpu", [container("main", LIST_DEVICES, {GPU: "1"})]))
    pod = await s.wait_running("plain-gpu", 60)
    if pod["spec"]["nodeName"] == node.name:
        raise ScenarioError("a pod asking for nvidia.com/gpu landed on the DRA node")
    s.say(f"{node.name} is a DRA node (gpushare-dra-driver); {pod['spec']['nodeName']} keeps the device plugins: "
          "an nvidia.com/gpu pod lands there")
    await s.delete("plain-gpu")
    await s.wait_gone("plain-gpu")


async def install_classes(s: Scenario) -> None:
    """gpushare's DeviceClasses, with the extended resources they serve (as the chart installs
    them on a cluster that serves DRAExtendedResource)."""
    services = s.cluster.settings.services
    for body in dra.device_classes(services.share_specs, services.share_dev_specs, extended=True):
        try:
            await s.kube.create_object(resource_path("deviceclasses"), body)
        except Conflict:
            continue


async def template(s: Scenario, name: str, request: Obj) -> None:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": s.namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}}}
    try:
        await s.kube.create_object(resource_path("resourceclaimtemplates", s.namespace), body)
    except Conflict:
        pass


def claim_pod(name: str, claim_template: str, node: str, command: list[str],
              labels: dict[str, str] | None = None) -> Obj:
    main = {**container("main", command), "resources": {"claims": [{"name": "gpu"}]}}
    body = pod_body(name, [main], labels=labels)
    body["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim_template}]
    return pinned(body, node)


async def slice_devices(s: Scenario, node: str) -> list[Obj]:
    items = await s.kube.list_resource_slices(f"spec.nodeName={node},spec.driver={dra.DRIVER}")
    return [d for item in items for d in item["spec"].get("devices", [])]


async def claim_devices(s: Scenario, pod: str) -> list[str]:
    claims, _ = await s.kube.list_objects(resource_path("resourceclaims", s.namespace))
    owned = [c for c in claims if any(o.get("name") == pod for o in c["metadata"].get("ownerReferences") or [])]
    return [r["device"] for c in owned for r in ((c.get("status") or {}).get("allocation") or {})
            .get("devices", {}).get("results", [])]


async def published(s: Scenario, node: Node) -> list[Obj]:
    cards = await wait_until(lambda: _cards(s, node.name, s.cluster.settings.gpus), 60,
                             f"{node.name}'s ResourceSlice with every card", s.cluster)
    roots = sorted({c["attributes"].get(dra.PCIE_ROOT, {}).get("string", "?") for c in cards})
    s.say(f"{node.name}'s ResourceSlice lists {len(cards)} cards, {dra.SHARES} capacity "
          f"{cards[0]['capacity'][dra.SHARES]['value']} each, PCIe roots {', '.join(roots)}")
    return cards


async def _cards(s: Scenario, node: str, count: int) -> list[Obj] | None:
    cards = [d for d in await slice_devices(s, node) if d["attributes"]["kind"]["string"] == dra.KIND_CARD]
    return cards if len(cards) == count else None


async def shares(s: Scenario, node: Node) -> str:
    await template(s, "quarter", QUARTER)
    await template(s, "half", HALF)
    if (await mps_daemon(s, node))["answers"]:
        raise ScenarioError("the MPS control daemon runs before any capped share is prepared")
    started = time.monotonic()
    names = [f"quarter-{i}" for i in range(1, 6)]
    for name in names:
        await s.create(claim_pod(name, "quarter", node.name, REPORT))
    await s.create(claim_pod("half", "half", node.name, REPORT))
    seen = {name: await s.devices_seen(name, timeout=90) for name in [*names, "half"]}
    s.hop("5 claims of 25 shares and 1 of 50 created -> all running", time.monotonic() - started)
    first = {tuple(seen[n]) for n in names[:4]}
    if len(first) != 1 or len(next(iter(first))) != 1 or seen[names[4]] in [list(c) for c in first]:
        raise ScenarioError(f"four quarters should see one card and the fifth another, saw {seen}")
    cards = {n: await claim_devices(s, n) for n in names}
    s.say(f"four claims of 25 shares share {seen[names[0]][0]} ({cards[names[0]][0]}); the fifth got "
          f"{seen[names[4]][0]} ({cards[names[4]][0]}), beside a claim of 50")
    for name, k in ((names[0], 25), ("half", 50)):
        await check_caps(s, node, name, k)
    await daemon_started_first(s, node, names)
    for name in [*names, "half"]:
        await s.delete(name)
    for name in [*names, "half"]:
        await s.wait_gone(name)
    await wait_until(lambda: _daemon_stopped(s, node), 30, "the MPS control daemon stopped after the last share",
                     s.cluster)
    s.say("the last capped share gone: the driver stopped the MPS control daemon")
    return f"4 x 25 shares on {cards[names[0]][0]}, the 5th on {cards[names[4]][0]}, capped, the MPS daemon " \
           "up from before the first to after the last"


async def check_caps(s: Scenario, node: Node, pod: str, k: int) -> None:
    """The share's container carries memory x k / N, compute and k / N (from the CDI edits)."""
    env = set((await _env(s, node, pod)).splitlines())
    expected = vendor.expected_caps(int(node.endpoints["gpu_memory_mib"]), dra.DEFAULT_SHARES, k)
    caps = {f"{key}={value}" for key, value in expected.items()}
    if not caps <= env:
        raise ScenarioError(f"{pod} ({k} shares) should carry its caps {sorted(caps)}, it has {sorted(env)}")
    s.say(f"{pod}: {k} of {dra.DEFAULT_SHARES} shares, its container's caps from the CDI edits",
          **dict(sorted(expected.items())))


async def mps_daemon(s: Scenario, node: Node) -> dict[str, Any]:
    """The driver's view of the node's MPS control daemon (its /status)."""
    doc = await asyncio.to_thread(http_json, f"{s.cluster.service('dra-driver', node.name).http}/status")
    return dict(doc["mps_daemon"])


async def daemon_started_first(s: Scenario, node: Node, shares: list[str]) -> None:
    """The daemon answers, and it started before the first share's container did."""
    daemon = await mps_daemon(s, node)
    if not daemon["answers"] or not daemon["pid"]:
        raise ScenarioError(f"capped shares run, yet the node's MPS control daemon does not answer: {daemon}")
    log = Path(daemon["directory"]) / "log" / "control.log"
    started = next(line.split()[0] for line in log.read_text().splitlines() if line.endswith(" started"))
    first = min([str((await s.pod(p) or {})["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
                 for p in shares])
    if started[:19] > first[:19]:
        raise ScenarioError(f"the MPS control daemon started at {started}, after a share's container ({first})")
    s.say(f"the driver's MPS control daemon (pid {daemon['pid']}) started at {started}, before the first share's "
          f"container ({first})")


async def _daemon_stopped(s: Scenario, node: Node) -> bool:
    return not (await mps_daemon(s, node))["answers"]


async def _env(s: Scenario, node: Node, pod: str) -> str:
    path = node.dir / "util" / s.namespace / pod / "main" / "env"
    return await wait_until(lambda: _read(path), 30, f"{pod}'s environment", s.cluster)


def _read(path: Path) -> str | None:
    try:
        return path.read_text() or None
    except OSError:
        return None


async def setup_owner(s: Scenario, node: Node) -> tuple[str, Path]:
    """The dev machine on one card (an exclusive claim) and busy pods on the others."""
    await template(s, "whole", WHOLE)
    gpus = s.cluster.settings.gpus
    for index in range(1, gpus):
        await s.create(claim_pod(f"busy-{index}", "whole", node.name, REPORT))
    await s.create(claim_pod("devmachine", "whole", node.name, ["sh", "-c", OWNER_LOOP], labels=LENDABLE))
    card = (await s.devices_seen("devmachine", timeout=60))[0]
    for index in range(1, gpus):
        await s.wait_running(f"busy-{index}")
    s.say(f"dev machine devmachine holds {card} through an exclusive claim; busy pods hold the other cards")
    return card, node.dir / "util" / s.namespace / "devmachine" / "main"


async def lend(s: Scenario, node: Node, card: str) -> float:
    """Wait until the owner is away and its card's spot device is in the slice; borrow it."""
    started, window = time.monotonic(), s.cluster.settings.services.away_window_s
    wanted = spot_id(node.name, card)
    spot_name = dra.spot_device_name(wanted.removeprefix("spot-"))

    async def lent() -> bool:
        health = await spot_health(s, node.name)
        names = [d["name"] for d in await slice_devices(s, node.name)]
        return health.get(wanted) == "Healthy" and spot_name in names

    await wait_until(lent, window + 60, f"{spot_name} published for spot claims", s.cluster)
    away = time.monotonic() - started
    s.say(f"the owner has been away for the window ({window}s here): {spot_name} is in the slice")
    await template(s, "spot", SPOT)
    await s.create(claim_pod("borrower", "spot", node.name, REPORT))
    seen = await s.devices_seen("borrower", timeout=60)
    if seen != [card]:
        raise ScenarioError(f"the spot claim's pod should see the owner's card {card}, saw {seen}")
    s.say(f"a spot claim borrows {spot_name}: its pod sees {card}")
    return away


async def taint_rule(s: Scenario, node: str, card: str) -> Obj | None:
    name = f"gpushare-owner-back-{node}-{dra.spot_device_name(spot_id(node, card).removeprefix('spot-'))}"
    try:
        return await s.kube.get_object(resource_path("devicetaintrules", name=name, api=TAINTS))
    except NotFound:
        return None


async def spot(s: Scenario, node: Node) -> str:
    card, report_dir = await setup_owner(s, node)
    away = await lend(s, node, card)
    s.hop("owner idle -> spot device in the slice (away window included)", away)
    s.say("the owner's workload touches its card now")
    trial = await owner_back(s, report_dir, "borrower")
    narrate_trial(s, trial)
    rule: Any = await wait_until(lambda: taint_rule(s, node.name, card), 30, "the NoExecute taint", s.cluster)
    if rule["spec"]["taint"]["effect"] != "NoExecute":
        raise ScenarioError(f"the owner-back taint should be NoExecute: {rule['spec']}")
    s.say(f"the spot device is tainted NoExecute ({rule['metadata']['name']})")
    started = time.monotonic()
    await wait_until(lambda: _untainted(s, node.name, card), s.cluster.settings.services.away_window_s + 60,
                     "the taint removed once the card is lent again", s.cluster)
    s.hop("owner away again -> card lent, taint removed", time.monotonic() - started)
    return (f"borrower evicted {trial.borrower_killed * 1000:.0f} ms after the owner's ioctl, owner's call "
            f"returned after {trial.owner_returned * 1000:.0f} ms; tainted, then lent again")


async def _untainted(s: Scenario, node: str, card: str) -> bool:
    return await taint_rule(s, node, card) is None


@scenario("dra")
async def dra_scenario(s: Scenario) -> str:
    node = await dra_node(s)
    await install_classes(s)
    await published(s, node)
    shared = await shares(s, node)
    served = await unchanged(s, node, _env)
    stolen = await spot(s, node)
    return f"{shared}; unchanged pods: {served}; spot on DRA: {stolen}"

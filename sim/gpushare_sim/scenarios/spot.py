"""Scenario 3, spot steal: a dev machine's idle card is lent, and taken back in one call.

A lendable dev machine (``gpushare.k8s.io/lendable=true``) holds one card and
goes away (no ioctl, zero utilisation); the other cards of the node are held
by ordinary pods, so the dev machine's spot device is the only one that can
turn Healthy. A spot pod is scheduled onto it and sees the card. Then the
owner's workload issues one GPU ioctl: the kernel stand-in blocks it and
notifies the kmod-bridge, the solver kills and evicts the borrower, releases
the owner, and the owner's call returns. Every hop is timed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare_common import events

from gpushare_sim.scenarios.kit import (
    GPU,
    LIST_DEVICES,
    Obj,
    Scenario,
    ScenarioError,
    container,
    gpu_devices,
    pod_body,
    scenario,
    wait_until,
)  # fmt: skip

SPOT = "gpushare/spot-gpu"
SPOT_HEALTH_KEY = "spot-gpu"  # the solver's resource name: its health key and subject token
LENDABLE = {"gpushare.k8s.io/lendable": "true"}
# the dev machine: lists its devices, then issues one GPU ioctl each time go/ appears
OWNER_LOOP = (
    "ls -l /dev > /run/gpuload/devs; "
    "while true; do while [ ! -e /run/gpuload/go ]; do sleep 0.05; done; "
    "rm -f /run/gpuload/go; gpuload --once --util 0; done"
)


@dataclass(frozen=True, slots=True)
class Trial:
    """One owner-back, in seconds from the moment the owner's ioctl reached the kernel
    (its report's time less the time the kernel held it)."""

    notice: float  # the kmod-bridge's owner-back event on NATS (0 when not seen)
    borrower_killed: float  # borrower's tasks dead (the solver's record, less its API delete)
    evicted: float  # the eviction recorded (tasks dead and pod deleted)
    borrower_deleted: float  # the borrower pod gone from the API as a client sees it
    owner_returned: float  # the owner's call returned
    kernel_hold_ms: float  # how long the kernel stand-in held the owner's ioctl
    kill_ms: float  # the solver's own kill time
    start_s: float  # from the go signal to the owner's ioctl (the workload starting)


def pinned(body: Obj, node: str) -> Obj:
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


async def spot_allocatable(s: Scenario, node: str) -> int:
    doc = await s.kube.get_node(node)
    return int((doc.get("status") or {}).get("allocatable", {}).get(SPOT, "0"))


async def setup_owner(s: Scenario, node: str) -> tuple[str, Path]:
    """The dev machine and ordinary pods on the node's other cards; returns its card and report dir."""
    gpus = s.cluster.settings.gpus
    for index in range(1, gpus):
        await s.create(pinned(pod_body(f"busy-{index}", [container("main", LIST_DEVICES, {GPU: "1"})]), node))
    owner = pod_body("devmachine", [container("main", ["sh", "-c", OWNER_LOOP], {GPU: "1"})], labels=LENDABLE)
    await s.create(pinned(owner, node))
    card = (await s.devices_seen("devmachine", timeout=60))[0]
    for index in range(1, gpus):
        await s.wait_running(f"busy-{index}")
    s.say(f"dev machine devmachine holds {card}; ordinary pods hold the {gpus - 1} other cards of {node}")
    pod = await s.wait_running("devmachine")
    return card, s.node_dir(pod) / "util" / s.namespace / "devmachine" / "main"


async def spot_health(s: Scenario, node: str) -> dict[str, str]:
    """The solver's desired health of the node's spot devices (the key-value bucket it writes)."""
    bus = await s.on(node)  # the node's state lives on its leaf server
    store = await bus.store("health", bus.layout.scope(node, "health"))
    health = await store.get(SPOT_HEALTH_KEY, events.DeviceHealth)
    return dict(health.devices) if health is not None else {}


async def ever_withdrawn(s: Scenario, node: str, device: str) -> bool:
    """Whether the solver took ``device`` back (Unhealthy) since the scenario started, as the
    node's stream holds it: a withdrawal the state no longer shows (the owner away again) counts."""
    bus = await s.on(node)
    subject, after = bus.subjects.health(node, SPOT_HEALTH_KEY), s.since.get(node, 0)
    while found := await bus.read_after(subject, after):
        for message in found:
            event = message.event()
            if isinstance(event, events.DeviceHealth) and event.devices.get(device) == "Unhealthy":
                return True
            after = message.seq
    return False


def spot_id(node: str, card: str) -> str:
    """``gpu-node-1/nvidia2=1,3`` (as a container sees it) -> ``spot-GPU-gpu-node-1-2``."""
    name = card.split("=", 1)[0].rsplit("/", 1)[-1]
    return f"spot-GPU-{node}-{int(name.removeprefix('nvidia'))}"


async def lend(s: Scenario, node: str, card: str, borrower: str) -> float:
    """Wait for the owner to be away (spot device Healthy), then run a borrower on its card.

    The owner's spot device is first seen withdrawn (the owner holds the card), then lent
    again once the owner has been away for the window, with every other spot device of the
    node withdrawn (the ordinary pods hold them): only then can the borrower land on it.
    """
    started = time.monotonic()
    window = s.cluster.settings.services.away_window_s
    wanted = spot_id(node, card)

    async def withdrawn() -> bool:  # now, or before this wait began (the owner may be away again)
        return (await spot_health(s, node)).get(wanted) == "Unhealthy" or await ever_withdrawn(s, node, wanted)

    async def lent_alone() -> bool:
        health = await spot_health(s, node)
        others = [h for device, h in health.items() if device != wanted]
        return (health.get(wanted) == "Healthy" and all(h == "Unhealthy" for h in others)
                and await spot_allocatable(s, node) == 1)

    await wait_until(withdrawn, window + 60, f"{wanted} withdrawn while its owner holds the card", s.cluster)
    await wait_until(lent_alone, window + 60, f"{wanted} the only Healthy spot device on {node}", s.cluster)
    away = time.monotonic() - started
    s.say(f"the owner has been away for the window ({window}s here): its spot device is Healthy")
    await s.create(pinned(pod_body(borrower, [container("main", LIST_DEVICES, {SPOT: "1"})]), node))
    seen = await s.devices_seen(borrower, timeout=60)
    if seen != [card]:
        raise ScenarioError(f"spot pod {borrower} should see the owner's card {card}, saw {seen}")
    s.say(f"spot pod {borrower} scheduled onto the idle card and sees {card}")
    return away


async def owner_back(s: Scenario, report_dir: Path, borrower: str) -> Trial:
    """The owner touches its card; time every hop until its call returns."""
    report = report_dir / f"{_card_name(report_dir)}.json"
    report.unlink(missing_ok=True)
    known = len(s.evictions)
    t0 = time.time()
    (report_dir / "go").touch()
    record = await wait_until(lambda: _eviction_of(s, borrower, known), 30, f"eviction of {borrower}", s.cluster)
    doc = await wait_until(lambda: _report(report), 30, "the owner's call to return", s.cluster)
    await s.wait_gone(borrower, 30)
    gone = time.time()
    if record.reason != "owner-back" or record.outcome != "evicted":
        raise ScenarioError(f"borrower eviction should be owner-back/evicted, got {record}")
    hold_ms = float(doc.get("blocked_ms", 0.0))
    returned = float(doc["ts"])
    notices = [e.ts for e in s.owner_backs if e.ts >= t0]
    ioctl = min([returned - hold_ms / 1000, *notices])  # the kernel's notice never precedes the ioctl
    handled = record.ts - record.total_ms / 1000  # when the solver took the owner-back
    tasks_dead = handled + record.tasks_dead_ms / 1000  # every task of the borrower had exited
    if returned < tasks_dead - 0.05:
        raise ScenarioError("the owner's call returned before the borrower's tasks were dead")
    notice = notices[0] - ioctl if notices else 0.0
    return Trial(notice, tasks_dead - ioctl, record.ts - ioctl, gone - ioctl, returned - ioctl, hold_ms,
                 record.kill_ms, ioctl - t0)  # fmt: skip


def _card_name(report_dir: Path) -> str:
    return gpu_devices((report_dir / "devs").read_text())[0].split("=")[0]


def _eviction_of(s: Scenario, borrower: str, known: int) -> events.EvictionRecord | None:
    for record in s.evictions[known:]:
        if record.pod == f"{s.namespace}/{borrower}":
            return record
    return None


def _report(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def narrate_trial(s: Scenario, trial: Trial) -> None:
    if trial.notice:
        s.hop("owner ioctl -> kernel notice -> owner-back event on NATS", trial.notice)
    s.hop("owner ioctl -> borrower's tasks dead (containerd kill)", trial.borrower_killed)
    s.hop("owner ioctl -> owner's call returns (kernel released it)", trial.owner_returned)
    s.hop("owner ioctl -> borrower pod deleted, eviction recorded", trial.evicted)
    s.hop("owner ioctl -> borrower gone as the API client sees it", trial.borrower_deleted)
    s.say(f"the kernel stand-in held the owner's ioctl {trial.kernel_hold_ms:.1f} ms; "
          f"the solver killed the borrower's tasks in {trial.kill_ms:.1f} ms")  # fmt: skip


async def told_why(s: Scenario, pod: str, reason: str) -> None:
    """The evicted pod's Events say why, as ``kubectl describe pod`` shows them (the solver records
    the Event before it deletes the pod)."""
    found = [e for e in await s.kube.list_events(s.namespace, f"involvedObject.name={pod}")
             if e.get("reason") == reason and (e.get("source") or {}).get("component") == "gpushare-solver"]
    if not found:
        raise ScenarioError(f"the evicted pod {pod} has no {reason} Event from gpushare-solver")
    s.say(f"{pod}'s Event: {found[0]['type']} {reason}: {found[0]['message']}")


@scenario("spot")
async def spot(s: Scenario) -> str:
    node = s.cluster.nodes[0].name
    card, report_dir = await setup_owner(s, node)
    away = await lend(s, node, card, "borrower")
    s.hop("owner idle -> spot device Healthy (away window included)", away)
    s.say("the owner's workload touches its card now")
    trial = await owner_back(s, report_dir, "borrower")
    narrate_trial(s, trial)
    await told_why(s, "borrower", "OwnerReturned")
    return (f"borrower evicted in {trial.borrower_killed * 1000:.0f} ms, owner's call returned after "
            f"{trial.owner_returned * 1000:.0f} ms")  # fmt: skip

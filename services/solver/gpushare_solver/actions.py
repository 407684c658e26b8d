"""What a handler asks the solver to do: small, idempotent, serialisable actions.

Handlers return a list of these; the executor carries them out in order. A
:class:`Plan` (the actions of one event, plus progress) is persisted before
anything is executed, so a restarted solver finishes what its predecessor
began: every action here is safe to run twice.
"""

from __future__ import annotations

import msgspec
from gpushare_common.events import Health, KmodOp

from .state import Victim


class Action(msgspec.Struct, frozen=True, kw_only=True, tag_field="action"):
    pass


class Release(msgspec.Struct, frozen=True, kw_only=True):
    """Wake the blocked owner (kmod ``release``): by pod keys and/or pid namespaces."""

    pods: tuple[str, ...] = ()
    pidns: tuple[int, ...] = ()


class Reclaim(Action, frozen=True, kw_only=True, tag="reclaim"):
    """Kill the pods' container tasks, release the owner, then delete the pods (grace 0)."""

    reason: str  # owner-back | reserved | shadow-gone | pressure | ...
    pods: tuple[str, ...] = ()
    owner: str = ""
    release: Release | None = None
    # spot devices taken back: any pod the kubelet gave one of them is a borrower too, even one
    # whose SpotEvent has not reached the solver yet (looked up in pod-resources, killed first)
    lent: tuple[str, ...] = ()
    over: tuple[str, ...] = ()  # pressure: the resources over their threshold (memory, cpu)


class SetHealth(Action, frozen=True, kw_only=True, tag="health"):
    """Desired health of some devices of a resource (merged into the persisted set)."""

    resource: str
    devices: dict[str, Health]
    reason: str = ""


class DeviceList(Action, frozen=True, kw_only=True, tag="device_list"):
    """The full device list of a share resource after a ShadowPod came or went."""

    resource: str
    devices: tuple[str, ...]
    reason: str = ""


class Kmod(Action, frozen=True, kw_only=True, tag="kmod"):
    """A fire-and-check kmod command (``detect``, ``undetect``...)."""

    op: KmodOp
    pods: tuple[str, ...] = ()
    pidns: tuple[int, ...] = ()
    reason: str = ""


class UsingCondition(Action, frozen=True, kw_only=True, tag="using"):
    """Set the ShadowPod's ``gpushare.k8s.io/Using`` condition to its current users."""

    shadow_pod: str
    users: dict[str, str]  # virtual device -> SharePod key


class OwnerAnnotation(Action, frozen=True, kw_only=True, tag="owner_annotation"):
    """Write ``gpushare.k8s.io/device-owner=<shadow>`` on the SharePod."""

    share_pod: str
    shadow_pod: str


AnyAction = Reclaim | SetHealth | DeviceList | Kmod | UsingCondition | OwnerAnnotation


class ReclaimProgress(msgspec.Struct, kw_only=True):
    """Where a reclaim stands; persisted after each step."""

    containers: dict[str, list[str]] = {}  # pod -> container ids killed
    uids: dict[str, str] = {}  # pod -> uid seen before the kill ("" when already gone)
    refused: dict[str, str] = {}  # pod -> why it must not be killed or deleted (verification)
    found: dict[str, Victim] = {}  # borrowers of ``lent`` devices the kubelet named, the cache did not
    killed: bool = False
    released: bool = False
    kill_ms: float = 0.0
    started: float = 0.0
    dead_at: float = 0.0  # wall clock when the last task killed had exited
    released_at: float = 0.0  # wall clock when the release was sent
    warned: list[str] = []  # pods whose refusal was recorded as a Warning Event


class Plan(msgspec.Struct, kw_only=True):
    """The actions one event caused, and how far their execution got."""

    trigger_id: str
    event: str  # event tag, for logs and /status
    actions: list[AnyAction] = []
    done: int = 0  # actions finished
    progress: dict[int, ReclaimProgress] = {}  # action index -> progress of that reclaim
    received: float = 0.0  # wall clock when the trigger event was handled

"""Away/back state machine per lendable owner (see docs/state-machines.md, 'Detector away/active').

*Away*: for the whole window, no GPU ioctl from the owner's containers (the
kernel's hit counters did not move) and utilisation 0 on every one of its
cards.  *Back*: an owner-back notice from the kernel, new ioctl hits, or
utilisation above 0.  Anything unknown (no exporter answer, a missing or NaN
sample, no kernel statistics) is never evidence of idleness: it restarts the
idle window of an active owner and leaves an away owner away (the kernel's
notice is what brings that owner back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from gpushare_common import events as ev

from .handlers import with_stable_id


class State(StrEnum):
    ACTIVE = "active"
    AWAY = "away"


@dataclass(frozen=True, slots=True)
class Sample:
    """One observation of an owner: None means unknown."""

    utilisation: float | None
    hits: int | None


@dataclass(slots=True)
class OwnerState:
    state: State
    since: float
    devices: tuple[str, ...] = ()
    containers: tuple[str, ...] = ()
    idle_since: float | None = None
    hits: int | None = None
    utilisation: float | None = None
    reason: str = "new"
    event: ev.LowPowerEvent | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class Transition:
    owner: str
    state: State
    reason: str


def _verdict(previous_hits: int | None, sample: Sample) -> tuple[bool, bool, str]:
    """(busy, idle, reason) for one sample; neither busy nor idle means unknown."""
    new_hits = None if sample.hits is None or previous_hits is None or sample.hits < previous_hits \
        else sample.hits > previous_hits
    if new_hits:
        return True, False, "gpu-access"
    if sample.utilisation is not None and sample.utilisation > 0:
        return True, False, "utilisation"
    idle = new_hits is False and sample.utilisation == 0
    return False, idle, "idle" if idle else "unknown"


class AwayMachine:
    def __init__(self, node: str, window_s: float, clock: Callable[[], float]) -> None:
        self.node = node
        self.window_s = window_s
        self.clock = clock
        self.owners: dict[str, OwnerState] = {}

    def track(self, owner: str, devices: tuple[str, ...], containers: tuple[str, ...]) -> None:
        state = self.owners.get(owner)
        if state is None:
            state = self.owners[owner] = OwnerState(State.ACTIVE, self.clock())
        if (state.devices, state.containers) != (devices, containers):
            state.devices, state.containers = devices, containers
            state.event = None

    def forget_except(self, owners: Iterable[str]) -> list[str]:
        keep = set(owners)
        gone = [o for o in self.owners if o not in keep]
        for owner in gone:
            del self.owners[owner]
        return gone

    def observe(self, owner: str, sample: Sample) -> Transition | None:
        state = self.owners.get(owner)
        if state is None:
            return None
        busy, idle, reason = _verdict(state.hits, sample)
        if sample.hits is not None:
            state.hits = sample.hits
        state.utilisation = sample.utilisation
        now = self.clock()
        if state.state is State.AWAY:
            return self._move(owner, state, State.ACTIVE, reason) if busy else None
        if not idle:
            state.idle_since = None
            return None
        state.idle_since = now if state.idle_since is None else state.idle_since
        if now - state.idle_since >= self.window_s:
            return self._move(owner, state, State.AWAY, "idle")
        return None

    def owner_back(self, owner: str, reason: str = "owner-back") -> Transition | None:
        state = self.owners.get(owner)
        if state is None:
            return None
        state.idle_since = None
        return self._move(owner, state, State.ACTIVE, reason) if state.state is State.AWAY else None

    def _move(self, owner: str, state: OwnerState, to: State, reason: str) -> Transition:
        state.state, state.since, state.reason = to, self.clock(), reason
        state.idle_since = None
        state.event = None
        return Transition(owner, to, reason)

    def event(self, owner: str) -> ev.LowPowerEvent | None:
        """The owner's current state as an event (the same object until the state changes)."""
        state = self.owners.get(owner)
        if state is None:
            return None
        if state.event is None:
            event = ev.LowPowerEvent(
                node=self.node, owner=owner, using=state.state is State.ACTIVE, devices=state.devices,
                containers=state.containers, utilisation=state.utilisation or 0.0, reason=state.reason)
            state.event = with_stable_id(event, f"{owner}@{state.since:.6f}")  # type: ignore[assignment]
        return state.event

    def events(self) -> list[ev.LowPowerEvent]:
        return [e for o in sorted(self.owners) if (e := self.event(o)) is not None]

    def status(self) -> dict[str, dict[str, object]]:
        now = self.clock()
        return {
            owner: {"state": str(s.state), "for_s": round(now - s.since, 1), "reason": s.reason,
                    "idle_for_s": None if s.idle_since is None else round(now - s.idle_since, 1),
                    "utilisation": s.utilisation, "hits": s.hits, "devices": list(s.devices)}
            for owner, s in sorted(self.owners.items())
        }

from __future__ import annotations

import pytest
from gpushare_detector.away import AwayMachine, Sample, State, Transition

WINDOW = 600.0
IDLE = Sample(utilisation=0.0, hits=5)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def machine(clock: Clock) -> AwayMachine:
    m = AwayMachine("node-1", WINDOW, clock)
    m.track("ns/dev", ("G1",), ("ns/dev/main",))
    return m


def run(m: AwayMachine, clock: Clock, samples: list[Sample], step: float = 60.0) -> list[Transition]:
    out = []
    for sample in samples:
        if (t := m.observe("ns/dev", sample)) is not None:
            out.append(t)
        clock.now += step
    return out


def test_away_only_after_the_whole_window(clock: Clock) -> None:
    m = machine(clock)
    # first sample only sets the kernel baseline: unknown, not idle
    assert run(m, clock, [IDLE] * 11) == []
    assert m.owners["ns/dev"].state is State.ACTIVE
    assert run(m, clock, [IDLE]) == [Transition("ns/dev", State.AWAY, "idle")]
    event = m.event("ns/dev")
    assert event is not None and not event.using and event.devices == ("G1",)


@pytest.mark.parametrize(
    ("noise", "why"),
    [
        (Sample(utilisation=3.0, hits=5), "utilisation"),
        (Sample(utilisation=0.0, hits=6), "gpu-access"),
        (Sample(utilisation=None, hits=5), "unknown utilisation"),
        (Sample(utilisation=0.0, hits=None), "unknown kernel stats"),
    ],
)
def test_any_activity_or_unknown_restarts_the_window(clock: Clock, noise: Sample, why: str) -> None:
    m = machine(clock)
    samples = [IDLE] * 8 + [noise] + [Sample(0.0, noise.hits or 5)] * 8
    assert run(m, clock, samples) == [], why
    assert m.owners["ns/dev"].state is State.ACTIVE


def test_back_on_utilisation_hits_or_notice(clock: Clock) -> None:
    m = machine(clock)
    run(m, clock, [IDLE] * 12)
    assert m.owners["ns/dev"].state is State.AWAY
    away_id = m.event("ns/dev").id  # type: ignore[union-attr]
    assert run(m, clock, [Sample(None, None), Sample(0.0, None)]) == []  # unknown keeps it away
    assert run(m, clock, [Sample(1.0, 5)]) == [Transition("ns/dev", State.ACTIVE, "utilisation")]
    run(m, clock, [Sample(0.0, 5)] * 12)
    assert run(m, clock, [Sample(0.0, 9)]) == [Transition("ns/dev", State.ACTIVE, "gpu-access")]
    run(m, clock, [Sample(0.0, 9)] * 12)
    assert m.owner_back("ns/dev") == Transition("ns/dev", State.ACTIVE, "owner-back")
    assert m.owner_back("ns/dev") is None
    back = m.event("ns/dev")
    assert back is not None and back.using and back.id != away_id


def test_counter_reset_is_not_idle(clock: Clock) -> None:
    m = machine(clock)
    assert run(m, clock, [Sample(0.0, 50)] * 5 + [Sample(0.0, 2)] + [Sample(0.0, 2)] * 5) == []
    assert m.owners["ns/dev"].idle_since is not None  # idle again after the reset, window restarted


def test_event_is_stable_until_the_state_changes(clock: Clock) -> None:
    m = machine(clock)
    first = m.event("ns/dev")
    clock.now += 5
    assert m.event("ns/dev") is first
    other = AwayMachine("node-1", WINDOW, Clock())
    other.track("ns/dev", ("G1",), ("ns/dev/main",))
    assert other.event("ns/dev").id == first.id  # type: ignore[union-attr]


def test_untracked_and_forgotten_owners(clock: Clock) -> None:
    m = machine(clock)
    assert m.observe("ns/other", IDLE) is None
    assert m.owner_back("ns/other") is None
    assert m.forget_except([]) == ["ns/dev"]
    assert m.events() == []

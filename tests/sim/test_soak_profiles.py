"""The soak's named profiles (``make soak PROFILE=<name>``): each is its options' defaults, a
command-line option still wins, and a name that is no profile is refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gpushare_sim.soak.__main__ import parse_args
from gpushare_sim.soak.checks import NODE_FAULTS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("profile", "minutes", "faults", "every"), [
    ("calm", 10, (), 20.0),
    ("nats-member", 5, ("nats-member",), 12.0),
    ("nats-outage", 5, ("nats-outage",), 100.0),
    ("apiserver", 5, ("apiserver",), 20.0),
])  # fmt: skip
def test_each_profile_is_two_nodes_on_three_servers_with_its_faults(profile: str, minutes: float,
                                                                      faults: tuple[str, ...], every: float) -> None:
    args = parse_args(["--profile", profile, "--seed", "1"])
    assert (args.minutes, args.faults, args.fault_every) == (minutes, faults, every)
    assert (args.nodes, args.nats_cluster, args.slow_share) == (2, 3, 0.0)
    assert args.label == f"{profile}, ordinary borrowers"
    assert not set(args.faults) & NODE_FAULTS  # every owner's call must be let go by the solver's release


def test_slow_borrowers_and_an_explicit_option_win() -> None:
    args = parse_args(["--profile", "nats-outage", "--borrowers", "slow", "--minutes", "2", "--seed", "1"])
    assert (args.slow_share, args.borrower_mib, args.minutes, args.fault_schedule) == (0.6, 2048, 2.0, "regular")
    assert parse_args(["--seed", "1"]).fault_schedule == "random"  # no profile: the soak's own defaults


def test_an_unknown_profile_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--profile", "quiet"])
    assert exit_.value.code == 2 and "invalid choice: 'quiet'" in capsys.readouterr().err


def test_make_soak_runs_a_profile_by_name() -> None:
    dry = subprocess.run(["make", "-n", "soak", "PROFILE=nats-member", "BORROWERS=slow"], cwd=ROOT,
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert "-m gpushare_sim.soak --profile nats-member --borrowers slow" in dry.stdout

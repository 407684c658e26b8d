"""A short chaos soak, as CI runs it: a fixed seed with every fault, then a random one (printed, to
replay) on a cluster of three NATS servers with the faults off the nodes only (a server killed,
every server down for 30 s, the API server restarted), where every owner's call must be let go
by the solver's release (the ``released`` invariant): nothing of an owner-back waits off its node."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest

from tests.e2e.conftest import needs

pytestmark = [pytest.mark.slow, pytest.mark.containerd]
FIXED_SEED = 20261201


def soak(seed: int, minutes: float, nats_servers: int, faults: str) -> str:
    proc = subprocess.Popen([sys.executable, "-m", "gpushare_sim.soak", "--minutes", str(minutes),
                             "--seed", str(seed), "--fault-every", "15", "--nats-cluster", str(nats_servers),
                             *(["--faults", faults] if faults else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=minutes * 60 + 600)
    except subprocess.TimeoutExpired:  # interrupted, the soak keeps its logs and prints its timeline
        proc.terminate()
        try:
            stdout, stderr = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        stdout = f"{stdout}\n(the soak ran past its time and was interrupted)"
    print(stdout[-6000:])  # the table (and, on a failure, the seed and the timeline)
    assert proc.returncode == 0, f"soak with seed {seed} failed:\n{stdout[-20000:]}\n{stderr[-4000:]}"
    return stdout


@pytest.mark.parametrize(("seed", "nats_servers", "faults"), [
    (FIXED_SEED, 1, ""),
    (random.SystemRandom().randrange(1, 2**31), 3, "nats-member,nats-outage,apiserver"),
])
def test_a_short_soak_keeps_every_promise(seed: int, nats_servers: int, faults: str) -> None:
    needs()
    print(f"soak seed {seed}, {nats_servers} NATS server(s), faults {faults or 'all'}")
    out = soak(seed, 1.5, nats_servers, faults)
    assert f"soak passed: seed {seed}" in out
    guarded = int(re.search(r"guarded owner-backs\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    assert guarded >= 1, "no owner-back was exercised"
    assert ("violations: released" in out) == bool(faults)  # checked where no node part is stopped

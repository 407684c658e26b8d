"""A short chaos soak, as CI runs it: a fixed seed, then a random one (printed, to replay)."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest

from tests.e2e.conftest import needs

pytestmark = [pytest.mark.slow, pytest.mark.containerd]
FIXED_SEED = 20261201


def soak(seed: int, minutes: float) -> str:
    result = subprocess.run([sys.executable, "-m", "gpushare_sim.soak", "--minutes", str(minutes),
                             "--seed", str(seed), "--fault-every", "15"],
                            capture_output=True, text=True, timeout=minutes * 60 + 600, check=False)  # fmt: skip
    print(result.stdout[-6000:])  # the table (and, on a failure, the seed and the timeline)
    assert result.returncode == 0, f"soak with seed {seed} failed:\n{result.stdout[-20000:]}\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.mark.parametrize("seed", [FIXED_SEED, random.SystemRandom().randrange(1, 2**31)])
def test_a_short_soak_keeps_every_promise(seed: int) -> None:
    needs()
    print(f"soak seed {seed}")
    out = soak(seed, 1.5)
    assert f"soak passed: seed {seed}" in out
    guarded = int(re.search(r"guarded owner-backs\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    assert guarded >= 1, "no owner-back was exercised"

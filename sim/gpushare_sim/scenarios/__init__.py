"""The end-to-end scenarios, as async functions of a running cluster (``make run`` and tests/e2e).

Importing this package registers every scenario in :data:`SCENARIOS`, in the
order ``make run`` plays them.
"""

from __future__ import annotations

from gpushare_sim.scenarios import badinput, caps, dind, dra, faults, oversell, sharegpu, spot  # noqa: F401  (registers)
from gpushare_sim.scenarios.kit import SCENARIOS, Scenario, ScenarioError, play

ORDER = ("dind", "sharegpu", "caps", "spot", "faults", "badinput", "oversell", "dra")
for _name in sorted(SCENARIOS, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER)):
    SCENARIOS[_name] = SCENARIOS.pop(_name)

__all__ = ["SCENARIOS", "Scenario", "ScenarioError", "play"]

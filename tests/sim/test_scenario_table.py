"""The README's scenario table lists every scenario `make run` plays, in the order it plays them."""

from __future__ import annotations

import re
from pathlib import Path

from gpushare_sim.scenarios import SCENARIOS

README = Path(__file__).resolve().parents[2] / "README.md"


def table_rows(text: str) -> list[str]:
    """The scenario names of the README's `| scenario | shows |` table."""
    section = text.split("| scenario | shows |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `([\w-]+)` \|", section, re.M)


def test_the_readme_lists_every_scenario_in_play_order() -> None:
    assert table_rows(README.read_text()) == list(SCENARIOS)


def test_a_scenario_missing_from_the_table_is_seen() -> None:
    text = README.read_text()
    without = re.sub(r"^\| `dra` \|.*\n", "", text, flags=re.M)
    assert table_rows(without) != list(SCENARIOS)

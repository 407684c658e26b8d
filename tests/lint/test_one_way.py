"""One way for each thing: the product's source holds no second way (``tests/lint/one_way.py``)."""

from __future__ import annotations

import ast

import pytest

from tests.lint import one_way


@pytest.mark.parametrize("check", sorted(one_way.CHECKS))
def test_the_product_has_one_way(check: str) -> None:
    assert one_way.CHECKS[check]() == []


@pytest.mark.parametrize("source", [
    'subject = f"{bus.subjects.prefix}.*.eviction"',
    'subject = f"{self.prefix}.{token}.event.spot"',
    'subject = settings.prefix + ".n1.event.spot"',
    'subject = "gpushare.v1.n1.event.spot"',
    'subject = f"$KV.{bucket}.{key}"',
    'subject = "$JS.API.INFO"',
    'inbox = "_INBOX"',
    'token = node.replace(".", "_")',
])  # fmt: skip
def test_subject_building_is_found(source: str) -> None:
    assert any(one_way._subject_built(node) for node in ast.walk(ast.parse(source)))


@pytest.mark.parametrize("source", [
    'subject = subjects.event(node, "spot")', 'name = f"{prefix}-{name}"', 'text = "a.b".replace(".", "-")',
    'key = f"{scope}.{escape_key(key)}"',
])  # fmt: skip
def test_other_strings_are_not_subjects(source: str) -> None:
    assert not any(one_way._subject_built(node) for node in ast.walk(ast.parse(source)))


def test_a_quantity_table_is_found() -> None:
    tree = ast.parse('_SUFFIX = {"k": 10**3, "Ki": 2**10}\n_RE = re.compile(r"([0-9]+)(k|Ki|Mi)?")')
    assert sum(one_way._quantity_suffix(node) for node in ast.walk(tree)) == 2


@pytest.mark.parametrize("source", [
    "backoff = Backoff(0.2, 10.0, jitter=0.0)",
    "await wait_for_stop(stop, backoff.next())",
    "retry.backoff.reset()",
    "delay *= 2",
])
def test_a_backoff_of_its_own_is_found(source: str) -> None:
    assert any(one_way._hand_backoff(node) for node in ast.walk(ast.parse(source)))


def test_a_supervised_loop_is_not_a_backoff_of_its_own() -> None:
    source = "async for attempt in Supervised('x', stop, Backoff(0.1, 5.0), wake=changed):\n    attempt.progress()"
    assert not any(one_way._hand_backoff(node) for node in ast.walk(ast.parse(source)))

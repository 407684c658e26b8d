"""The shipped NATS deployments (compose's static users, the chart's auth callout), once per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.nats_deployments import ChartNats, Deployment, chart_nats, compose_nats


@pytest.fixture(scope="module", params=["compose", "chart"])
def deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    with (compose_nats() if request.param == "compose" else chart_nats()) as running:
        yield running


@pytest.fixture(scope="module")
def chart() -> Iterator[ChartNats]:
    with chart_nats() as running:
        yield running

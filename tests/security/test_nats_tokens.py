"""Stolen, forged or misused tokens against the chart's auth callout: each connection is refused
with an answer (never left to time out), and the refusal is counted by its reason. A leaf
server's own token gets its node's traffic only, whatever else the client claims. (The node
services are users of their node's leaf and have no token for the cluster: their accounts are
no role there.) A flood of garbage connects does not keep a real client out: 4,000 clients
connect with garbage tokens (raw CONNECTs from a process of their own, 800 in flight at a
time); while they are in flight a node's leaf connects with its own token and must be granted
within 2 s. The garbage is refused by the callout's cheap checks, without a TokenReview.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import nats
import pytest
from gpushare_sim.apiserver.tokens import sign
from gpushare_sim.run.kubeapi import mint_node_token
from kubernetes import client

from tests.deploy.nats_deployments import NODE_A, NODE_B, ChartNats, chart_nats, refused_connect
from tests.support import procs

GARBAGE = 4000
AT_ONCE = 800  # connects in flight at any moment


@pytest.fixture(scope="module")
def chart() -> Iterator[ChartNats]:
    with chart_nats() as running:
        yield running


def claims_of(token: str) -> dict[str, Any]:
    body = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))  # type: ignore[no-any-return]


def resigned(chart: ChartNats, token: str, **changes: Any) -> str:
    """``token`` with changed claims, signed again by the API's own key (a token the API issued
    that way, e.g. an expired one)."""
    claims = {**claims_of(token), **changes}
    return chart.kube.server.call(lambda store: sign(claims, store.signing_key), chart.kube.server.store)  # type: ignore[no-any-return]


def tampered(token: str, **changes: Any) -> str:
    """``token`` with changed claims and its old signature."""
    head, _, signature = token.split(".")
    body = base64.urlsafe_b64encode(json.dumps({**claims_of(token), **changes}).encode()).decode().rstrip("=")
    return f"{head}.{body}.{signature}"


def unbound(chart: ChartNats, account: str) -> str:
    """A token of ``gpushare-system/<account>`` bound to no pod and no node."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": [chart.audience], "expirationSeconds": 600}}  # fmt: skip
    answer = client.CoreV1Api(chart.kube.client).create_namespaced_service_account_token(account, "gpushare-system",
                                                                                         body)  # fmt: skip
    return str(answer.status.token)


def other_namespace(chart: ChartNats) -> str:
    chart.kube.namespaces("mallory")
    return mint_node_token(chart.kube.kubeconfig, NODE_A, "gpushare-leaf", namespace="mallory",
                           audiences=[chart.audience]).token  # fmt: skip


def node_b_token_after_node_b_is_gone(chart: ChartNats) -> str:
    token = mint_node_token(chart.kube.kubeconfig, NODE_B, "gpushare-leaf", audiences=[chart.audience]).token
    core = client.CoreV1Api(chart.kube.client)
    core.delete_node(NODE_B)
    core.create_node({"metadata": {"name": NODE_B}})  # the same name again: another Node
    return token


Forge = Callable[[ChartNats], str]
LEAF: Forge = lambda chart: chart.token("leaf", NODE_A)  # noqa: E731
REFUSED: list[tuple[str, Forge, str]] = [
    # refused by the callout's cheap checks, before any TokenReview (a flood of them costs nothing)
    ("another audience", lambda c: c.token("leaf", NODE_A, audience="https://kubernetes.default.svc"),
     "wrong-audience"),
    ("expired (past the API's leeway)", lambda c: resigned(c, LEAF(c), exp=int(time.time()) - 120),
     "token-expired"),
    ("expired (within the API's leeway)", lambda c: resigned(c, LEAF(c), exp=int(time.time()) - 5),
     "token-expired"),
    ("tampered to name node B", lambda c: tampered(LEAF(c), **{"kubernetes.io": {
        **claims_of(LEAF(c))["kubernetes.io"], "node": {"name": NODE_B, "uid": "x"}}}), "token-rejected"),
    ("not a JWT", lambda c: "leaf-please", "malformed-token"),
    ("a JWT of nothing", lambda c: "eyJhbGciOiJSUzI1NiJ9.e30.c2ln", "wrong-audience"),
    ("an unknown service account", lambda c: c.token("leaf", NODE_A, account="intruder"), "unknown-account"),
    ("a node service's account: a user of its leaf only", lambda c: c.token("leaf", NODE_A, account="gpushare-solver"),
     "unknown-account"),
    ("a service's account name in another namespace", other_namespace, "unknown-account"),
    ("a node role's token bound to no node", lambda c: unbound(c, "gpushare-leaf"), "no-node"),
    ("a token of a Node that was replaced", node_b_token_after_node_b_is_gone, "token-rejected"),
    ("signed by someone else (plausible claims: the API decides)", lambda c: tampered(LEAF(c), jti="x"),
     "token-rejected"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "forge", "reason"), REFUSED, ids=[c[0] for c in REFUSED])
async def test_forged_or_misused_tokens_are_refused(chart: ChartNats, case: str, forge: Forge, reason: str) -> None:
    token = forge(chart)
    before = chart.status()["refusals"].get(reason, {})
    error = await refused_connect(chart, token=token)
    assert "authorization" in error.lower(), error
    assert sum(chart.status()["refusals"].get(reason, {}).values()) == sum(before.values()) + 1, case


async def test_a_client_without_credentials_is_refused(chart: ChartNats) -> None:
    before = sum(chart.status()["refusals"].get("no-token", {}).values())
    assert "authorization" in (await refused_connect(chart)).lower()
    assert sum(chart.status()["refusals"]["no-token"].values()) == before + 1


async def test_static_users_need_their_password(chart: ChartNats) -> None:
    for user in ("installer", "auth"):
        assert "authorization" in (await refused_connect(chart, user=user, password="guess")).lower()


async def test_a_node_a_token_acts_for_node_a_whatever_the_client_claims(chart: ChartNats) -> None:
    probe = await chart.probe("leaf", NODE_A, name="leaf@gpu-node-2", user="leaf@gpu-node-2")
    try:
        assert await probe.refused("pub", f"gpushare.v1.{NODE_B}.event.ownerback")
        assert await probe.refused("sub", f"$JS.gpushare-{NODE_B}.API.>")
        assert not await probe.refused("pub", f"gpushare.v1.{NODE_A}.capacity.vcpu")
    finally:
        await probe.close()


async def test_the_same_account_on_another_node_gets_that_node(chart: ChartNats) -> None:
    probe = await chart.probe("leaf", NODE_B)
    try:
        assert not await probe.refused("pub", f"gpushare.v1.{NODE_B}.capacity.vcpu")
        assert await probe.refused("pub", f"gpushare.v1.{NODE_A}.capacity.vcpu")
    finally:
        await probe.close()


async def test_a_real_leaf_connects_within_2s_while_4000_garbage_connects_are_in_flight(
        chart: ChartNats) -> None:
    token, before = chart.token("leaf", NODE_A), chart.status()
    flood = await asyncio.create_subprocess_exec(  # its own process: the attacker is not this test's loop
        sys.executable, "-m", "tests.security.flood", chart.server.url, str(GARBAGE), str(AT_ONCE),
        stdout=asyncio.subprocess.PIPE)
    procs.allow(flood.pid)
    try:
        assert flood.stdout is not None
        assert (await asyncio.wait_for(flood.stdout.readline(), 60)).startswith(b"under way")
        started = time.monotonic()
        nc = await nats.connect(chart.server.url, token=token, max_reconnect_attempts=0, connect_timeout=5,
                                allow_reconnect=False)
        took = time.monotonic() - started
        await nc.close()
        report = json.loads(await asyncio.wait_for(flood.stdout.readline(), 120))
    finally:
        if flood.returncode is None:
            flood.kill()
        await flood.wait()
    assert took < 2.0, f"the leaf waited {took:.2f}s for its connection"
    assert report["done_before"] < GARBAGE, "the flood was over before the leaf connected"
    assert report["admitted"] == 0, "a garbage token got in"
    status = chart.status()
    assert status["grants"].get("leaf", 0) >= 1
    cheap = sum(status["refusals"].get(reason, {}).get("-", 0) - before["refusals"].get(reason, {}).get("-", 0)
                for reason in ("malformed-token", "no-token"))
    assert cheap >= GARBAGE * 0.75, (status["refusals"], report)  # the rest timed out in the server's queue
    assert status["verdicts_kept"] <= before["verdicts_kept"] + 1  # the API was asked about the leaf only

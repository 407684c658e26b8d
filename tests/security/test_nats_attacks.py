"""A compromised node service against the shipped NATS configurations: each attack is refused by
the server, and the same action on what is the service's own is allowed (so a permission that is
too tight fails here too, not only one that is too wide).

The service runs on gpu-node-1 with its role's credentials (its static user on its node's server:
compose's one server, the chart's leaf server of the node). The chart's ``leaf`` role is the
node's leaf server as the cluster sees it (its service-account token bound to its Node, through
the auth callout): a node whose root rewrites its leaf still reaches nothing of another node,
and nobody in the cluster can send anything into a node through it. ``K`` is the key-value
prefix, ``S`` the solver's durable consumer of the node. The DRA driver's role and the leaf's
are the chart's only (compose runs no DRA driver and no cluster).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.nats_deployments import NODE_A, Deployment, chart_nats, compose_nats

A, B = "gpu-node-1", "gpu-node-2"
KV, DG, CC = "$KV.gpushare-", "$JS.API.DIRECT.GET.KV_gpushare-", "$JS.API.CONSUMER.CREATE.KV_gpushare-"

# (role, action, subject): what an attacker on node A tries, each refused
ATTACKS = [
    # write another role's state (a detector planting a solver plan, the reported attack) ...
    ("detector", "pub", f"{KV}solver.{A}.plan.owner-back"),
    ("detector", "pub", f"{KV}health.{A}.health.spot-gpu"),
    ("kmod-bridge", "pub", f"{KV}solver.{A}.mapping.x"),
    ("deviceplugin", "pub", f"{KV}health.{A}.health.spot-gpu"),
    ("dra-driver", "pub", f"{KV}health.{A}.health.spot-gpu"),
    ("solver", "pub", f"{KV}detector.{A}.fact.x"),
    # ... or its own bucket under another node's key
    ("detector", "pub", f"{KV}detector.{B}.fact.x"),
    ("solver", "pub", f"{KV}solver.{B}.plan.x"),
    ("kmod-bridge", "pub", f"{KV}kmod.{B}.watch.x"),
    # read another node's state: by key, by sequence, by a consumer with or without a filter
    ("solver", "pub", f"{DG}solver.$KV.gpushare-solver.{B}.plan.x"),
    ("solver", "pub", f"{DG}solver"),
    ("deviceplugin", "pub", f"{DG}health.$KV.gpushare-health.{B}.health.spot-gpu"),
    ("dra-driver", "pub", f"{DG}health.$KV.gpushare-health.{B}.health.spot-gpu"),
    ("dra-driver", "pub", f"{DG}solver.$KV.gpushare-solver.{A}.plan.x"),
    ("detector", "pub", f"{CC}detector.scan.$KV.gpushare-detector.{B}.>"),
    ("detector", "pub", f"{CC}detector"),
    ("detector", "pub", f"{CC}solver.scan.$KV.gpushare-solver.{A}.>"),
    # list another node's keys through a stream's subject counts (STREAM.INFO subjects_filter)
    *[(role, "pub", f"$JS.API.STREAM.INFO.{stream}") for role in ("detector", "solver", "deviceplugin", "kmod-bridge",
                                                                   "dra-driver")
      for stream in ("GPUSHARE", "KV_gpushare-solver", "KV_gpushare-health", "KV_gpushare-detector",
                     "KV_gpushare-kmod")],
    # create or update a consumer another identity reads through (its filter changed, it goes blind)
    ("detector", "pub", f"{CC}detector.observer-console.$KV.gpushare-detector.{A}.fact.>"),
    ("deviceplugin", "pub", f"{CC}health.observer-console.$KV.gpushare-health.{A}.health.>"),
    ("deviceplugin", "pub", f"{CC}health.solver-{A}-health.$KV.gpushare-health.{A}.health.>"),
    ("dra-driver", "pub", f"{CC}health.deviceplugin-{A}-health.$KV.gpushare-health.{A}.health.>"),
    ("solver", "pub", f"$JS.API.CONSUMER.DELETE.KV_gpushare-health.deviceplugin-{A}-health"),
    # the observer ("read-only"): the solver's durable, any consumer not its own, legacy forms
    ("observer", "pub", f"$JS.API.CONSUMER.CREATE.GPUSHARE.solver-{A}.gpushare.v1.{A}.event.*"),
    ("observer", "pub", f"$JS.API.CONSUMER.CREATE.GPUSHARE.solver-{A}"),
    ("observer", "pub", "$JS.API.CONSUMER.CREATE.GPUSHARE"),
    ("observer", "pub", "$JS.API.CONSUMER.CREATE.KV_gpushare-solver"),  # a name in the body updates any
    ("observer", "pub", f"$JS.API.CONSUMER.DURABLE.CREATE.GPUSHARE.solver-{A}"),
    ("observer", "pub", "$JS.API.CONSUMER.DURABLE.CREATE.GPUSHARE.observer-1"),
    ("observer", "pub", "$JS.API.CONSUMER.CREATE.KV_gpushare-solver.watch1.$KV.gpushare-solver.>"),
    ("observer", "pub", f"{CC}health.deviceplugin-{A}-health.$KV.gpushare-health.{A}.health.>"),
    ("observer", "pub", f"$JS.API.CONSUMER.DELETE.GPUSHARE.solver-{A}"),
    # ... and the same through a node's leaf (its JetStream domain, where the node's state lives)
    ("observer", "pub", f"$JS.gpushare-{A}.API.CONSUMER.CREATE.GPUSHARE.solver-{A}.gpushare.v1.{A}.event.*"),
    ("observer", "pub", f"$JS.gpushare-{A}.API.CONSUMER.CREATE.GPUSHARE"),
    ("observer", "pub", f"$JS.gpushare-{A}.API.CONSUMER.CREATE.KV_gpushare-solver"),
    ("observer", "pub", f"$JS.gpushare-{A}.API.CONSUMER.DURABLE.CREATE.GPUSHARE.solver-{A}"),
    ("observer", "pub", f"$JS.gpushare-{A}.API.CONSUMER.CREATE.KV_gpushare-health.deviceplugin-{A}-health."
                        f"$KV.gpushare-health.{A}.health.>"),
    ("observer", "pub", f"$JS.gpushare-{A}.API.CONSUMER.CREATE.KV_gpushare-detector.observer-console."
                        f"$KV.gpushare-detector.>"),
    ("observer", "pub", f"$JS.gpushare-{A}.API.CONSUMER.DELETE.GPUSHARE.solver-{A}"),
    ("observer", "pub", f"$JS.gpushare-{A}.API.CONSUMER.MSG.NEXT.GPUSHARE.solver-{A}"),
    ("observer", "pub", f"$JS.gpushare-{A}.API.STREAM.DELETE.GPUSHARE"),
    ("observer", "pub", f"$JS.API.CONSUMER.DELETE.KV_gpushare-health.deviceplugin-{A}-health"),
    ("observer", "pub", f"$JS.API.CONSUMER.MSG.NEXT.GPUSHARE.solver-{A}"),
    ("observer", "pub", f"$JS.ACK.GPUSHARE.solver-{A}.1.1.1.1.1"),
    # the solver's durable consumer: delete, bind or ack it, or another node's
    ("detector", "pub", f"$JS.API.CONSUMER.DELETE.GPUSHARE.solver-{A}"),
    ("deviceplugin", "pub", f"$JS.API.CONSUMER.DELETE.GPUSHARE.solver-{A}"),
    ("kmod-bridge", "pub", f"$JS.API.CONSUMER.DELETE.GPUSHARE.solver-{A}"),
    ("dra-driver", "pub", f"$JS.API.CONSUMER.DELETE.GPUSHARE.solver-{A}"),
    ("solver", "pub", f"$JS.API.CONSUMER.DELETE.GPUSHARE.solver-{B}"),
    ("detector", "pub", f"$JS.API.CONSUMER.MSG.NEXT.GPUSHARE.solver-{A}"),
    ("solver", "pub", f"$JS.API.CONSUMER.MSG.NEXT.GPUSHARE.solver-{B}"),
    ("solver", "pub", f"$JS.ACK.GPUSHARE.solver-{B}.1.1.1.1.1"),
    ("solver", "pub", f"$JS.API.CONSUMER.CREATE.GPUSHARE.solver-{B}.gpushare.v1.{B}.event.*"),
    ("solver", "pub", f"$JS.API.CONSUMER.CREATE.GPUSHARE.solver-{A}.gpushare.v1.{B}.event.*"),
    # create, update, purge or delete a stream or a bucket
    *[(role, "pub", f"$JS.API.STREAM.{op}.GPUSHARE") for role in ("detector", "solver", "deviceplugin", "kmod-bridge",
                                                                   "dra-driver", "observer")
      for op in ("CREATE", "UPDATE", "DELETE", "PURGE", "MSG.DELETE")],
    ("solver", "pub", "$JS.API.STREAM.CREATE.KV_gpushare-evil"),
    ("solver", "pub", "$JS.API.STREAM.DELETE.KV_gpushare-solver"),
    ("kmod-bridge", "pub", "$JS.API.STREAM.PURGE.KV_gpushare-kmod"),
    # publish for another node ...
    ("detector", "pub", f"gpushare.v1.{B}.event.spot"),
    ("kmod-bridge", "pub", f"gpushare.v1.{B}.event.ownerback"),
    ("solver", "pub", f"gpushare.v1.{B}.health.spot-gpu"),
    ("solver", "pub", f"gpushare.v1.{B}.kmod.solver"),
    ("solver", "pub", f"gpushare.v1.{B}.fence.spot-gpu"),
    ("detector", "pub", f"gpushare.v1.{B}.capacity.vcpu"),
    ("dra-driver", "pub", f"gpushare.v1.{B}.event.inventory"),
    # ... or on another role's channels of its own node
    ("detector", "pub", f"gpushare.v1.{A}.event.ownerback"),
    ("detector", "pub", f"gpushare.v1.{A}.health.spot-gpu"),
    ("detector", "pub", f"gpushare.v1.{A}.eviction"),
    ("kmod-bridge", "pub", f"gpushare.v1.{A}.event.spot"),
    ("kmod-bridge", "pub", f"gpushare.v1.{A}.kmod.solver"),
    # ... or another role's kernel operations (the detector releasing or holding an owner)
    ("detector", "pub", f"gpushare.v1.{A}.kmod.solver"),
    ("solver", "pub", f"gpushare.v1.{A}.kmod.detector"),
    ("deviceplugin", "pub", f"gpushare.v1.{A}.kmod.solver"),
    ("dra-driver", "pub", f"gpushare.v1.{A}.kmod.solver"),
    ("observer", "pub", f"gpushare.v1.{A}.kmod.solver"),
    ("deviceplugin", "pub", f"gpushare.v1.{A}.health.spot-gpu"),
    ("deviceplugin", "pub", f"gpushare.v1.{A}.event.spot"),
    ("deviceplugin", "pub", f"gpushare.v1.{A}.event.inventory"),
    ("deviceplugin", "pub", f"gpushare.v1.{A}.fence.spot-gpu"),
    ("detector", "pub", f"gpushare.v1.{A}.fence.spot-gpu"),
    ("dra-driver", "pub", f"gpushare.v1.{A}.event.spot"),
    ("dra-driver", "pub", f"gpushare.v1.{A}.event.ownerback"),
    ("dra-driver", "pub", f"gpushare.v1.{A}.health.spot-gpu"),
    ("dra-driver", "pub", f"gpushare.v1.{A}.capacity.vcpu"),
    ("solver", "pub", f"gpushare.v1.{A}.event.ownerback"),
    ("solver", "pub", f"gpushare.v1.{A}.event.lowpower"),
    ("observer", "pub", f"gpushare.v1.{A}.event.spot"),
    ("observer", "pub", f"{KV}solver.{A}.plan.x"),
    # listen to another node ...
    ("deviceplugin", "sub", f"gpushare.v1.{B}.health.*"),
    ("deviceplugin", "sub", f"gpushare.v1.{B}.fence.*"),
    ("detector", "sub", f"gpushare.v1.{A}.fence.*"),
    ("kmod-bridge", "sub", f"gpushare.v1.{B}.kmod.solver"),
    ("detector", "sub", "gpushare.v1.*.event.ownerback"),
    ("deviceplugin", "sub", "gpushare.v1.>"),
    ("dra-driver", "sub", f"gpushare.v1.{B}.health.spot-gpu"),
    ("dra-driver", "sub", f"gpushare.v1.{A}.health.*"),
    ("dra-driver", "sub", f"gpushare.v1.{A}.capacity.*"),
    # ... or to another service's replies, or to the authorization requests (others' tokens)
    ("detector", "sub", f"_INBOX.solver.{A}.>"),
    ("solver", "sub", f"_INBOX.detector.{A}.*"),
    ("kmod-bridge", "sub", f"_INBOX.kmod-bridge.{B}.>"),
    ("dra-driver", "sub", f"_INBOX.deviceplugin.{A}.>"),
    ("detector", "sub", "_INBOX.>"),
    ("detector", "sub", "$SYS.REQ.USER.AUTH"),
    ("observer", "sub", "$SYS.REQ.USER.AUTH"),
    ("solver", "pub", "$SYS.REQ.USER.AUTH"),
    # a node's leaf server towards the cluster: send for another node, ask another node's leaf, take
    # another node's traffic or any request meant for a node (nobody in the cluster may command one)
    ("leaf", "pub", f"gpushare.v1.{B}.event.ownerback"),
    ("leaf", "pub", f"gpushare.v1.{B}.kmod.solver"),
    ("leaf", "pub", f"gpushare.v1.{B}.kmod.detector"),
    ("leaf", "pub", f"$JS.gpushare-{B}.API.STREAM.INFO.GPUSHARE"),
    ("leaf", "pub", "$JS.API.STREAM.INFO.GPUSHARE"),
    ("leaf", "pub", f"_INBOX.solver.{B}.x"),
    ("leaf", "sub", f"gpushare.v1.{B}.>"),
    ("leaf", "sub", f"gpushare.v1.{A}.kmod.solver"),
    ("leaf", "sub", f"gpushare.v1.{A}.kmod.detector"),
    ("leaf", "sub", f"gpushare.v1.{A}.>"),
    ("leaf", "sub", f"$JS.gpushare-{B}.API.>"),
    ("leaf", "sub", "$JS.API.>"),
    ("leaf", "sub", "_INBOX.observer.>"),
    ("leaf", "sub", "$SYS.REQ.USER.AUTH"),
]  # fmt: skip

# the same kinds of action on the service's own things: allowed
OWN = [
    ("detector", "pub", f"{KV}detector.{A}.fact.x"),
    ("solver", "pub", f"{KV}solver.{A}.plan.x"),
    ("solver", "pub", f"{KV}health.{A}.health.spot-gpu"),
    ("kmod-bridge", "pub", f"{KV}kmod.{A}.watch.x"),
    ("solver", "pub", f"{DG}solver.$KV.gpushare-solver.{A}.plan.x"),
    ("deviceplugin", "pub", f"{DG}health.$KV.gpushare-health.{A}.health.spot-gpu"),
    ("dra-driver", "pub", f"{DG}health.$KV.gpushare-health.{A}.health.spot-gpu"),
    ("detector", "pub", f"{CC}detector.detector-{A}-fact.$KV.gpushare-detector.{A}.fact.>"),
    ("detector", "pub", f"$JS.API.CONSUMER.DELETE.KV_gpushare-detector.detector-{A}-fact"),
    ("deviceplugin", "pub", f"{CC}health.deviceplugin-{A}-health.$KV.gpushare-health.{A}.health.>"),
    ("detector", "pub", f"$JS.API.DIRECT.GET.GPUSHARE.gpushare.v1.{A}.presence"),
    ("solver", "pub", f"$JS.API.CONSUMER.MSG.NEXT.GPUSHARE.solver-{A}"),
    ("solver", "pub", f"$JS.API.CONSUMER.CREATE.GPUSHARE.solver-{A}.gpushare.v1.{A}.event.*"),
    ("solver", "pub", f"$JS.API.CONSUMER.DELETE.GPUSHARE.solver-{A}"),  # healed: made again from its floor
    ("detector", "pub", f"gpushare.v1.{A}.event.spot"),
    ("detector", "pub", f"gpushare.v1.{A}.kmod.detector"),
    ("kmod-bridge", "pub", f"gpushare.v1.{A}.event.ownerback"),
    ("solver", "pub", f"gpushare.v1.{A}.health.spot-gpu"),
    ("solver", "pub", f"gpushare.v1.{A}.kmod.solver"),
    ("solver", "pub", f"gpushare.v1.{A}.fence.spot-gpu"),
    ("deviceplugin", "sub", f"gpushare.v1.{A}.health.*"),
    ("deviceplugin", "sub", f"gpushare.v1.{A}.fence.*"),
    ("kmod-bridge", "sub", f"gpushare.v1.{A}.kmod.solver"),
    ("kmod-bridge", "sub", f"gpushare.v1.{A}.kmod.detector"),
    ("dra-driver", "pub", f"gpushare.v1.{A}.event.inventory"),
    ("dra-driver", "sub", f"gpushare.v1.{A}.health.spot-gpu"),
    ("detector", "sub", f"_INBOX.detector.{A}.>"),
    ("dra-driver", "sub", f"_INBOX.dra-driver.{A}.>"),
    ("observer", "sub", "gpushare.v1.>"),
    ("observer", "pub", f"$JS.gpushare-{A}.API.DIRECT.GET.GPUSHARE.gpushare.v1.{A}.eviction"),
    ("leaf", "pub", f"gpushare.v1.{A}.capacity.vcpu"),
    ("leaf", "pub", "_INBOX.observer.x"),
    ("leaf", "sub", f"$JS.gpushare-{A}.API.>"),
    ("observer", "pub", f"{CC}solver.observer-console.$KV.gpushare-solver.>"),
    ("observer", "pub", "$JS.API.CONSUMER.DELETE.KV_gpushare-health.observer-console"),
    ("observer", "pub", "$JS.API.STREAM.INFO.GPUSHARE"),
    # through a node's leaf: its own consumers, the same names in the node's domain
    ("observer", "pub", f"$JS.gpushare-{A}.API.CONSUMER.CREATE.KV_gpushare-health.observer-console."
                        f"$KV.gpushare-health.{A}.>"),
    ("observer", "pub", f"$JS.gpushare-{A}.API.CONSUMER.DELETE.KV_gpushare-solver.observer-console"),
    ("observer", "pub", f"$JS.gpushare-{A}.API.CONSUMER.CREATE.GPUSHARE.observer-console.gpushare.v1.>"),
    ("observer", "pub", f"$JS.gpushare-{A}.API.STREAM.INFO.KV_gpushare-detector"),
]  # fmt: skip


@pytest.fixture(scope="module", params=["compose", "chart"])
def deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    with (compose_nats() if request.param == "compose" else chart_nats()) as running:
        yield running


def _id(case: tuple[str, str, str]) -> str:
    return " ".join(case)


@pytest.mark.parametrize(("role", "action", "subject"), ATTACKS, ids=map(_id, ATTACKS))
async def test_attack_is_refused(deployment: Deployment, role: str, action: str, subject: str) -> None:
    if role not in deployment.roles:
        pytest.skip(f"{deployment.name} has no {role} role")
    probe = await deployment.probe(role, NODE_A)
    try:
        assert await probe.refused(action, subject), f"{role} on {NODE_A} may {action} {subject}"
    finally:
        await probe.close()


@pytest.mark.parametrize(("role", "action", "subject"), OWN, ids=map(_id, OWN))
async def test_own_action_is_allowed(deployment: Deployment, role: str, action: str, subject: str) -> None:
    if role not in deployment.roles:
        pytest.skip(f"{deployment.name} has no {role} role")
    probe = await deployment.probe(role, NODE_A)
    try:
        assert not await probe.refused(action, subject), f"{role} on {NODE_A} may not {action} {subject}"
    finally:
        await probe.close()

"""The kmod-bridge serves each role only its own operations, and answers every request.

NATS permissions give the detector ``kmod.detector`` and the solver ``kmod.solver`` only
(``test_nats_attacks.py``); the bridge checks it again: an operation that arrives on another
role's subject is refused with ``-EPERM`` and counted, and the kernel never sees it. A request
that does not decode gets an ``-EINVAL`` answer at once (the caller used to wait out its timeout).
"""

from __future__ import annotations

import time

import pytest
from gpushare_common import events
from gpushare_common.settings import NatsSettings
from gpushare_sim.kernel import KernelStandIn

from tests.kmod_bridge.conftest import PidnsProcess, kernel, pidns_process, sock_dir  # noqa: F401  (fixtures)
from tests.kmod_bridge.test_service import NODE, FixedSource, bridge, bridge_settings, client, command


@pytest.mark.parametrize(("op", "role"), [("release", "detector"), ("hold", "detector"), ("detect", "detector"),
                                          ("add", "solver"), ("delete", "solver")])
async def test_an_operation_on_another_roles_subject_is_refused(
        nats_settings: NatsSettings, kernel: KernelStandIn, pidns_process: PidnsProcess,  # noqa: F811
        op: str, role: str) -> None:
    async with bridge(nats_settings, bridge_settings(kernel), FixedSource()) as service, \
            client(nats_settings) as (bus, _):
        reply = await command(bus, op, role=role, pidns=(pidns_process.pidns,))
        assert reply.status == -1 and f"not the {role}'s to request" in reply.message
        assert service.bridge.metrics.commands.labels(op, "wrong-role")._value.get() == 1
        assert kernel.state.entries == {}  # the kernel never saw it


async def test_an_undecodable_request_is_answered_at_once(nats_settings: NatsSettings,
                                                          kernel: KernelStandIn) -> None:  # noqa: F811
    async with bridge(nats_settings, bridge_settings(kernel), FixedSource()) as service, \
            client(nats_settings) as (bus, _):
        for role in ("detector", "solver"):
            start = time.monotonic()
            raw = await bus.client.request(bus.subjects.kmod_requests(NODE, role), b"{not json", timeout=5)
            reply = events.decode(raw.data)
            assert isinstance(reply, events.KmodReply) and reply.status == -22, reply
            assert "does not decode" in reply.message and time.monotonic() - start < 2
        assert service.bridge.metrics.commands.labels("?", "undecodable")._value.get() == 2

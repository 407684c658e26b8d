"""A solver whose durable consumer was changed behind its back heals, and loses nothing.

The attack (an identity that may create consumers, as the console's "read-only" one once could):
update ``solver-<node>``'s filter to a subject nothing publishes. Every event of the node is then
skipped, and putting the filter back does not bring them back (the consumer's position moved
on). The solver checks its consumer against what it declared every ``consumer_check_s``, makes
it again from the last ack floor it saw intact, and the skipped event's effect happens.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from gpushare_common.bus import Bus
from gpushare_common.events import CardInventory
from gpushare_common.settings import NatsSettings
from gpushare_solver import app
from gpushare_solver.settings import SolverSettings
from nats.js import api

from tests.solver.conftest import NODE, FakeBridge, wait_for
from tests.solver.fakes import FakePods, FakeTasks
from tests.solver.test_service import publish_all
from tests.solver.world import common_settings


@contextlib.asynccontextmanager
async def solver(nats: NatsSettings) -> AsyncIterator[app.Service]:
    stop, pods = asyncio.Event(), FakePods()
    settings = SolverSettings(retry_first_s=0.05, retry_max_s=0.5, ack_wait_s=2.0, consumer_check_s=0.2)
    async with app.Service(common_settings(nats, Path("unused-kubeconfig"), NODE), settings, stop, pods=pods,
                           tasks_api=FakeTasks(), allocations=pods).started() as running:
        yield running
        stop.set()


async def narrow(bus: Bus, durable: str) -> None:
    """What the attacker sends: the durable, the same name, another filter (an update)."""
    config = api.ConsumerConfig(name=durable, durable_name=durable, ack_policy=api.AckPolicy.EXPLICIT,
                                max_deliver=-1, ack_wait=2.0, filter_subject=f"{bus.subjects.prefix}.{NODE}.nothing")
    await bus.client.jetstream()._jsm.add_consumer(bus.settings.stream, config)


def restored(running: app.Service, durable: str) -> float | None:
    return running.registry.get_sample_value("gpushare_bus_consumer_restored_total", {"durable": durable})


def inventory(*cards: str) -> CardInventory:
    return CardInventory(node=NODE, vendor_resource="nvidia.com/gpu", devices=cards)


async def test_a_skipped_event_takes_effect_once_the_solver_heals_its_consumer(
        nats_settings: NatsSettings, bridge: FakeBridge) -> None:
    bus = Bus(nats_settings, "attacker")
    await bus.connect()
    try:
        async with solver(nats_settings) as running:
            await publish_all(bus, [inventory("GPU-0")])
            await wait_for(lambda: running.solver.state.lent() == ["spot-GPU-0"], what="the first card lent")
            durable = bus.layout.durable(NODE)
            await narrow(bus, durable)
            await publish_all(bus, [inventory("GPU-0", "GPU-1")])  # skipped while the filter is narrowed
            await wait_for(lambda: restored(running, durable) == 1, what="the consumer healed")
            await wait_for(lambda: sorted(running.solver.state.lent()) == ["spot-GPU-0", "spot-GPU-1"],
                           what="the skipped inventory applied")
            info = await bus.client.jetstream().consumer_info(bus.settings.stream, durable)
            assert info.config.filter_subject == bus.subjects.node_events(NODE)
    finally:
        await bus.drain()

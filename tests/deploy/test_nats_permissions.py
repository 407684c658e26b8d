"""The shipped NATS configurations on a real nats-server (the version k8s/ deploys): every role
can do all its work on its own node through the services' own bus code, and the layout is the
installer's.

Both deployments run (``tests/deploy/nats_deployments.py``): compose's static users (written by
its nats-config container from ``gpushare_common.layout``) and the chart's (the cluster's
nats.conf, its init container's issuer, the real ``gpushare-nats-auth`` with the chart's
settings, a TokenReview against the API emulator, node-bound tokens for the leaves and the
console; each node's leaf server as its DaemonSet runs it, the node services its users). What
may *not* be done is tests/security/test_nats_*.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Iterator

import pytest
from gpushare_common import events
from gpushare_common.bus import AckPolicy, Bus, Permanent
from gpushare_common.layout import DETECTOR, HEALTH, KINDS, KMOD, OBSERVED, SOLVER
from gpushare_common.subjects import KMOD_OPS
from gpushare_nats_auth.natsconf import static_users

from tests.deploy.nats_deployments import NODE_A, ChartNats, Deployment, chart_nats, compose_nats

ROLES = ("detector", "solver", "deviceplugin", "kmod-bridge", "observer")


@pytest.fixture(scope="module", params=["compose", "chart"])
def deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    with (compose_nats() if request.param == "compose" else chart_nats()) as running:
        yield running


@contextlib.asynccontextmanager
async def buses(deployment: Deployment, node: str = NODE_A) -> AsyncIterator[dict[str, Bus]]:
    """Every role's bus on ``node``, as the services open it (role and node name the inbox)."""
    opened: dict[str, Bus] = {}
    try:
        for role in ROLES:
            opened[role] = Bus(deployment.settings(role, node), role, node="" if role == "observer" else node)
            await asyncio.wait_for(opened[role].connect(), 15)
        yield opened
    finally:
        for bus in opened.values():
            await bus.drain()


async def test_the_installer_made_the_stream_and_every_bucket(deployment: Deployment) -> None:
    """The node's stream and buckets exist where its services are, and the observer sees them from
    the cluster (through the node's domain on the chart)."""
    async with buses(deployment) as bus:
        await asyncio.wait_for(bus["solver"].wait_for_stream(), 10)
        for name, reader in ((SOLVER, "solver"), (HEALTH, "solver"), (DETECTOR, "detector"), (KMOD, "kmod-bridge")):
            # on the node's server: a missing bucket would not answer (Transient: is the installer done?)
            store = await bus[reader].store(name, bus[reader].layout.scope(NODE_A, KINDS[name][0]))
            assert await store.get("absent", dict) is None, name
        domain = deployment.domain(NODE_A)
        assert await bus["observer"].last_seq(domain) >= 0
        stop = asyncio.Event()
        for name in OBSERVED:  # from the observer's server: through its own consumer, in the node's domain
            watch = bus["observer"].watch_bucket(name, f"{NODE_A}.>", stop, heartbeat_s=0.5, domain=domain)
            first = await asyncio.wait_for(anext(watch), 10)
            assert first.reset, name
            await watch.aclose()


async def test_events_reach_the_solvers_durable_consumer(deployment: Deployment) -> None:
    async with buses(deployment) as bus:
        subjects = bus["solver"].subjects
        sent = [events.SpotEvent(node=NODE_A, pod="t/spot", container="c", state="using"),
                events.LowPowerEvent(node=NODE_A, owner="t/dev", using=False)]  # fmt: skip
        for event in sent:
            assert await bus["detector"].publish_persistent(subjects.event(NODE_A, event_kind(event)), event) > 0
        back = events.OwnerBackEvent(node=NODE_A, pidns=4026531836, pid=7, kernel_ts_ns=1)
        assert await bus["kmod-bridge"].publish_reliably(subjects.event(NODE_A, "ownerback"), back, deadline_s=10)
        wanted, seen, stop = {e.id for e in [*sent, back]}, set[str](), asyncio.Event()

        async def handle(event: events.AnyEvent) -> None:
            seen.add(event.id)
            if wanted <= seen:
                stop.set()

        consumer = bus["solver"].consume(subjects.node_events(NODE_A), bus["solver"].layout.durable(NODE_A), handle,
                                         AckPolicy(), stop)  # fmt: skip
        await asyncio.wait_for(consumer, 20)
        assert wanted <= seen


def event_kind(event: events.Event) -> str:
    return events.event_tag(event)


async def test_kmod_commands_are_asked_and_answered(deployment: Deployment) -> None:
    async with buses(deployment) as bus:
        async def answer(command: events.AnyEvent) -> events.Event:
            assert isinstance(command, events.KmodCommand)
            return events.KmodReply(node=NODE_A, op=command.op, status=0)

        for role in KMOD_OPS:
            await bus["kmod-bridge"].serve(bus["kmod-bridge"].subjects.kmod_requests(NODE_A, role), answer)
        await bus["kmod-bridge"].flush()  # the subscriptions are registered before the first request
        for asker, op in (("detector", "stats"), ("solver", "release")):
            subject = bus[asker].subjects.kmod_cmd(NODE_A, op)
            reply = await bus[asker].request(subject, events.KmodCommand(node=NODE_A, op=op), timeout=5)
            assert isinstance(reply, events.KmodReply) and reply.status == 0, asker


async def test_each_role_keeps_its_own_state_and_the_plugin_reads_health(deployment: Deployment) -> None:
    async with buses(deployment) as bus:
        layout = bus["solver"].layout
        for role, bucket, kind in (("detector", "detector", "fact"), ("solver", "solver", "mapping"),
                                   ("solver", "health", "health"), ("kmod-bridge", "kmod", "watch")):  # fmt: skip
            store = await bus[role].store(bucket, layout.scope(NODE_A, kind))
            await store.put("ns/pod", {"role": role})
            assert await store.get("ns/pod", dict) == {"role": role}
            assert await store.items(dict) == {"ns/pod": {"role": role}}
            if bucket != "health":
                await store.delete("ns/pod")
        health = await bus["deviceplugin"].store("health", layout.scope(NODE_A, "health"))
        assert await health.items(dict) == {"ns/pod": {"role": "solver"}}
        with pytest.raises(Permanent, match="permission denied"):
            await asyncio.wait_for(health.put("ns/pod", {}), 10)


async def test_each_role_hears_its_channels(deployment: Deployment) -> None:
    async with buses(deployment) as bus:
        subjects = bus["solver"].subjects
        heard: dict[str, asyncio.Queue[events.AnyEvent]] = {}
        listens = {"deviceplugin": [subjects.node_health(NODE_A), subjects.node_capacity(NODE_A),
                                    subjects.event(NODE_A, "spot")],
                   "solver": [subjects.node_capacity(NODE_A)], "detector": [subjects.event(NODE_A, "ownerback")],
                   "observer": [subjects.all()]}  # fmt: skip
        heard["observer"] = asyncio.Queue()
        await bus["observer"].subscribe(subjects.all(), heard["observer"].put)
        await observer_hears_the_node(bus, heard["observer"])
        for role, wanted in listens.items():
            if role == "observer":
                continue
            heard[role] = asyncio.Queue()
            for subject in wanted:
                await bus[role].subscribe(subject, heard[role].put)
        for bus_ in bus.values():
            await bus_.flush()
        sends = [("solver", subjects.health(NODE_A, "spot-gpu"), events.DeviceHealth(node=NODE_A, resource="spot-gpu")),
                 ("detector", subjects.capacity(NODE_A, "vcpu"),
                  events.SpareCapacity(node=NODE_A, resource="vcpu", devices=1, unit=1000)),
                 ("detector", subjects.event(NODE_A, "spot"),
                  events.SpotEvent(node=NODE_A, pod="t/p", container="c", state="cleared")),
                 ("kmod-bridge", subjects.event(NODE_A, "ownerback"),
                  events.OwnerBackEvent(node=NODE_A, pidns=1, pid=1, kernel_ts_ns=1))]  # fmt: skip
        for role, subject, event in sends:
            await bus[role].publish(subject, event)
        expected = {"deviceplugin": 3, "solver": 1, "detector": 1, "observer": 4}
        for role, count in expected.items():
            got: list[events.AnyEvent] = []
            while len(got) < count:
                event = await asyncio.wait_for(heard[role].get(), 10)
                if getattr(event, "pod", "") != PROBE:  # a probe that was still on its way
                    got.append(event)
            assert len(got) == count, role


PROBE = "probe/interest"


async def observer_hears_the_node(bus: dict[str, Bus], heard: asyncio.Queue[events.AnyEvent]) -> None:
    """Where the observer is on another server than the node's services (the chart: the cluster
    and the node's leaf), its subscription reaches the leaf some time after its own server has
    it; until then the leaf forwards nothing. Probe until one arrives."""
    subject = bus["detector"].subjects.event(NODE_A, "spot")
    probe = events.SpotEvent(node=NODE_A, pod=PROBE, container="c", state="cleared")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while True:
        await bus["detector"].publish(subject, probe)
        try:
            await asyncio.wait_for(heard.get(), 0.25)
            return
        except TimeoutError:
            if loop.time() > deadline:
                raise AssertionError("the observer's subscription never reached the node's server") from None


async def test_the_observer_follows_a_bucket_through_its_own_consumer(deployment: Deployment) -> None:
    async with buses(deployment) as bus:
        written = await bus["solver"].store("health", bus["solver"].layout.scope(NODE_A, "health"))
        await written.put("spot-gpu", {"by": "solver"})
        stop = asyncio.Event()
        for _ in range(2):  # followed again (a lost watch): its consumer is made fresh, all keys again
            watch = bus["observer"].watch_bucket("health", ">", stop, heartbeat_s=0.5,
                                                 domain=deployment.domain(NODE_A))  # fmt: skip
            first = await asyncio.wait_for(anext(watch), 10)
            assert first.reset and f"{NODE_A}.health.spot-gpu" in [c.key for c in first.changes]
            await watch.aclose()


async def test_the_observer_reads_the_stream(deployment: Deployment) -> None:
    async with buses(deployment) as bus:
        event = events.SpotEvent(node=NODE_A, pod="t/read", container="c", state="using")
        seq = await bus["detector"].publish_persistent(bus["detector"].subjects.event(NODE_A, "spot"), event)
        domain = deployment.domain(NODE_A)
        assert await bus["observer"].last_seq(domain) >= seq
        (found,) = await bus["observer"].read_after(bus["observer"].subjects.event(NODE_A, "spot"), seq - 1, limit=1,
                                                    domain=domain)  # fmt: skip
        assert found.event().id == event.id


def test_compose_users_come_from_the_layout() -> None:
    """The users compose's nats-config writes are each role's Layout.permissions on that node."""
    text = static_users(NODE_A)
    assert '{user: "solver", password: $SOLVER_PASSWORD' in text and '"gpushare.v1.gpu-node-1.eviction"' in text
    assert "gpu-node-2" not in text and text.count("{user:") == 6


async def test_the_chart_callout_counts_its_grants(deployment: Deployment) -> None:
    if not isinstance(deployment, ChartNats):
        pytest.skip("compose has no callout")
    async with buses(deployment):
        pass
    grants = deployment.status()["grants"]  # the console's and each node's leaf: the services use their leaf
    assert grants.get("observer", 0) >= 1 and grants.get("leaf", 0) >= len(deployment.NODES), grants


async def test_the_dra_driver_publishes_its_cards_and_follows_the_spot_health(deployment: Deployment) -> None:
    """The DRA driver's own role (a DRA node of the chart; compose runs none): it waits for the
    stream, hears and reads the solver's desired spot health, and publishes its card inventory
    to the stream; it may not write the health it reads."""
    if "dra-driver" not in deployment.roles:
        pytest.skip("compose runs no DRA driver")
    async with buses(deployment) as bus:
        driver = Bus(deployment.settings("dra-driver"), "dra-driver", node=NODE_A)
        await asyncio.wait_for(driver.connect(), 15)
        try:
            await asyncio.wait_for(driver.wait_for_stream(), 10)
            subjects, layout = driver.subjects, driver.layout
            heard: asyncio.Queue[events.AnyEvent] = asyncio.Queue()
            await driver.subscribe(subjects.health(NODE_A, "spot-gpu"), heard.put)
            await driver.flush()
            desired = events.DeviceHealth(node=NODE_A, resource="spot-gpu", devices={"spot-GPU-0": "Healthy"})
            await bus["solver"].publish(subjects.health(NODE_A, "spot-gpu"), desired)
            assert (await asyncio.wait_for(heard.get(), 10)).id == desired.id
            written = await bus["solver"].store("health", layout.scope(NODE_A, "health"))
            await written.put("spot-gpu", {"devices": {"spot-GPU-0": "Healthy"}})
            read = await driver.store("health", layout.scope(NODE_A, "health"))
            assert await read.get("spot-gpu", dict) == {"devices": {"spot-GPU-0": "Healthy"}}
            with pytest.raises(Permanent, match="permission denied"):
                await asyncio.wait_for(read.put("spot-gpu", {}), 10)
            await written.delete("spot-gpu")
            cards = events.CardInventory(node=NODE_A, vendor_resource="gpushare.k8s.io/nvidia.com/gpu",
                                         devices=("GPU-0",))  # fmt: skip
            seq = await driver.publish_reliably(subjects.event(NODE_A, "inventory"), cards, deadline_s=10)
            (found,) = await bus["observer"].read_after(subjects.event(NODE_A, "inventory"), seq - 1, limit=1,
                                                        domain=deployment.domain(NODE_A))  # fmt: skip
            assert found.event().id == cards.id
        finally:
            await driver.drain()


async def test_gpushare_events_replays_every_hop_of_a_node_from_the_cluster(deployment: Deployment) -> None:
    """``gpushare-events replay --node A`` as the observer: the owner-back, the health it changed
    and the eviction record, from the node's own stream (through its domain on the chart)."""
    from gpushare_common.bus.replay import Filter, Printer, replay

    async with buses(deployment) as bus:
        subjects = bus["solver"].subjects
        back = events.OwnerBackEvent(node=NODE_A, pidns=4026531900, pid=9, kernel_ts_ns=7, pod="dev/hops")
        await bus["kmod-bridge"].publish_reliably(subjects.event(NODE_A, "ownerback"), back, deadline_s=10)
        health = events.DeviceHealth(node=NODE_A, resource="spot-gpu", devices={"spot-GPU-9": "Unhealthy"})
        await bus["solver"].publish_persistent(subjects.health(NODE_A, "spot-gpu"), health)
        record = events.EvictionRecord(node=NODE_A, pod="spot/hops", reason="owner-back", owner="dev/hops",
                                       trigger_id=back.id, outcome="evicted")  # fmt: skip
        await bus["solver"].publish_persistent(subjects.eviction(NODE_A), record)
        out = io.StringIO()
        found = await replay(bus["observer"], Filter(node=NODE_A), Printer(False, out), None, None,
                             domain=deployment.domain(NODE_A))  # fmt: skip
        lines = out.getvalue().splitlines()
        assert found >= 3
        for tag, marker in (("ownerback", "pod=dev/hops"), ("health", "spot-GPU-9"), ("eviction", "pod=spot/hops")):
            assert any(f"{NODE_A} {tag} " in line and marker in line for line in lines), (tag, lines[-5:])

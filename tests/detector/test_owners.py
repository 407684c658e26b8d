"""Away/back of lendable owners through the wired detector: exporter text, kernel stats, owner-back."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from gpushare_common import events as ev
from gpushare_common.bus import Bus
from gpushare_common.settings import NatsSettings
from gpushare_detector.adapters.exporter import ExporterError, fetch_text
from gpushare_detector.detector import Detector
from gpushare_detector.metrics import DetectorMetrics
from gpushare_detector.scraper import Scraper
from gpushare_detector.vendors import BUILTIN_DIR, load_mappings, parse_mapping
from prometheus_client import CollectorRegistry

from tests.detector import podfactory as pf
from tests.detector.harness import NODE, Collector, KmodBridge, build, is_
from tests.detector.podres_server import PodResourcesServer

DCGM = load_mappings(BUILTIN_DIR)["nvidia-dcgm"]
WINDOW = 600.0
FIXTURES = Path(__file__).parent / "fixtures"


def dcgm(util: str) -> str:
    return f'DCGM_FI_DEV_GPU_UTIL{{UUID="G1",gpu="0",Hostname="node-1"}} {util}\n'


class Exporter:
    """What the exporter answers next: text, or an error (a vanished exporter)."""

    def __init__(self) -> None:
        self.text: str | None = dcgm("0")

    async def fetch(self, url: str, timeout_s: float) -> str:
        if self.text is None:
            raise ExporterError(url, "unreachable: connection refused")
        return self.text


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Rig:
    def __init__(self, detector: Detector, exporter: Exporter, clock: Clock, bridge: KmodBridge,
                 seen: Collector, bus: Bus) -> None:
        self.detector, self.exporter, self.clock = detector, exporter, clock
        self.bridge, self.seen, self.bus = bridge, seen, bus

    async def tick(self, minutes: int = 1) -> None:
        for _ in range(minutes):
            self.clock.now += 60
            await self.detector.observe_owners()

    def state(self) -> str:
        return str(self.detector.away.owners["ns/dev"].state)


@pytest.fixture
async def rig(nats_settings: NatsSettings, podresources: PodResourcesServer) -> AsyncIterator[Rig]:
    bus = Bus(nats_settings, "detector-test")
    await bus.connect()
    await bus.wait_for_stream()
    bridge, seen = KmodBridge(), Collector()
    await bus.serve(bus.subjects.node_kmod(NODE), bridge.respond)
    await bus.subscribe(bus.subjects.event(NODE, "lowpower"), seen)
    exporter, clock = Exporter(), Clock()
    scraper = Scraper("http://exporter", DCGM, exporter.fetch, 1.0, max_age_s=120, clock=clock,
                      metrics=DetectorMetrics(CollectorRegistry()))
    detector = build(bus, str(podresources.socket), scraper=scraper, window_s=WINDOW, clock=clock)
    await bus.subscribe(bus.subjects.event(NODE, "ownerback"), detector.on_owner_back)
    podresources.table["ns/dev"] = {"main": {"nvidia.com/gpu": ("G1",)}}
    view = detector.tracker.read(pf.reserved("dev", lendable=True))
    assert view is not None
    await detector.publish(detector.tracker.upsert(view, await detector._devices_of("ns/dev")))
    detector._after_pods_changed()
    bridge.hits["ns/dev/main"] = 10
    yield Rig(detector, exporter, clock, bridge, seen, bus)
    await detector.devices.close()  # type: ignore[attr-defined]
    await bus.drain()


async def test_owner_goes_away_after_the_window_and_comes_back_on_notice(rig: Rig) -> None:
    await rig.tick(11)
    assert rig.state() == "active"
    await rig.tick(1)
    away = await rig.seen.wait_for(is_(ev.LowPowerEvent, owner="ns/dev", using=False))
    assert isinstance(away, ev.LowPowerEvent) and away.devices == ("G1",) and away.containers == ("ns/dev/main",)
    notice = ev.OwnerBackEvent(node=NODE, pidns=1, pid=42, kernel_ts_ns=1, pod="ns/dev/main", resolved=True)
    await rig.bus.publish(rig.bus.subjects.event(NODE, "ownerback"), notice)
    back = await rig.seen.wait_for(is_(ev.LowPowerEvent, owner="ns/dev", using=True, reason="owner-back"))
    assert back.id != away.id
    assert rig.detector.status()["owners"]["ns/dev"]["state"] == "active"


async def test_back_on_utilisation_or_gpu_access(rig: Rig) -> None:
    await rig.tick(12)
    assert rig.state() == "away"
    rig.exporter.text = dcgm("12")
    await rig.tick()
    await rig.seen.wait_for(is_(ev.LowPowerEvent, owner="ns/dev", using=True, reason="utilisation"))
    rig.exporter.text = dcgm("0")
    await rig.tick(12)
    assert rig.state() == "away"
    rig.bridge.hits["ns/dev/main"] = 11
    await rig.tick()
    await rig.seen.wait_for(is_(ev.LowPowerEvent, owner="ns/dev", using=True, reason="gpu-access"))


@pytest.mark.parametrize(
    "garbage",
    [None, "this is { not prometheus\n", dcgm("NaN"), 'DCGM_FI_DEV_GPU_UTIL{Hostname="node-1"} 0\n',
     dcgm("0").replace("G1", "G9"), ""],
    ids=["vanished", "bad-text", "nan", "missing-label", "other-card", "empty"],
)
async def test_garbage_exporter_output_never_makes_an_owner_away(rig: Rig, garbage: str | None) -> None:
    await rig.tick(6)  # half a window of real idleness
    rig.exporter.text = garbage
    await rig.tick(20)
    assert rig.state() == "active"
    assert not any(isinstance(e, ev.LowPowerEvent) and not e.using for e in rig.seen.events)
    scrape = rig.detector.status()["scrape"]
    assert not scrape["ok"] or scrape["skipped"] or garbage in ("", dcgm("0").replace("G1", "G9"))


async def test_missing_kernel_stats_never_make_an_owner_away(rig: Rig) -> None:
    rig.bridge.hits.clear()
    await rig.tick(20)
    assert rig.state() == "active"


@pytest.fixture
def http_exporter() -> Iterator[str]:
    body = (FIXTURES / "nvidia-dcgm.prom").read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()
    thread.join(5)


async def test_fetch_from_a_real_http_exporter_then_it_vanishes(http_exporter: str) -> None:
    text = await fetch_text(http_exporter, 2.0)
    assert "DCGM_FI_DEV_GPU_UTIL" in text
    scraper = Scraper(http_exporter, DCGM, fetch_text, 2.0, max_age_s=60, clock=asyncio.get_running_loop().time,
                      metrics=DetectorMetrics(CollectorRegistry()))
    assert (await scraper.scrape()).ok
    assert scraper.utilisation(("GPU-aaaa",)) == 37 and scraper.utilisation(("GPU-bbbb",)) == 0
    scraper.url = "http://127.0.0.1:1/metrics"  # nothing listens on port 1
    result = await scraper.scrape()
    assert not result.ok and "unreachable" in result.error
    assert scraper.utilisation(("GPU-aaaa",)) is None


async def test_a_busy_borrower_on_the_lent_card_never_brings_the_owner_back(rig: Rig) -> None:
    """The borrower's load shows on the card's utilisation and its calls are counted: neither is
    the owner's. Only the owner's own calls (or the kernel's notice) bring it back."""
    await rig.tick(12)
    assert rig.state() == "away"
    view = rig.detector.tracker.read(pf.spot("b"))
    assert view is not None
    await rig.detector.publish(rig.detector.tracker.upsert(view, {"job": {"gpushare/spot-gpu": ("spot-G1",)}}))
    rig.detector._after_pods_changed()
    assert await rig.detector.kmod.sync_once()  # over NATS: the borrower's placement reaches the bridge
    assert rig.bridge.placed["ns/b/job"] == ev.Placement(container="ns/b/job", role="borrower", cards=("G1",))
    rig.exporter.text = dcgm("90")
    for calls in range(1, 6):
        rig.bridge.hits["ns/b/job"] = calls * 1000
        await rig.tick()
    assert rig.state() == "away"
    assert not any(isinstance(e, ev.LowPowerEvent) and e.using for e in rig.seen.events)
    rig.bridge.hits["ns/dev/main"] = 11  # the owner's own call
    await rig.tick()
    await rig.seen.wait_for(is_(ev.LowPowerEvent, owner="ns/dev", using=True, reason="gpu-access"))


async def activity_of(rig: Rig) -> asyncio.Queue[ev.AnyEvent]:
    """The node's activity messages as they come."""
    activity: asyncio.Queue[ev.AnyEvent] = asyncio.Queue()

    async def seen(event: ev.AnyEvent) -> None:
        activity.put_nowait(event)

    await rig.bus.subscribe(rig.bus.subjects.activity(NODE), seen)
    return activity


async def test_every_placed_pods_activity_is_published_with_its_rate(rig: Rig) -> None:
    activity = await activity_of(rig)
    await rig.tick()
    first = await asyncio.wait_for(activity.get(), 5)
    assert isinstance(first, ev.GpuActivity)
    assert [(c.pod, c.container, c.role, c.cards, c.calls, c.calls_per_s) for c in first.containers] == [
        ("ns/dev", "main", "owner", ("G1",), 10, None)]
    assert first.cards == {"G1": ev.CardFigures(utilisation=0.0)}  # each card's own figures, for the fleet page
    rig.bridge.hits["ns/dev/main"] = 130  # 120 calls in the minute of a tick
    await rig.tick()
    second = await asyncio.wait_for(activity.get(), 5)
    assert isinstance(second, ev.GpuActivity) and second.containers[0].calls_per_s == 2.0


async def test_an_exporters_per_process_figures_name_the_borrower_itself(rig: Rig) -> None:
    """An exporter that labels samples by process: the bridge says which container each pid runs
    in, and the per-pod utilisation and the activity name the borrower, not the card's holder."""
    assert rig.detector.scraper is not None
    rig.detector.scraper.mapping = parse_mapping(
        "vendor: dcgm-process\nmetrics: {utilisation: {names: [DCGM_FI_DEV_GPU_UTIL]}}\n"
        "labels: {device: [UUID], pod: [pod], namespace: [namespace], container: [container], pid: [pid]}\n")
    view = rig.detector.tracker.read(pf.spot("b"))
    assert view is not None
    rig.detector.tracker.upsert(view, {"job": {"gpushare/spot-gpu": ("spot-G1",)}})
    rig.detector._after_pods_changed()
    rig.bridge.processes[777] = ("ns/b", "job")
    rig.exporter.text = dcgm("60") + 'DCGM_FI_DEV_GPU_UTIL{UUID="G1",pid="777"} 60\n' \
        'DCGM_FI_DEV_GPU_UTIL{UUID="G1",pid="888"} 5\n'  # a pid of no known container
    activity = await activity_of(rig)
    await rig.tick()
    event = await asyncio.wait_for(activity.get(), 5)
    assert isinstance(event, ev.GpuActivity)
    assert {(c.pod, c.role): c.utilisation for c in event.containers} == {("ns/b", "borrower"): 60.0,
                                                                        ("ns/dev", "owner"): None}
    registry = rig.detector.scraper.metrics.registry  # where the scraper exports
    assert registry.get_sample_value("gpushare_pod_gpu_utilisation_percent",
                                     {"card": "G1", "pod": "ns/b", "container": "job"}) == 60.0

"""Scrape the GPU exporter and answer "how busy are these cards" (None when unknown)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from gpushare_common.logging import get_logger

from .adapters.exporter import ExporterError
from .gpumetrics import DeviceMetrics, PodKey, ProcessKey, ScrapeError, scrape_metrics
from .metrics import DetectorMetrics
from .vendors import VendorMapping

log = get_logger("detector.scrape")
Fetch = Callable[[str, float], Awaitable[str]]


@dataclass(slots=True)
class ScrapeResult:
    at: float
    ok: bool
    devices: dict[str, DeviceMetrics] = field(default_factory=dict)
    error: str = ""
    pods: dict[PodKey, DeviceMetrics] = field(default_factory=dict)  # what the exporter labels by pod
    skipped: dict[str, int] = field(default_factory=dict)
    processes: dict[ProcessKey, DeviceMetrics] = field(default_factory=dict)  # what it labels by pid

    def attribute(self, containers: Mapping[int, tuple[str, str]]) -> int:
        """Fold the per-process figures into the per-pod ones: ``containers`` gives, for a host
        pid, its pod (``ns/name``) and container; a container's figure on a card is the sum of
        its processes' (utilisation at most 100), and replaces what the exporter said for that
        pod. Returns the processes attributed."""
        summed: dict[PodKey, DeviceMetrics] = {}
        for (card, pid), found in self.processes.items():
            if pid not in containers:
                continue
            pod, container = containers[pid]
            namespace, _, name = pod.partition("/")
            into = summed.setdefault((card, namespace, name, container),
                                     DeviceMetrics(card, pod=name, namespace=namespace, container=container))
            for metric in ("utilisation", "memory_used"):
                if (value := getattr(found, metric)) is not None:
                    setattr(into, metric, (getattr(into, metric) or 0.0) + value)
        for figures in summed.values():
            if figures.utilisation is not None:
                figures.utilisation = min(figures.utilisation, 100.0)
        self.pods.update(summed)
        return sum(1 for _, pid in self.processes if pid in containers)


class Scraper:
    def __init__(self, url: str, mapping: VendorMapping, fetch: Fetch, timeout_s: float,
                 max_age_s: float, clock: Callable[[], float], metrics: DetectorMetrics) -> None:
        self.url = url
        self.mapping = mapping
        self.fetch = fetch
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s
        self.clock = clock
        self.metrics = metrics
        self.last: ScrapeResult | None = None
        metrics.follow_gpus(self.fresh)

    async def scrape(self) -> ScrapeResult:
        now = self.clock()
        try:
            text = await self.fetch(self.url, self.timeout_s)
            devices, pods, skipped, processes = scrape_metrics(self.mapping, text, self.url)
        except (ScrapeError, ExporterError) as err:
            outcome = "unparseable" if isinstance(err, ScrapeError) else "unreachable"
            result = ScrapeResult(now, False, error=f"{outcome}: {err}")
        else:
            outcome = "ok"
            result = ScrapeResult(now, True, devices, skipped=dict(skipped), pods=pods, processes=processes)
            for reason, count in skipped.items():
                self.metrics.errors.labels("exporter", reason).inc(count)
        self.metrics.scrapes.labels(outcome).inc()
        if not result.ok and (self.last is None or self.last.ok):
            log.warning("exporter scrape failed", url=self.url, error=result.error)
        elif result.ok and self.last is not None and not self.last.ok:
            log.info("exporter scrape recovered", url=self.url)
        self.last = result
        return result

    def fresh(self) -> ScrapeResult | None:
        """The last scrape when it succeeded and is not older than ``max_age_s`` (else None)."""
        last = self.last
        return last if last is not None and last.ok and self.clock() - last.at <= self.max_age_s else None

    def utilisation(self, devices: tuple[str, ...]) -> float | None:
        """Highest utilisation of ``devices``; None if any is unknown or the last scrape is bad or old."""
        last = self.last
        if last is None or not last.ok or self.clock() - last.at > self.max_age_s or not devices:
            return None
        values = [m.utilisation if (m := last.devices.get(d)) else None for d in devices]
        known = [v for v in values if v is not None]
        return max(known) if len(known) == len(values) else None

    def status(self) -> dict[str, object]:
        last = self.last
        if last is None:
            return {"url": self.url, "vendor": self.mapping.vendor, "last": None}
        return {"url": self.url, "vendor": self.mapping.vendor, "age_s": round(self.clock() - last.at, 1),
                "ok": last.ok, "error": last.error, "devices": len(last.devices), "skipped": last.skipped}

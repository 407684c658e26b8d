"""Scrape the GPU exporter and answer "how busy are these cards" (None when unknown)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gpushare_common.logging import get_logger

from .adapters.exporter import ExporterError
from .gpumetrics import DeviceMetrics, PodKey, ScrapeError, scrape_metrics
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
            devices, pods, skipped = scrape_metrics(self.mapping, text, self.url)
        except (ScrapeError, ExporterError) as err:
            outcome = "unparseable" if isinstance(err, ScrapeError) else "unreachable"
            result = ScrapeResult(now, False, error=f"{outcome}: {err}")
        else:
            outcome = "ok"
            result = ScrapeResult(now, True, devices, skipped=dict(skipped), pods=pods)
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

"""Apply a vendor mapping to an exporter's Prometheus text: per-device common metrics.

Bad input never turns into numbers: text that does not parse fails the whole
scrape (:class:`ScrapeError`); a sample without the device label, or with a
NaN, infinite or out-of-range value, is skipped and counted by reason.  A
device whose utilisation is missing stays *unknown* (None), never 0.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from .vendors import VendorMapping

MAX_UTILISATION = 100.0


class ScrapeError(ValueError):
    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"metrics from {source}: {reason}")


@dataclass(slots=True)
class DeviceMetrics:
    device: str
    node: str = ""
    pod: str = ""
    namespace: str = ""
    container: str = ""
    utilisation: float | None = None
    memory_used: float | None = None
    memory_total: float | None = None
    memory_free: float | None = None
    power: float | None = None
    ranks: dict[str, int] = field(default_factory=dict, repr=False)

    def set(self, metric: str, rank: int, value: float) -> None:
        if rank <= self.ranks.get(metric, rank):
            self.ranks[metric] = rank
            setattr(self, metric, value)


def _label(labels: Mapping[str, str], names: Iterable[str]) -> str:
    return next((labels[n] for n in names if labels.get(n)), "")


def _valid(metric: str, value: float) -> str:
    """'' when the value is usable, else the reason it is not."""
    if not math.isfinite(value):
        return "not-finite"
    if value < 0 or (metric == "utilisation" and value > MAX_UTILISATION):
        return "out-of-range"
    return ""


def _new_device(device: str, labels: Mapping[str, str], names: Mapping[str, tuple[str, ...]]
                ) -> DeviceMetrics:
    return DeviceMetrics(
        device, node=_label(labels, names.get("node", ())), pod=_label(labels, names.get("pod", ())),
        namespace=_label(labels, names.get("namespace", ())),
        container=_label(labels, names.get("container", ())))


def _samples(text: str, source: str) -> list[tuple[str, Mapping[str, str], float]]:
    try:
        return [(s.name, s.labels, float(s.value))
                for family in text_string_to_metric_families(text) for s in family.samples]
    except (ValueError, TypeError, IndexError, KeyError) as err:
        raise ScrapeError(source, f"not Prometheus text: {err}") from None


PodKey = tuple[str, str, str, str]  # device, namespace, pod, container


def device_metrics(mapping: VendorMapping, text: str, source: str = "exporter"
                   ) -> tuple[dict[str, DeviceMetrics], Counter[str]]:
    """Per-device metrics and a count of skipped samples by reason."""
    devices, _, problems = scrape_metrics(mapping, text, source)
    return devices, problems


def scrape_metrics(mapping: VendorMapping, text: str, source: str = "exporter"
                   ) -> tuple[dict[str, DeviceMetrics], dict[PodKey, DeviceMetrics], Counter[str]]:
    """Per-device metrics, per-pod metrics (the samples whose labels name a pod, as the mapping's
    ``labels.pod`` says: one entry per device, namespace, pod and container) and a count of skipped
    samples by reason."""
    devices: dict[str, DeviceMetrics] = {}
    pods: dict[PodKey, DeviceMetrics] = {}
    problems: Counter[str] = Counter()
    labels = mapping.labels
    for name, sample_labels, value in _samples(text, source):
        target = mapping.metric_of(name)
        if target is None:
            continue
        metric, rank, scale = target
        device = _label(sample_labels, labels["device"])
        reason = "missing-label" if not device else _valid(metric, value)
        if reason:
            problems[reason] += 1
            continue
        found = devices.get(device)
        if found is None:
            found = devices[device] = _new_device(device, sample_labels, labels)
        found.set(metric, rank, value * scale)
        mine = _new_device(device, sample_labels, labels)
        if mine.pod:
            pods.setdefault((device, mine.namespace, mine.pod, mine.container), mine).set(metric, rank, value * scale)
    for found in (*devices.values(), *pods.values()):
        if found.memory_total is None and found.memory_used is not None and found.memory_free is not None:
            found.memory_total = found.memory_used + found.memory_free
    return devices, pods, problems

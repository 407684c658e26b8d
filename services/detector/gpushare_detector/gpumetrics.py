"""Apply a vendor mapping to an exporter's Prometheus text: per-device common metrics.

Bad input never turns into numbers: text that does not parse fails the whole
scrape (:class:`ScrapeError`); a sample without the device label, or with a
NaN, infinite or out-of-range value, is skipped and counted by reason.  A
device whose utilisation is missing stays *unknown* (None), never 0.  A sample
whose labels name a process (the mapping's ``labels.pid``, a host pid) is that
process's figure: kept apart per device and pid, never the card's.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

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
ProcessKey = tuple[str, int]  # device, host pid


class Scraped(NamedTuple):
    devices: dict[str, DeviceMetrics]
    pods: dict[PodKey, DeviceMetrics]  # what the exporter labels by pod
    problems: Counter[str]
    processes: dict[ProcessKey, DeviceMetrics]  # what the exporter labels by process


def _pid(labels: Mapping[str, str], names: Iterable[str]) -> int | None:
    """The process a sample names; None when none (or not a pid)."""
    value = _label(labels, names)
    return int(value) if value.isascii() and value.isdecimal() and 0 < int(value) < 1 << 31 else None


def device_metrics(mapping: VendorMapping, text: str, source: str = "exporter"
                   ) -> tuple[dict[str, DeviceMetrics], Counter[str]]:
    """Per-device metrics and a count of skipped samples by reason."""
    found = scrape_metrics(mapping, text, source)
    return found.devices, found.problems


def scrape_metrics(mapping: VendorMapping, text: str, source: str = "exporter") -> Scraped:
    """Per-device metrics, per-pod metrics (the samples whose labels name a pod, as the mapping's
    ``labels.pod`` says: one entry per device, namespace, pod and container), a count of skipped
    samples by reason, and per-process metrics (the samples naming a pid: one entry per device
    and pid)."""
    devices: dict[str, DeviceMetrics] = {}
    pods: dict[PodKey, DeviceMetrics] = {}
    processes: dict[ProcessKey, DeviceMetrics] = {}
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
        pid = _pid(sample_labels, labels.get("pid", ()))
        if pid is not None:
            processes.setdefault((device, pid), DeviceMetrics(device)).set(metric, rank, value * scale)
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
    return Scraped(devices, pods, problems, processes)

"""Metrics adapters as data: one mapping file per vendor (see docs/architecture.md, 'GPU metrics').

A mapping file (YAML) names, for each common metric, the exporter's metric
names (the first one present wins) and a scale to the common unit, and for
each common label the exporter's label names (first present wins)::

    vendor: nvidia-dcgm
    metrics:
      utilisation: {names: [DCGM_FI_DEV_GPU_UTIL], scale: 1}        # percent
      memory_used: {names: [DCGM_FI_DEV_FB_USED], scale: 1048576}   # -> bytes
      memory_total: {names: [DCGM_FI_DEV_FB_TOTAL], scale: 1048576}
      memory_free: {names: [DCGM_FI_DEV_FB_FREE], scale: 1048576}   # total = used + free
      power: {names: [DCGM_FI_DEV_POWER_USAGE], scale: 1}           # watts
    labels:
      device: [UUID, gpu]
      node: [Hostname]
      pod: [pod]
      namespace: [namespace]
      container: [container]
      pid: [pid]          # optional: a sample naming a process is that process's figure

Common units: utilisation in percent (0-100), memory in bytes, power in
watts.  Only ``utilisation`` and ``labels.device`` are required.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

METRICS = ("utilisation", "memory_used", "memory_total", "memory_free", "power")
LABELS = ("device", "node", "pod", "namespace", "container", "pid")
BUILTIN_DIR = Path(__file__).parent / "vendors"


class MappingError(ValueError):
    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"vendor mapping {source}: {reason}")


@dataclass(frozen=True, slots=True)
class MetricRule:
    names: tuple[str, ...]
    scale: float = 1.0


@dataclass(frozen=True, slots=True)
class VendorMapping:
    vendor: str
    metrics: dict[str, MetricRule]
    labels: dict[str, tuple[str, ...]]

    def metric_of(self, name: str) -> tuple[str, int, float] | None:
        """(common metric, preference rank, scale) of an exporter metric name, if mapped."""
        for common, rule in self.metrics.items():
            if name in rule.names:
                return common, rule.names.index(name), rule.scale
        return None


def _names(source: str, where: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise MappingError(source, f"{where} must be a non-empty list of names")
    return tuple(value)


def _metric(source: str, common: str, value: Any) -> MetricRule:
    if not isinstance(value, dict):
        raise MappingError(source, f"metrics.{common} must be a mapping with 'names'")
    scale = value.get("scale", 1)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not scale > 0:
        raise MappingError(source, f"metrics.{common}.scale must be a positive number")
    return MetricRule(_names(source, f"metrics.{common}.names", value.get("names")), float(scale))


def _section(source: str, doc: dict[str, Any], name: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    section = doc.get(name)
    if not isinstance(section, dict):
        raise MappingError(source, f"'{name}' must be a mapping")
    unknown = sorted(set(section) - set(allowed))
    if unknown:
        raise MappingError(source, f"unknown {name} {unknown} (known: {', '.join(allowed)})")
    return section


def parse_mapping(text: str, source: str = "<text>") -> VendorMapping:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise MappingError(source, f"not YAML: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("vendor"), str) or not doc["vendor"]:
        raise MappingError(source, "expected a mapping with a 'vendor' name")
    metrics = {k: _metric(source, k, v) for k, v in _section(source, doc, "metrics", METRICS).items()}
    labels = {k: _names(source, f"labels.{k}", v) for k, v in _section(source, doc, "labels", LABELS).items()}
    if "utilisation" not in metrics or "device" not in labels:
        raise MappingError(source, "metrics.utilisation and labels.device are required")
    return VendorMapping(doc["vendor"], metrics, labels)


def load_mappings(*directories: Path) -> dict[str, VendorMapping]:
    """Every ``*.yaml`` in the directories, by vendor name; later directories override."""
    found: dict[str, VendorMapping] = {}
    for directory in directories:
        for path in sorted(directory.glob("*.yaml")):
            mapping = parse_mapping(path.read_text(encoding="utf-8"), str(path))
            found[mapping.vendor] = mapping
    return found

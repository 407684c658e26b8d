"""Per-pod GPU activity of every container gpushare placed on a card: the kernel module's call
counts (any vendor) and their rate, with the exporter's figures where it labels them by pod."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpushare_common import events as ev

from .gpumetrics import DeviceMetrics, PodKey

Figures = Mapping[PodKey, DeviceMetrics]


def card_figures(devices: Mapping[str, DeviceMetrics]) -> dict[str, ev.CardFigures]:
    """Each card's own figures from a scrape (for the console's fleet page)."""
    return {card: ev.CardFigures(utilisation=m.utilisation, memory_used=m.memory_used, memory_total=m.memory_total)
            for card, m in sorted(devices.items())}  # fmt: skip


def calls_by_container(stats: Sequence[ev.NamespaceStats]) -> dict[str, int]:
    """GPU calls per ``ns/pod/container`` (summed over its namespaces)."""
    found: dict[str, int] = {}
    for stat in stats:
        if stat.pod and stat.container:
            key = f"{stat.pod}/{stat.container}"
            found[key] = found.get(key, 0) + stat.hits
    return found


def exporter_figures(where: ev.Placement, figures: Figures) -> tuple[float | None, float | None]:
    """(utilisation, memory used) the exporter gives this container on its cards (None: none)."""
    pod, _, container = where.container.rpartition("/")
    namespace, _, name = pod.partition("/")
    found = [m for card in where.cards if (m := figures.get((card, namespace, name, container))) is not None]
    utilisation = [m.utilisation for m in found if m.utilisation is not None]
    memory = [m.memory_used for m in found if m.memory_used is not None]
    return (max(utilisation) if utilisation else None), (sum(memory) if memory else None)


class ActivityMeter:
    """Each sample: every placed container's calls, and their rate since the previous sample."""

    def __init__(self, node: str, clock: Callable[[], float]) -> None:
        self.node = node
        self.clock = clock
        self.last: dict[str, tuple[int, float]] = {}  # container -> (calls, when)

    def sample(self, placed: Mapping[str, ev.Placement], stats: Sequence[ev.NamespaceStats] | None,
               figures: Figures) -> ev.GpuActivity:
        now, calls = self.clock(), calls_by_container(stats or ())
        rows = []
        for key, where in sorted(placed.items()):
            count = calls.get(key) if stats is not None else None
            rows.append(self._row(key, where, count, now, figures))
            if count is not None:
                self.last[key] = (count, now)
        self.last = {k: v for k, v in self.last.items() if k in placed}
        return ev.GpuActivity(node=self.node, containers=tuple(rows))

    def _row(self, key: str, where: ev.Placement, count: int | None, now: float, figures: Figures
             ) -> ev.ContainerActivity:
        before = self.last.get(key)
        rate = None
        if count is not None and before is not None and count >= before[0] and now > before[1]:
            rate = round((count - before[0]) / (now - before[1]), 3)
        pod, _, container = key.rpartition("/")
        utilisation, memory = exporter_figures(where, figures)
        return ev.ContainerActivity(pod=pod, container=container, role=where.role, cards=where.cards,
                                    shadow=where.shadow, calls=count, calls_per_s=rate,
                                    utilisation=utilisation, memory_used=memory)

"""Prometheus metrics of the device plugins, on the service's own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.devices = Gauge("gpushare_deviceplugin_devices", "Devices reported, by health",
                             ["resource", "health"], registry=registry)
        self.calls = Counter("gpushare_deviceplugin_calls", "kubelet calls by outcome",
                             ["resource", "call", "outcome"], registry=registry)
        self.allocate_seconds = Histogram(
            "gpushare_deviceplugin_allocate_seconds", "Allocate latency", ["resource"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25), registry=registry)
        self.registrations = Counter("gpushare_deviceplugin_registrations",
                                     "Registrations by outcome", ["resource", "outcome"],
                                     registry=registry)
        self.restarts = Counter("gpushare_deviceplugin_restarts",
                                "Plugin restarts after its socket vanished", ["resource"],
                                registry=registry)
        self.registered = Gauge("gpushare_deviceplugin_registered",
                                "1 while the plugin is registered with the kubelet", ["resource"],
                                registry=registry)
        self.share_isolation = Gauge(
            "gpushare_share_isolation", "1 for each isolation profile of the ShadowPods a share resource "
            "serves on this node ('none': a soft share, nothing capped); no series without ShadowPods",
            ["resource", "isolation"], registry=registry)
        self.watchers = Gauge("gpushare_deviceplugin_watchers", "Open ListAndWatch streams",
                              ["resource"], registry=registry)

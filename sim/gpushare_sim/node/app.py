"""One simulated node's lifecycle: the kubelet stand-in (registration,
device manager, pod-resources, pod lifecycle), the fake GPUs (vendor device
plugin, exporter) and, when an API is given, the node object and pod sync."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import platform
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from gpushare_common import ids

from gpushare_sim.fakegpu.cards import FakeCard, make_cards
from gpushare_sim.fakegpu.exporter import Exporter
from gpushare_sim.fakegpu.plugin import VendorPlugin
from gpushare_sim.node.adapters.backend import signing_key
from gpushare_sim.node.adapters.deviceplugins import DevicePluginManager
from gpushare_sim.node.adapters.dra import DraPlugins
from gpushare_sim.node.adapters.kube import KubeError, NotFound
from gpushare_sim.node.adapters.podresources import PodResourcesServer
from gpushare_sim.node.adapters.runners import Runner
from gpushare_sim.node.claims import ClaimPreparer
from gpushare_sim.node.devices import DeviceTable
from gpushare_sim.node.events import EventRecorder
from gpushare_sim.node.kubelet import Kubelet, PodApi
from gpushare_sim.node.model import PodDef, PodError, parse_pod
from gpushare_sim.node.settings import DRA_NODE_LABEL, SIM_NODE_LABEL, NodeSimSettings
from gpushare_sim.node.spec import SpecContext
from gpushare_sim.node.status import now_rfc3339

log = logging.getLogger("gpushare_sim.node.app")

NODE_STATUS_RESEND_S = 10.0
# the node's Lease, as a kubelet keeps it: renewed every 10 s, valid 40 s (the kubelet's defaults)
NODE_LEASE_NAMESPACE = "kube-node-lease"
NODE_LEASE_RENEW_S = 10.0
NODE_LEASE_DURATION_S = 40


class NodeApi(PodApi, Protocol):
    async def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...
    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...
    async def ensure_node(self, name: str, labels: dict[str, str]) -> None: ...
    async def patch_node_status(self, name: str, status: dict[str, Any]) -> None: ...
    async def list_node_pods(self, node: str) -> list[dict[str, Any]]: ...
    def watch_node_pods(self, node: str, stop: asyncio.Event) -> AsyncIterator[list[dict[str, Any]]]: ...
    async def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]: ...
    async def get_node(self, name: str) -> dict[str, Any]: ...
    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]: ...
    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...
    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]: ...


def node_status(
    settings: NodeSimSettings, table: DeviceTable, gone: frozenset[str] = frozenset(), kubelet_port: int = 0,
    heartbeat: str = "", ready_since: str = "",
) -> dict[str, Any]:
    """The Node's status; resources in ``gone`` (no plugin any more) are reported as 0. The
    kubelet port (this node's HTTP server) is where the API server fetches container logs. The
    Ready condition carries the heartbeat (the time of this report) and when it became True."""
    base = {"cpu": settings.cpu, "memory": settings.memory, "pods": "110", **dict.fromkeys(gone, "0")}
    capacity = {**base, **{r: str(n) for r, n in table.capacity().items()}}
    allocatable = {**base, **{r: str(n) for r, n in table.allocatable().items()}}
    return {
        "capacity": capacity,
        "allocatable": allocatable,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        **({"lastHeartbeatTime": heartbeat} if heartbeat else {}),
                        **({"lastTransitionTime": ready_since or heartbeat} if heartbeat else {})}],
        "addresses": [
            {"type": "InternalIP", "address": settings.host_ip},
            {"type": "Hostname", "address": settings.name},
        ],
        "nodeInfo": node_info(settings.name),
        **({"daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}}} if kubelet_port else {}),
    }


def node_lease(name: str, node_uid: str, renewed: float, resource_version: str = "") -> dict[str, Any]:
    """The node's Lease in ``kube-node-lease`` as a kubelet writes it: held by the node, owned by
    the Node object (deleted with it), its renew time in microseconds."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(renewed)) + f".{int(renewed % 1 * 1e6):06d}Z"
    meta: dict[str, Any] = {"name": name, "namespace": NODE_LEASE_NAMESPACE}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": name, "leaseDurationSeconds": NODE_LEASE_DURATION_S, "renewTime": stamp}}


@functools.cache
def node_info(name: str) -> dict[str, str]:
    """What a kubelet reports about its machine (every field: clients require them all)."""
    machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    release = {}
    with contextlib.suppress(OSError):
        release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    identity = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.gpushare-sim"))
    return {
        "architecture": machine, "bootID": identity, "containerRuntimeVersion": "sim",
        "kernelVersion": platform.release(), "kubeProxyVersion": "", "kubeletVersion": "v1.34.0-gpushare-sim",
        "machineID": identity.replace("-", ""), "operatingSystem": "linux",
        "osImage": release.get("PRETTY_NAME", "Linux").strip('"'), "systemUUID": identity,
    }  # fmt: skip


class NodeSim:
    def __init__(self, settings: NodeSimSettings, runner: Runner, api: NodeApi | None) -> None:
        self.settings = settings
        self.api = api
        self.table = DeviceTable()
        self.changed = asyncio.Event()
        self.plugins = DevicePluginManager(settings.plugin_dir, self.table, self.changed.set)
        self.cards: list[FakeCard] = []
        self.vendor: VendorPlugin | None = None
        self.events = EventRecorder(api, "kubelet", settings.name)
        self.kubelet = Kubelet(self.table, self.plugins, runner, api or _NoApi(),
                               SpecContext(settings.node_dir, settings.host_ip, _kmod(settings)),
                               self.events)  # fmt: skip
        self.dra = DraPlugins(settings.registry_dir) if settings.dra else None
        self.pod_resources = PodResourcesServer(settings.pod_resources_socket, self.table, self.kubelet.pods,
                                                self._claims_of)
        self.exporter: Exporter | None = None
        self.bad_pods: set[str] = set()
        self.syncs = 0
        self.signing_key: Path | None = None
        self.kubelet_port = 0
        self._urls: dict[str, str] = {}

    async def start(self, stack: AsyncExitStack) -> None:
        settings = self.settings
        self.signing_key = await asyncio.to_thread(signing_key, settings.node_dir)
        if self.dra is not None and self.api is not None:
            key = await asyncio.to_thread(ids.load_key, str(self.signing_key))
            self.kubelet.claims = ClaimPreparer(self.dra, self.api, key, settings.name)
            self.dra.on_health = self.kubelet.health_changed
        await self.plugins.start()
        stack.push_async_callback(self.plugins.stop)
        await self.pod_resources.start()
        stack.push_async_callback(self.pod_resources.stop)
        self.events.start()
        stack.push_async_callback(self.events.close)  # after the kubelet's last events
        stack.push_async_callback(self.kubelet.close)
        self.cards = await asyncio.to_thread(make_cards, settings.node_dir, settings.name,
                                             settings.gpus)  # fmt: skip
        self.vendor = VendorPlugin(self.cards, settings.plugin_dir, register=not settings.dra)
        await self.vendor.start()
        stack.push_async_callback(self.vendor.stop)
        self.exporter = Exporter(settings.name, settings.node_dir, self.cards,
                                 settings.gpu_memory_mib, settings.pod_resources_socket)  # fmt: skip
        if self.api is not None:
            labels = {"kubernetes.io/hostname": settings.name, SIM_NODE_LABEL: "true",
                      **({DRA_NODE_LABEL: "true"} if settings.dra else {}), **settings.labels}  # fmt: skip
            await self.api.ensure_node(settings.name, labels)

    async def restart_kubelet(self) -> None:
        log.info("kubelet restart node=%s", self.settings.name)
        await self.plugins.restart()

    # --- loops (run as guarded tasks by main) -------------------------------

    async def sync_once(self) -> None:
        """One full list of this node's pods, then a sync."""
        assert self.api is not None
        await self._sync(await self.api.list_node_pods(self.settings.name))

    async def _sync(self, objs: list[dict[str, Any]]) -> None:
        pods: list[PodDef] = []
        for obj in objs:
            try:
                pods.append(parse_pod(obj))
            except PodError as err:
                self._bad_pod(obj, err)
        await self.kubelet.sync(pods)
        self.syncs += 1

    def _bad_pod(self, obj: dict[str, Any], err: PodError) -> None:
        key = str((obj.get("metadata") or {}).get("uid") or err.value)
        if key not in self.bad_pods:
            self.bad_pods.add(key)
            log.warning("pod ignored node=%s: %s", self.settings.name, err)

    async def sync_loop(self, stop: asyncio.Event | None = None) -> None:
        """Follow this node's pods (list + watch) and sync the kubelet on every change."""
        assert self.api is not None
        async for objs in self.api.watch_node_pods(self.settings.name, stop or asyncio.Event()):
            await self._sync(objs)

    async def node_status_loop(self) -> None:
        assert self.api is not None
        reported: set[str] = set()
        ready_since = now_rfc3339()
        while True:
            self.changed.clear()
            gone = frozenset(reported - set(self.table.resources))
            reported |= set(self.table.resources)
            try:
                status = node_status(self.settings, self.table, gone, self.kubelet_port, now_rfc3339(), ready_since)
                await self.api.patch_node_status(self.settings.name, status)
            except KubeError as err:
                log.warning("node status update failed node=%s: %s", self.settings.name, err)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), NODE_STATUS_RESEND_S)

    async def renew_lease(self) -> None:
        """Create the node's Lease, or renew it (its resourceVersion: no blind overwrite)."""
        assert self.api is not None
        name = self.settings.name
        try:
            current = await self.api.get_lease(NODE_LEASE_NAMESPACE, name)
        except NotFound:
            node = await self.api.get_node(name)
            await self.api.create_lease(NODE_LEASE_NAMESPACE, node_lease(name, node["metadata"].get("uid", ""),
                                                                         time.time()))
            return
        meta = current.get("metadata") or {}
        uid = next((r.get("uid", "") for r in meta.get("ownerReferences") or [] if r.get("kind") == "Node"), "")
        await self.api.replace_lease(NODE_LEASE_NAMESPACE, name,
                                     node_lease(name, uid, time.time(), meta.get("resourceVersion", "")))

    async def node_lease_loop(self) -> None:
        """The kubelet's heartbeat: the node's Lease renewed every ``NODE_LEASE_RENEW_S``."""
        while True:
            try:
                await self.renew_lease()
            except KubeError as err:
                log.warning("node lease not renewed node=%s: %s", self.settings.name, err)
            await asyncio.sleep(NODE_LEASE_RENEW_S)

    async def retry_unprepare(self) -> None:
        if self.kubelet.claims is not None:
            await self.kubelet.claims.retry()

    def _claims_of(self, uid: str, container: str) -> list[tuple[str, str, list[str]]]:
        claims = self.kubelet.claims
        return claims.dynamic(uid, container) if claims is not None else []

    def endpoints(self) -> dict[str, str]:
        """Where to reach this node's kubelet stand-in, exporter and containers."""
        return {
            **self._urls,
            "kubelet_socket": str(self.plugins.kubelet_socket),
            "pod_resources_socket": str(self.settings.pod_resources_socket),
            "signing_key": str(self.signing_key or ""),
            "cdi_dir": str(self.settings.node_dir / "cdi"),
            "gpu_memory_mib": str(self.settings.gpu_memory_mib),  # each fake card's
            **({"plugins_registry": str(self.settings.registry_dir)} if self.dra is not None else {}),
            **{f"containerd_{k}": v for k, v in self.kubelet.runner.describe().items()},
        }

    def publish_endpoints(self, urls: dict[str, str]) -> None:
        """Record the HTTP URLs and write ``<node dir>/endpoints.json`` for orchestrators."""
        self._urls = dict(urls)
        self.kubelet_port = urlsplit(urls.get("http", "")).port or 0
        path = self.settings.node_dir / "endpoints.json"
        path.write_text(json.dumps(self.endpoints(), indent=1) + "\n")

    def status(self) -> dict[str, Any]:
        return {
            "node": self.settings.name,
            "runner": self.kubelet.runner.kind,
            "plugins": self.plugins.registered(),
            "dra_drivers": self.dra.registered() if self.dra is not None else [],
            "kubelet_restarts": self.plugins.restarts,
            "devices": self.table.snapshot(),
            "node_status": node_status(self.settings, self.table),
            "pods": self.kubelet.snapshot(),
            "syncs": self.syncs,
            "events": self.events.status(),
            "endpoints": self.endpoints(),
        }


def _kmod(settings: NodeSimSettings) -> Path | None:
    return Path(settings.kmod_socket) if settings.kmod_socket else None


class _NoApi:
    """Stands in when the node runs without an API (tests of the kubelet parts)."""

    async def write_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        return None

    async def confirm_pod_deletion(self, namespace: str, name: str) -> None:
        return None

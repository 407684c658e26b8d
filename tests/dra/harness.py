"""A DRA node in one test: the API emulator, a simulated DRA node (plain processes), the sim
scheduler and the DRA driver, all over their real sockets (gRPC, HTTP), NATS from the test's
server."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare_common import dra
from gpushare_common.adapters.kube import NotFound, resource_path
from gpushare_common.settings import CommonSettings, HttpSettings, KubeSettings, LogSettings, NatsSettings, NodeSettings
from gpushare_common.vendors import load_vendor_table
from gpushare_dra_driver.app import Service
from gpushare_dra_driver.settings import DraSettings
from gpushare_sim.fakegpu import vendor
from gpushare_sim.node.adapters.kube import SimKube
from gpushare_sim.node.adapters.runners import ProcessRunner
from gpushare_sim.node.app import NodeSim
from gpushare_sim.node.settings import NodeSimSettings
from gpushare_sim.node.testing import running_node, short_sim_dir, wait_until
from gpushare_sim.scheduler import Scheduler

from tests.support.kubeapi import KubeApi

TOOLS = Path(__file__).resolve().parents[2] / "sim" / "tools"
Obj = dict[str, Any]


def driver_settings(node_dir: Path, **extra: Any) -> DraSettings:
    """The driver of the test's node (its vendor table is the built-in one: NVIDIA with MPS, whose
    control daemon is the sim's stand-in)."""
    settings: dict[str, Any] = {"mps_command": vendor.MPS_STAND_IN, **extra}
    return DraSettings(registry_dir=str(node_dir / "plugins_registry"), plugin_dir=str(node_dir / "plugins" / "dra"),
                       cdi_dir=str(node_dir / "cdi"), device_plugin_dir=str(node_dir / "device-plugins"),
                       runtime_config=str(node_dir / "runtime.json"), host_root=str(node_dir),
                       device_root=str(node_dir), isolation_dir=str(node_dir / "isolation"),
                       card_memory_mib={"nvidia.com/gpu": "16384"}, poll_s=0.1, backoff_min_s=0.1, **settings)


def common(node: str, kubeconfig: Path, nats: NatsSettings) -> CommonSettings:
    return CommonSettings(nats=nats, http=HttpSettings("127.0.0.1", 0), log=LogSettings(),
                          node=NodeSettings(node), kube=KubeSettings(kubeconfig=str(kubeconfig)))


@dataclass
class DraNode:
    kube: SimKube
    sim: NodeSim
    driver: Service
    scheduler: Scheduler
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.sim.settings.name

    async def create(self, path: str, body: Obj) -> Obj:
        return await self.kube.create_object(path, body)

    async def classes(self) -> None:
        for name in dra.DEVICE_CLASSES:
            await self.create(resource_path("deviceclasses"), dra.device_class(name))

    async def template(self, name: str, request: Obj, namespace: str = "default") -> None:
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}}}
        await self.create(resource_path("resourceclaimtemplates", namespace), body)

    async def pod(self, name: str, template: str, command: list[str] | None = None) -> Obj:
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                "spec": {"restartPolicy": "Never", "resourceClaims": [{"name": "gpu",
                                                                      "resourceClaimTemplateName": template}],
                         "containers": [{"name": "main", "image": "busybox",
                                         "command": command or ["sleep", "3600"],
                                         "resources": {"claims": [{"name": "gpu"}]}}]}}
        return await self.kube.create_pod("default", body)

    async def claims(self, namespace: str = "default") -> list[Obj]:
        items, _ = await self.kube.list_objects(resource_path("resourceclaims", namespace))
        return items

    async def phase(self, name: str) -> str:
        try:
            return str((await self.kube.get_pod("default", name)).get("status", {}).get("phase", ""))
        except NotFound:
            return "gone"

    async def slice_devices(self) -> list[Obj]:
        items = await self.kube.list_resource_slices(f"spec.nodeName={self.name}")
        return [d for s in items for d in s["spec"].get("devices", [])]

    async def running(self, name: str) -> None:
        async def probe() -> bool:
            phase = await self.phase(name)
            assert phase != "Failed", f"pod {name} failed"
            return phase == "Running"

        await wait_until(probe, 30, f"pod {name} Running")


@asynccontextmanager
async def dra_node(kube_api: KubeApi, nats: NatsSettings, gpus: int = 2, **driver: Any) -> AsyncIterator[DraNode]:
    sim_dir = short_sim_dir()
    stop = asyncio.Event()
    settings = NodeSimSettings(name="dra-node", sim_dir=sim_dir, gpus=gpus, containerd="none", dra=True,
                               kubeconfig=str(kube_api.kubeconfig), sync_interval_s=0.05)
    kubeconfig = str(kube_api.kubeconfig)
    try:
        async with AsyncExitStack() as stack, running_node(settings, SimKube.from_kubeconfig(kubeconfig),
                                                           ProcessRunner([TOOLS])) as sim:
            vendors = load_vendor_table(str(settings.node_dir / "runtime.json"))
            service = Service(common(settings.name, kube_api.kubeconfig, nats), driver_settings(settings.node_dir,
                              **driver), vendors)
            await service.start()
            stack.push_async_callback(service.close)
            scheduler = Scheduler(SimKube.from_kubeconfig(kubeconfig), 0.05)
            node = DraNode(SimKube.from_kubeconfig(kubeconfig), sim, service, scheduler)
            assert sim.dra is not None
            node.tasks = [asyncio.create_task(sim.sync_loop(stop)), asyncio.create_task(sim.node_status_loop()),
                          asyncio.create_task(sim.dra.run(stop, sim.retry_unprepare)),
                          asyncio.create_task(scheduler.run(stop))]
            yield node
            stop.set()
            for task in node.tasks:
                task.cancel()
            await asyncio.gather(*node.tasks, return_exceptions=True)
            for api in (scheduler.api, sim.api):
                await api.close()  # type: ignore[union-attr]
            await node.kube.close()
    finally:
        shutil.rmtree(sim_dir, ignore_errors=True)

"""A node for the solver's integration tests: pods in the API emulator whose containers are
real runc containers in a private containerd, the kubelet's pod-resources API (a stand-in
serving the real gRPC API) naming the devices each pod was allocated, and a NATS client
publishing the detector's events."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from gpushare_common.adapters.kube import Conflict, Kube, Retryable
from gpushare_common.bus import Bus
from gpushare_common.events import Event
from gpushare_common.retry import retry
from gpushare_common.settings import (
    CommonSettings,
    HttpSettings,
    KubeSettings,
    LogSettings,
    NatsSettings,
    NodeSettings,
)
from gpushare_sim.containerd import Containerd
from gpushare_solver.settings import SolverSettings

from tests.support.kubelet import Kubelet

NAMESPACE = "k8s.io"


def common_settings(nats: NatsSettings, kubeconfig: Path, node: str) -> CommonSettings:
    return CommonSettings(nats=nats, http=HttpSettings(host="127.0.0.1", port=0), log=LogSettings(),
                          node=NodeSettings(name=node), kube=KubeSettings(kubeconfig=str(kubeconfig)))


def solver_settings(ctrd: Containerd, kubelet: Kubelet, **overrides: object) -> SolverSettings:
    values: dict[str, object] = {"containerd_address": str(ctrd.address),
                                 "pod_resources_socket": str(kubelet.socket),
                                 "containerd_namespace": NAMESPACE, "ack_wait_s": 2.0,
                                 "retry_first_s": 0.05, "retry_max_s": 0.5}
    values.update(overrides)
    return SolverSettings(**values)  # type: ignore[arg-type]


def pod_body(name: str, node: str, containers: list[str], requests: dict[str, str] | None = None,
             priority: int = 0) -> dict[str, object]:
    resources = {"requests": requests, "limits": requests} if requests else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "priority": priority, "containers": [
            {"name": f"c{i}", "image": "busybox", "resources": resources} for i in range(len(containers))]},
    }


def container_statuses(containers: list[str]) -> dict[str, object]:
    return {"status": {"phase": "Running", "containerStatuses": [
        {"name": f"c{i}", "containerID": f"containerd://{cid}", "ready": True, "restartCount": 0,
         "image": "busybox", "imageID": "", "state": {"running": {}}}
        for i, cid in enumerate(containers)]}}


class World:
    def __init__(self, ctrd: Containerd, rootfs: Path, kube: Kube, bus: Bus, node: str, kubelet: Kubelet) -> None:
        self.ctrd, self.rootfs, self.kube, self.bus, self.node = ctrd, rootfs, kube, bus, node
        self.kubelet = kubelet

    def start_container(self, container_id: str) -> None:
        self.ctrd.run(self.rootfs, container_id, "/bin/sleep", "3600", detach=True, namespace=NAMESPACE)

    async def add_pod(self, key: str, containers: list[str], requests: dict[str, str] | None = None,
                      priority: int = 0, devices: dict[str, list[str]] | None = None) -> None:
        """A pod bound to the node whose containers run (a long sleep) in containerd; the kubelet
        gave its first container ``devices`` (resource -> IDs), and one device per unit of each
        gpushare resource it requests (``vmem-<i>``)."""
        namespace, name = key.split("/")
        self.kubelet.admit(key, "c0")
        for resource, count in (requests or {}).items():
            if resource.startswith("gpushare/"):
                stem = resource.removeprefix("gpushare/")
                self.kubelet.allocate(key, "c0", resource, [f"{stem}-{name}-{i}" for i in range(int(count))])
        for resource, found in (devices or {}).items():
            self.kubelet.allocate(key, "c0", resource, found)
        for container_id in containers:
            self.start_container(container_id)
        body = pod_body(name, self.node, containers, requests, priority)

        async def create() -> None:
            # a request the API did not answer in time is asked again, as the services do (Retryable);
            # one that was applied before its answer was lost is there already
            with contextlib.suppress(Conflict):
                await self.kube.create_pod(namespace, body)

        await retry(create, (Retryable,), "create the pod", deadline_s=60, pod=key)
        await retry(lambda: self.kube.patch_pod_status(namespace, name, container_statuses(containers),
                                                       strategic=False),
                    (Retryable,), "patch the pod's status", deadline_s=60, pod=key)  # fmt: skip

    async def pod_exists(self, key: str) -> bool:
        from gpushare_common.adapters.kube import NotFound

        namespace, name = key.split("/")
        try:
            await self.kube.get_pod(namespace, name)
        except NotFound:
            return False
        return True

    def task_status(self, container_id: str) -> str:
        listed = self.ctrd.ctr("task", "ls", namespace=NAMESPACE).stdout.splitlines()[1:]
        for line in listed:
            parts = line.split()
            if parts and parts[0] == container_id:
                return parts[-1]
        return ""

    async def publish(self, kind: str, event: Event) -> None:
        await self.bus.publish_persistent(self.bus.subjects.event(self.node, kind), event)


@contextlib.asynccontextmanager
async def client_bus(nats: NatsSettings) -> AsyncIterator[Bus]:
    bus = Bus(nats, "test-detector")
    await bus.connect()
    await bus.wait_for_stream()
    try:
        yield bus
    finally:
        await bus.drain()

"""A real kubelet pod-resources v1 gRPC server on a unix socket, in threads: the runtime asks it
(a blocking call from the test's own thread, or from a runtime process) which devices a
container was allocated. Tests allocate devices to containers with :meth:`Kubelet.allocate`."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2 as pr
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2_grpc as pr_grpc

# (namespace, pod) -> container -> resource -> device ids ("" -> the CDI devices of its claims)
Table = dict[tuple[str, str], dict[str, dict[str, list[str]]]]
CLAIMS = ""


def _container(name: str, held: dict[str, list[str]]) -> pr.ContainerResources:
    devices = [pr.ContainerDevices(resource_name=r, device_ids=i) for r, i in sorted(held.items()) if r != CLAIMS]
    claims = [pr.DynamicResource(claim_name="claim", claim_namespace="", claim_resources=[
        pr.ClaimResource(cdi_devices=[pr.CDIDevice(name=c) for c in held[CLAIMS]])])] if held.get(CLAIMS) else []
    return pr.ContainerResources(name=name, devices=devices, dynamic_resources=claims)


def _pod(key: tuple[str, str], containers: dict[str, dict[str, list[str]]]) -> pr.PodResources:
    return pr.PodResources(namespace=key[0], name=key[1],
                           containers=[_container(c, held) for c, held in containers.items()])


@dataclass
class _Lister(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    table: Table = field(default_factory=dict)
    calls: int = 0

    def List(self, request: object, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        self.calls += 1
        return pr.ListPodResourcesResponse(pod_resources=[_pod(k, v) for k, v in self.table.items()])

    def Get(self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext) -> pr.GetPodResourcesResponse:
        self.calls += 1
        key = (request.pod_namespace, request.pod_name)
        if key not in self.table:
            context.abort(grpc.StatusCode.NOT_FOUND, f"pod {key[0]}/{key[1]} not found")
        return pr.GetPodResourcesResponse(pod_resources=_pod(key, self.table[key]))


@dataclass
class Kubelet:
    socket: Path
    lister: _Lister

    def allocate(self, key: str, container: str, resource: str, devices: list[str]) -> None:
        """The kubelet admitted pod ``key`` (``ns/name``) and gave ``container`` these devices."""
        namespace, name = key.split("/")
        self.lister.table.setdefault((namespace, name), {}).setdefault(container, {})[resource] = list(devices)

    def claim(self, key: str, container: str, cdi_devices: list[str]) -> None:
        """The kubelet prepared a resource claim of pod ``key`` for ``container``: its CDI devices."""
        self.allocate(key, container, CLAIMS, cdi_devices)

    def admit(self, key: str, container: str) -> None:
        """A pod whose container was allocated nothing."""
        namespace, name = key.split("/")
        self.lister.table.setdefault((namespace, name), {}).setdefault(container, {})


@contextlib.contextmanager
def serve_kubelet(socket: Path | None = None) -> Iterator[Kubelet]:
    """The server on ``socket`` (default: a short path of its own, removed after)."""
    with contextlib.ExitStack() as stack:
        if socket is None:
            socket = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kubelet-"))) / "kubelet.sock"
        yield stack.enter_context(_serving(socket))


@contextlib.contextmanager
def _serving(socket: Path) -> Iterator[Kubelet]:
    lister = _Lister()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pr_grpc.add_PodResourcesListerServicer_to_server(lister, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield Kubelet(socket, lister)
    finally:
        server.stop(grace=None).wait()


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    """The kubelet's pod-resources API: which devices each container was allocated."""
    with serve_kubelet() as server:
        yield server

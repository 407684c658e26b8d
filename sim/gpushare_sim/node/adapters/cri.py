"""A client of a container runtime's CRI (``runtime.v1`` RuntimeService and ImageService) on its
unix socket, as the kubelet calls it: pod sandboxes, containers, their states, image presence.

Requests and replies are the API's messages (built by :mod:`gpushare_sim.node.adapters.crirunner`);
errors are :class:`CriError` (:class:`CriNotFound`, :class:`CriUnavailable`, :class:`CriMissing`)
naming the call;
no gRPC exception escapes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from gpushare_common.adapters.kubeletapi import cri_runtime_v1_pb2 as cri
from gpushare_common.adapters.kubeletapi import cri_runtime_v1_pb2_grpc as cri_grpc

REQUEST_TIMEOUT_S = 120.0  # the kubelet's --runtime-request-timeout (2 minutes)
STATUS_TIMEOUT_S = 10.0


class CriError(Exception):
    def __init__(self, call: str, reason: str) -> None:
        self.call = call
        self.reason = reason
        super().__init__(f"CRI {call}: {reason}")


class CriNotFound(CriError):
    """No such sandbox, container or image."""


class CriUnavailable(CriError):
    """The runtime did not answer: socket missing, not initialized yet, or the call timed out."""


class CriMissing(CriError):
    """The socket serves no CRI runtime.v1 (containerd's CRI plugin is off or failed to load)."""


@dataclass(frozen=True, slots=True)
class ContainerStatus:
    state: str  # CONTAINER_CREATED, CONTAINER_RUNNING, CONTAINER_EXITED or CONTAINER_UNKNOWN
    exit_code: int
    reason: str
    message: str

    @property
    def exited(self) -> bool:
        return self.state == "CONTAINER_EXITED"


class CriClient:
    """One runtime's CRI; ``open()`` inside the event loop, ``close()`` when done."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel: grpc.aio.Channel | None = None
        self._runtime: cri_grpc.RuntimeServiceStub | None = None
        self._images: cri_grpc.ImageServiceStub | None = None

    def open(self) -> None:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.address}")
            self._runtime = cri_grpc.RuntimeServiceStub(self._channel)
            self._images = cri_grpc.ImageServiceStub(self._channel)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._runtime = self._images = None

    async def version(self) -> str:
        """``<runtime> <version> (CRI <api version>)``; :class:`CriUnavailable` until it is initialized."""
        reply = await self._call(self._rt().Version, cri.VersionRequest(version="v1"), "Version", STATUS_TIMEOUT_S)
        return f"{reply.runtime_name} {reply.runtime_version} (CRI {reply.runtime_api_version})"

    async def image_present(self, image: str) -> bool:
        request = cri.ImageStatusRequest(image=cri.ImageSpec(image=image))
        reply = await self._call(self._img().ImageStatus, request, f"ImageStatus {image}", STATUS_TIMEOUT_S)
        return reply.HasField("image")

    async def run_pod_sandbox(self, config: Any, handler: str) -> str:
        request = cri.RunPodSandboxRequest(config=config, runtime_handler=handler)
        what = f"RunPodSandbox {config.metadata.namespace}/{config.metadata.name}"
        return str((await self._call(self._rt().RunPodSandbox, request, what)).pod_sandbox_id)

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        request = cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id)
        await self._call(self._rt().StopPodSandbox, request, f"StopPodSandbox {sandbox_id[:12]}")

    async def remove_pod_sandbox(self, sandbox_id: str) -> None:
        request = cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id)
        await self._call(self._rt().RemovePodSandbox, request, f"RemovePodSandbox {sandbox_id[:12]}")

    async def create_container(self, sandbox_id: str, config: Any, sandbox_config: Any) -> str:
        request = cri.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox_config)
        what = f"CreateContainer {config.metadata.name} in {sandbox_id[:12]}"
        return str((await self._call(self._rt().CreateContainer, request, what)).container_id)

    async def start_container(self, container_id: str) -> None:
        request = cri.StartContainerRequest(container_id=container_id)
        await self._call(self._rt().StartContainer, request, f"StartContainer {container_id[:12]}")

    async def stop_container(self, container_id: str, timeout_s: int = 0) -> None:
        """The stop signal, then SIGKILL after ``timeout_s`` (0: SIGKILL at once); returns once it exited."""
        request = cri.StopContainerRequest(container_id=container_id, timeout=timeout_s)
        await self._call(self._rt().StopContainer, request, f"StopContainer {container_id[:12]}")

    async def remove_container(self, container_id: str) -> None:
        request = cri.RemoveContainerRequest(container_id=container_id)
        await self._call(self._rt().RemoveContainer, request, f"RemoveContainer {container_id[:12]}")

    async def container_states(self) -> dict[str, str]:
        """Every container's state by id (the kubelet's relist)."""
        reply = await self._call(self._rt().ListContainers, cri.ListContainersRequest(), "ListContainers",
                                 STATUS_TIMEOUT_S)  # fmt: skip
        return {c.id: cri.ContainerState.Name(c.state) for c in reply.containers}

    async def container_status(self, container_id: str) -> ContainerStatus:
        request = cri.ContainerStatusRequest(container_id=container_id)
        reply = await self._call(self._rt().ContainerStatus, request, f"ContainerStatus {container_id[:12]}",
                                 STATUS_TIMEOUT_S)  # fmt: skip
        status = reply.status
        return ContainerStatus(cri.ContainerState.Name(status.state), int(status.exit_code), status.reason,
                               status.message)  # fmt: skip

    # -- plumbing -------------------------------------------------------------------------------

    def _rt(self) -> cri_grpc.RuntimeServiceStub:
        if self._runtime is None:
            raise CriUnavailable("call", f"client of {self.address} not opened")
        return self._runtime

    def _img(self) -> cri_grpc.ImageServiceStub:
        if self._images is None:
            raise CriUnavailable("call", f"client of {self.address} not opened")
        return self._images

    async def _call(self, rpc: Callable[..., Awaitable[Any]], request: Any, what: str,
                    timeout_s: float = REQUEST_TIMEOUT_S) -> Any:  # fmt: skip
        try:
            return await rpc(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise _translate(err, what, self.address) from None


def _translate(err: grpc.aio.AioRpcError, what: str, address: str) -> CriError:
    code, detail = err.code(), err.details() or ""
    if code == grpc.StatusCode.NOT_FOUND:
        return CriNotFound(what, detail)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return CriMissing(what, f"{address} serves no CRI runtime.v1: {detail}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or "not initialized" in detail:
        return CriUnavailable(what, f"{address}: {code.name} {detail}")
    return CriError(what, f"{code.name} {detail}")

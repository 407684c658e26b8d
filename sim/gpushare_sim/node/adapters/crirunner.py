"""Containers through containerd's CRI plugin, the way the kubelet runs them.

One pod sandbox per pod (host network, the container's own pid namespace, the pod's IPC; the
runtime handler's cgroup parent ``/kubepods/besteffort/pod<uid>``), made before the pod's first
container with the pod's labels and annotations; then each container is created in it with the
Allocate response's devices, mounts, envs and annotations in its ``ContainerConfig`` and started.
containerd builds the OCI spec: its own identity keys (``io.kubernetes.cri.*``) and, of the pod's
and the container's annotations, only those its runtime handler's ``pod_annotations`` and
``container_annotations`` allow. A restart is a new container from the same config (the next
attempt) in the same sandbox; exits are seen by relisting the containers, as the kubelet's PLEG
does. Logs are in the CRI format under ``<node>/pods/<namespace>_<pod>_<uid>/<container>/<attempt>.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare_common.adapters.kubeletapi import cri_runtime_v1_pb2 as cri
from gpushare_common.retry import Backoff, Stopped, retry

from gpushare_sim.node.adapters.cri import CriClient, CriError, CriNotFound
from gpushare_sim.node.adapters.runners import RunnerError
from gpushare_sim.node.model import ContainerSpec, LogFile, PodDef, Started

log = logging.getLogger("gpushare_sim.node.cri")

RELIST_S = 0.25  # the kubelet's PLEG relists every second; shortened, as the restart back-off is
SANDBOX_REMOVAL_S = 60.0
GONE_EXIT_CODE = 137  # a container removed behind the kubelet's back: as killed
CGROUP_ROOT = Path("/sys/fs/cgroup")
POD_LABELS = ("io.kubernetes.pod.name", "io.kubernetes.pod.namespace", "io.kubernetes.pod.uid")
CONTAINER_NAME_LABEL = "io.kubernetes.container.name"
RESTART_COUNT = "io.kubernetes.container.restartCount"  # the kubelet's; containerd's filter drops it


def _namespaces() -> Any:
    return cri.NamespaceOption(network=cri.NODE, pid=cri.CONTAINER, ipc=cri.POD)


def pod_labels(pod: PodDef) -> dict[str, str]:
    return dict(zip(POD_LABELS, (pod.name, pod.namespace, pod.uid), strict=True))


def cgroup_parent(pod: PodDef) -> str:
    return f"/kubepods/besteffort/pod{pod.uid or pod.key.replace('/', '_')}"


def sandbox_config(pod: PodDef, log_dir: Path) -> Any:
    """The pod as the kubelet describes it to the runtime (host network: no hostname of its own)."""
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=0),
        log_directory=str(log_dir),
        labels={**pod.labels, **pod_labels(pod)},
        annotations=pod.annotations,
        linux=cri.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent(pod),
            security_context=cri.LinuxSandboxSecurityContext(namespace_options=_namespaces())),
    )  # fmt: skip


def container_config(spec: ContainerSpec, image: str) -> Any:
    """One container as the kubelet creates it, with the Allocate response in it."""
    return cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name=spec.name, attempt=spec.attempt),
        image=cri.ImageSpec(image=image),
        command=spec.args,
        envs=[cri.KeyValue(key=k, value=v) for k, v in spec.env.items()],
        mounts=[cri.Mount(container_path=m.container_path, host_path=m.host_path, readonly=m.read_only)
                for m in spec.mounts],
        devices=[cri.Device(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
                 for d in spec.devices],
        labels={**pod_labels(spec.pod), CONTAINER_NAME_LABEL: spec.name},
        annotations={RESTART_COUNT: str(spec.attempt), **spec.allocated_annotations},
        log_path=f"{spec.name}/{spec.attempt}.log",
        linux=cri.LinuxContainerConfig(
            security_context=cri.LinuxContainerSecurityContext(namespace_options=_namespaces())),
    )  # fmt: skip


@dataclass
class _Exit:
    event: asyncio.Event = field(default_factory=asyncio.Event)
    code: int = 0

    def finish(self, code: int) -> None:
        if not self.event.is_set():
            self.code = code
            self.event.set()


@dataclass(frozen=True, slots=True)
class _Sandbox:
    id: str
    config: Any
    log_dir: Path
    cgroup_parent: str


class CriRunner:
    """Pods and containers through a runtime's CRI, with one runtime handler."""

    kind = "cri"

    def __init__(self, client: CriClient, image: str, handler: str, log_root: Path, where: dict[str, str]) -> None:
        self._client = client
        self._image = image  # every container's: the node's one image (busybox and the workload tools)
        self._handler = handler
        self._log_root = log_root
        self._where = where  # address, namespace, runtime: for the services that kill tasks
        self._sandboxes: dict[str, asyncio.Future[_Sandbox]] = {}
        self._exits: dict[str, _Exit] = {}
        self._relist: asyncio.Task[None] | None = None

    def describe(self) -> dict[str, str]:
        return {"kind": self.kind, **self._where, "handler": self._handler}

    async def start(self, spec: ContainerSpec) -> Started:
        try:
            sandbox = await self._sandbox(spec.pod)
        except CriError as err:
            raise RunnerError(spec.container_id, f"no pod sandbox: {err.reason}") from err
        config = container_config(spec, self._image)
        try:
            container_id = await self._client.create_container(sandbox.id, config, sandbox.config)
        except CriError as err:
            raise RunnerError(spec.container_id, f"cannot create: {err.reason}") from err
        try:
            await self._client.start_container(container_id)
        except CriError as err:
            with contextlib.suppress(CriError):
                await self._client.remove_container(container_id)
            raise RunnerError(container_id, f"failed to start: {err.reason}") from err
        return Started(container_id, LogFile(sandbox.log_dir / config.log_path, cri=True))

    async def _sandbox(self, pod: PodDef) -> _Sandbox:
        """The pod's sandbox, made once; its making outlives a cancelled start (remove_pod awaits it)."""
        key = pod.uid or pod.key
        made = self._sandboxes.get(key)
        if made is None or (made.done() and (made.cancelled() or made.exception() is not None)):
            made = self._sandboxes[key] = asyncio.ensure_future(self._run_sandbox(pod))
        return await asyncio.shield(made)

    async def _run_sandbox(self, pod: PodDef) -> _Sandbox:
        log_dir = self._log_root / f"{pod.namespace}_{pod.name}_{pod.uid}"
        await asyncio.to_thread(log_dir.mkdir, parents=True, exist_ok=True)
        config = sandbox_config(pod, log_dir)
        sandbox_id = await self._client.run_pod_sandbox(config, self._handler)
        log.info("pod sandbox running pod=%s sandbox=%s handler=%s", pod.key, sandbox_id[:12], self._handler)
        return _Sandbox(sandbox_id, config, log_dir, cgroup_parent(pod))

    async def wait(self, container_id: str) -> int:
        exit_ = self._exits.setdefault(container_id, _Exit())
        if self._relist is None or self._relist.done():
            self._relist = asyncio.create_task(self._relist_loop(), name="cri-relist")
            self._relist.add_done_callback(_log_crash)
        await exit_.event.wait()
        return exit_.code

    async def _relist_loop(self) -> None:
        """Until nobody waits: list the containers, read the exit code of each one that exited."""
        while any(not e.event.is_set() for e in self._exits.values()):
            try:
                states = await self._client.container_states()
                for container_id, exit_ in list(self._exits.items()):
                    if not exit_.event.is_set() and states.get(container_id, "gone") in ("gone", "CONTAINER_EXITED"):
                        exit_.finish(await self._exit_code(container_id))
            except CriError as err:
                log.warning("relist failed (tried again in %s s): %s", RELIST_S, err)
            await asyncio.sleep(RELIST_S)

    async def _exit_code(self, container_id: str) -> int:
        try:
            return (await self._client.container_status(container_id)).exit_code
        except CriNotFound:
            log.warning("container gone container=%s: counted as killed", container_id[:12])
            return GONE_EXIT_CODE

    async def kill(self, container_id: str) -> None:
        try:
            await self._client.stop_container(container_id, 0)
        except CriNotFound:
            pass
        except CriError as err:
            log.warning("CRI stop failed container=%s: %s", container_id[:12], err)

    async def remove(self, container_id: str) -> None:
        await self.kill(container_id)
        try:
            await self._client.remove_container(container_id)
        except CriNotFound:
            pass
        except CriError as err:
            log.warning("CRI remove failed container=%s: %s", container_id[:12], err)
        exit_ = self._exits.pop(container_id, None)
        if exit_ is not None:
            exit_.finish(GONE_EXIT_CODE)

    async def remove_pod(self, pod_uid: str) -> None:
        """Stop and remove the pod's sandbox (and any container left in it), its logs and cgroup."""
        made = self._sandboxes.pop(pod_uid, None)
        if made is None:
            return
        try:
            sandbox = await made
        except CriError:
            return  # never made: nothing to remove
        await self._remove_sandbox(sandbox.id)
        await asyncio.to_thread(shutil.rmtree, sandbox.log_dir, True)
        await asyncio.to_thread(remove_cgroup, sandbox.cgroup_parent)

    async def _remove_sandbox(self, sandbox_id: str) -> None:
        """Stop and remove; tried again while a container it holds is still being started
        (a start cancelled by the kubelet goes on inside containerd until it is done)."""
        async def attempt() -> None:
            with contextlib.suppress(CriNotFound):
                await self._client.stop_pod_sandbox(sandbox_id)
                await self._client.remove_pod_sandbox(sandbox_id)

        try:
            await retry(attempt, (CriError,), "remove pod sandbox", backoff=Backoff(0.1, 2.0),
                        deadline_s=SANDBOX_REMOVAL_S, sandbox=sandbox_id[:12])  # fmt: skip
        except Stopped as err:
            log.warning("pod sandbox left behind sandbox=%s: %s", sandbox_id[:12], err)

    async def close(self) -> None:
        if self._relist is not None:
            self._relist.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._relist
        await self._client.close()


def remove_cgroup(parent: str, root: Path = CGROUP_ROOT) -> None:
    """Remove a pod's (empty) cgroup directory in every hierarchy, as the kubelet does at pod removal."""
    relative = parent.strip("/")
    try:
        hierarchies = [root / e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for path in (root / relative, *(h / relative for h in hierarchies)):
        with contextlib.suppress(OSError):
            path.rmdir()


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task crashed name=%s", task.get_name(), exc_info=task.exception())

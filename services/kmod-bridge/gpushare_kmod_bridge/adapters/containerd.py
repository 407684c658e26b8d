"""Containers from containerd's task list (``ctr task ls``): one pid per running task.

Identity comes from the container's CRI labels or OCI annotations
(containerd's ``io.kubernetes.cri.sandbox-namespace`` / ``-name`` /
``container-name``, or the kubelet labels ``io.kubernetes.pod.namespace`` /
``.name`` / ``io.kubernetes.container.name``), read once per container id
with ``ctr containers info``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ..resolver import ContainerProcs

_IDENTITY_KEYS = (
    ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name",
     "io.kubernetes.cri.container-name"),
    ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name", "io.kubernetes.container.name"),
)


class CtrError(RuntimeError):
    def __init__(self, args: list[str], detail: str) -> None:
        super().__init__(f"{' '.join(args)}: {detail.strip()[-300:]}")


def parse_tasks(text: str) -> list[tuple[str, int]]:
    """``ctr task ls`` output -> (container id, pid) of running or paused tasks."""
    tasks = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[1].isdigit() and int(fields[1]) > 0 \
                and fields[2] in ("RUNNING", "PAUSED", "PAUSING"):
            tasks.append((fields[0], int(fields[1])))
    return tasks


def identity(info: dict[str, Any]) -> tuple[str, str]:
    """(pod key, container name) from ``ctr containers info`` JSON; ("", "") when absent."""
    spec = info.get("Spec") or {}
    for values in (info.get("Labels") or {}, spec.get("annotations") or {}):
        for ns_key, pod_key, container_key in _IDENTITY_KEYS:
            if values.get(ns_key) and values.get(pod_key):
                return f"{values[ns_key]}/{values[pod_key]}", str(values.get(container_key, ""))
    return "", ""


class ContainerdSource:
    name = "containerd"

    def __init__(self, address: str, namespaces: tuple[str, ...] = ("k8s.io",), ctr: str = "ctr",
                 timeout_s: float = 10.0) -> None:
        self.address = address
        self.namespaces = namespaces
        self.ctr = ctr
        self.timeout_s = timeout_s
        self._identities: dict[tuple[str, str], tuple[str, str]] = {}

    async def _run(self, namespace: str, *args: str) -> str:
        argv = [self.ctr, "--address", self.address, "-n", namespace, *args]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise CtrError(argv, f"no answer within {self.timeout_s}s") from None
        if proc.returncode != 0:
            raise CtrError(argv, err.decode(errors="replace"))
        return out.decode(errors="replace")

    async def _identity(self, namespace: str, container_id: str) -> tuple[str, str]:
        key = (namespace, container_id)
        if key not in self._identities:
            info = json.loads(await self._run(namespace, "containers", "info", container_id))
            self._identities[key] = identity(info)
        return self._identities[key]

    async def containers(self) -> list[ContainerProcs]:
        found = []
        for namespace in self.namespaces:
            for container_id, pid in parse_tasks(await self._run(namespace, "task", "ls")):
                pod, container = await self._identity(namespace, container_id)
                found.append(ContainerProcs(container_id, (pid,), pod, container))
        return found

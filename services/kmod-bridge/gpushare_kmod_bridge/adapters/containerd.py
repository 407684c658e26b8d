"""Containers from containerd's task list: one pid per live task (running or paused).

Talks to containerd with the shared gRPC client (:mod:`gpushare_common.adapters.containerd`):
one task listing per namespace at each refresh. Identity comes from the container's CRI labels
or OCI annotations (containerd's ``io.kubernetes.cri.sandbox-namespace`` / ``-name`` /
``container-name``, or the kubelet labels ``io.kubernetes.pod.namespace`` / ``.name`` /
``io.kubernetes.container.name``), read once per container id (one container listing for the
tasks not seen before) and forgotten once its task is gone. Failures are the client's typed
errors (:class:`~gpushare_common.adapters.containerd.ContainerdError`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpushare_common.adapters.containerd import ContainerdClient, Task

from ..resolver import ContainerProcs

_IDENTITY_KEYS = (
    ("io.kubernetes.cri.sandbox-namespace", "io.kubernetes.cri.sandbox-name",
     "io.kubernetes.cri.container-name"),
    ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name", "io.kubernetes.container.name"),
)
LIVE = ("RUNNING", "PAUSED", "PAUSING")  # states whose init pid still names the container's processes


def identity(labels: Mapping[str, str], annotations: Mapping[str, str]) -> tuple[str, str]:
    """(pod key, container name) from a container's labels, else its annotations; ("", "") when absent."""
    for values in (labels, annotations):
        for ns_key, pod_key, container_key in _IDENTITY_KEYS:
            if values.get(ns_key) and values.get(pod_key):
                return f"{values[ns_key]}/{values[pod_key]}", str(values.get(container_key, ""))
    return "", ""


def live(tasks: list[Task]) -> list[Task]:
    """The tasks with a process to resolve: running or paused, with a pid."""
    return [t for t in tasks if t.pid > 0 and t.status in LIVE]


class ContainerdSource:
    name = "containerd"

    def __init__(self, address: str, namespaces: tuple[str, ...] = ("k8s.io",), timeout_s: float = 10.0) -> None:
        self.namespaces = namespaces
        self.client = ContainerdClient(address, call_timeout_s=timeout_s)
        self._identities: dict[tuple[str, str], tuple[str, str]] = {}

    async def close(self) -> None:
        await self.client.close()

    async def _learn(self, namespace: str, container_ids: list[str]) -> None:
        """Read the identity of containers not seen before, in one listing (a container deleted
        since its task was listed is simply not there, and its task is skipped)."""
        filters = [f'id=="{container_id}"' for container_id in container_ids]
        for container in await self.client.containers(*filters, namespace=namespace):
            self._identities[namespace, container.id] = identity(container.labels, container.annotations)

    async def containers(self) -> list[ContainerProcs]:
        self.client.open()  # no-op once open; the channel belongs to the running loop
        found, listed = [], set()
        for namespace in self.namespaces:
            tasks = live(await self.client.tasks(namespace))
            listed |= {(namespace, t.container_id) for t in tasks}
            unknown = [t.container_id for t in tasks if (namespace, t.container_id) not in self._identities]
            if unknown:
                await self._learn(namespace, unknown)
            for task in tasks:
                known = self._identities.get((namespace, task.container_id))
                if known is not None:
                    found.append(ContainerProcs(task.container_id, (task.pid,), *known))
        self._identities = {key: value for key, value in self._identities.items() if key in listed}
        return found

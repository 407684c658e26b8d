"""Pytest fixture: a Kubernetes API emulator on a free port, with a kubeconfig and a client.

Use it from a conftest.py:

    from tests.support.kubeapi import kube_api  # noqa: F401  (the fixture)

    def test_something(kube_api):
        core = kubernetes.client.CoreV1Api(kube_api.client)
        core.create_namespaced_pod("default", pod_manifest("p1", node="node-1"))
        kube_api.seed("pods", "bulk", (pod_manifest(f"p{i}") for i in range(10_000)))

Services get `kube_api.kubeconfig` (a path) or `kube_api.url`. The store lives on
the server's thread: reach it only through `kube_api.seed()` or
`kube_api.server.call(fn, *args)`.

`start_kube_api()` gives the same object outside pytest (a context manager).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from gpushare_sim.apiserver import (
    ApiServer,
    ApiSettings,
    ServerSettings,
    Store,
    TlsFiles,
    namespaces,
    objects,
    write_kubeconfig,
)
from gpushare_sim.apiserver.kinds import KINDS, NAMESPACES


@dataclass
class KubeApi:
    """A running emulator: where it is, how to reach it, and its in-memory store."""

    url: str
    kubeconfig: Path
    client: kubernetes.client.ApiClient
    server: ApiServer

    @property
    def store(self) -> Store:
        return self.server.store

    def new_client(self) -> kubernetes.client.ApiClient:
        """A fresh client (own connection pool), e.g. for a second thread."""
        return client_for(self.kubeconfig)

    def namespaces(self, *names: str) -> None:
        """Create these namespaces (those that do not exist yet), as `kubectl create namespace` would."""

        def create_all(store: Store) -> None:
            for name in names:
                if store.get(NAMESPACES, ("", name)) is None:
                    namespaces.create(store, {"metadata": {"name": name}})

        self.server.call(create_all, self.server.store)

    def seed(self, resource: str, namespace: str, bodies: Iterable[dict[str, Any]]) -> int:
        """Create many objects at once without HTTP (e.g. 10,000 pods for a benchmark), in
        `namespace` (created when missing). Watchers see them as usual; returns the
        resourceVersion after the last one."""
        kind = next(k for k in KINDS if k.plural == resource)
        items = list(bodies)
        if kind.namespaced:
            self.namespaces(namespace)

        def create_all(store: Store) -> int:
            for body in items:
                objects.create(store, kind, namespace if kind.namespaced else "", body)
            return store.rv

        return self.server.call(create_all, self.server.store)


def pod_manifest(
    name: str, node: str = "", labels: dict[str, str] | None = None, **annotations: str
) -> dict[str, Any]:
    """A minimal valid pod body: one container `main`, optionally bound to a node."""
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {"name": name, "labels": labels or {}}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def client_for(kubeconfig: Path) -> kubernetes.client.ApiClient:
    """An official client configured from a kubeconfig file."""
    api: kubernetes.client.ApiClient = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    return api


@contextlib.contextmanager
def start_kube_api(
    settings: ApiSettings | None = None, directory: Path | None = None, namespaces: Iterable[str] = (),
    tls: TlsFiles | None = None, ca: Path | None = None,
) -> Iterator[KubeApi]:
    """Start the emulator in a background thread (with `namespaces` besides the system ones;
    over HTTPS with `tls`, its kubeconfig naming `ca`); stop it and close the client on exit."""
    server = ApiServer(ServerSettings(api=settings or ApiSettings(), tls=tls))
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kubeapi-")))
        server.start_thread()
        stack.callback(server.stop)
        path = write_kubeconfig(directory / "kubeconfig", server.url, ca)
        client = client_for(path)
        stack.callback(client.close)
        api = KubeApi(server.url, path, client, server)
        api.namespaces(*namespaces)
        yield api


@pytest.fixture
def kube_api(tmp_path: Path) -> Iterator[KubeApi]:
    """A fresh API emulator for one test: only the system namespaces exist, as in a new cluster."""
    with start_kube_api(directory=tmp_path) as api:
        yield api


def kube_api_with(*namespaces: str) -> Any:
    """The `kube_api` fixture with these namespaces created too (a namespaced object needs its
    namespace, as on a cluster). In a conftest or module: `kube_api = kube_api_with("ml", "dev")`."""

    @pytest.fixture
    def kube_api(tmp_path: Path) -> Iterator[KubeApi]:
        with start_kube_api(directory=tmp_path, namespaces=namespaces) as api:
            yield api

    return kube_api

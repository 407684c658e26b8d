"""Pytest fixture: a Kubernetes API emulator on a free port, with a kubeconfig and a client.

Use it from a conftest.py:

    from tests.support.kubeapi import kube_api  # noqa: F401  (the fixture)

    def test_something(kube_api):
        core = kubernetes.client.CoreV1Api(kube_api.client)
        ...

`start_kube_api()` gives the same object outside pytest (a context manager).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kubernetes
import pytest
from gpushare_sim.apiserver import ApiServer, ApiSettings, ServerSettings, Store, write_kubeconfig


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


def client_for(kubeconfig: Path) -> kubernetes.client.ApiClient:
    """An official client configured from a kubeconfig file."""
    api: kubernetes.client.ApiClient = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    return api


@contextlib.contextmanager
def start_kube_api(
    settings: ApiSettings | None = None, directory: Path | None = None
) -> Iterator[KubeApi]:
    """Start the emulator in a background thread; stop it and close the client on exit."""
    server = ApiServer(ServerSettings(api=settings or ApiSettings()))
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kubeapi-")))
        server.start_thread()
        stack.callback(server.stop)
        path = write_kubeconfig(directory / "kubeconfig", server.url)
        client = client_for(path)
        stack.callback(client.close)
        yield KubeApi(server.url, path, client, server)


@pytest.fixture
def kube_api(tmp_path: Path) -> Iterator[KubeApi]:
    """A fresh, empty API emulator for one test."""
    with start_kube_api(directory=tmp_path) as api:
        yield api

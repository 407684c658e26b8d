"""Detector fixtures: a real pod-resources gRPC server on a temporary unix socket, the API emulator."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.detector.podres_server import PodResourcesServer, serve_pod_resources
from tests.support.kubeapi import kube_api_with

kube_api = kube_api_with("dev", "n")  # the namespaces these tests put pods in


@pytest.fixture
async def podresources(tmp_path: Path) -> AsyncIterator[PodResourcesServer]:
    async with serve_pod_resources(tmp_path / "kubelet.sock") as server:
        yield server

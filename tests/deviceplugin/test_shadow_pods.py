"""Share plugins learn ShadowPods from a real (emulated) Kubernetes API server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from gpushare_common import ids
from gpushare_common.settings import KubeSettings, NatsSettings
from gpushare_deviceplugin.app import Service
from gpushare_deviceplugin.settings import DevicePluginSettings
from kubernetes import client

from tests.support import kubeapi
from tests.support.kubeapi import KubeApi

from .conftest import KEY
from .stubs import KubeletStub
from .test_service import NODE, common_settings

kube_api = kubeapi.kube_api_with("ns", "tenant-a", "dev-y", "elsewhere", "shadow-x", "tenant")
SHARE4 = "gpushare/share-gpu-4"


SYSTEM = "gpushare-system"


def shadow_pod(name: str, spec: int, kind: str = "share", node: str = NODE, namespace: str = SYSTEM) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {ids.LABEL_POD_DESCRIPTION: ids.SHADOW_POD_LABEL_VALUE,
                                "app.kubernetes.io/managed-by": "gpushare-shadow-controller"},
                     "annotations": {ids.ANN_SHARE_SPEC: str(spec), ids.ANN_SHARE_KIND: kind}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "pause"}]},
    }


async def run_pod(core: client.CoreV1Api, body: dict[str, Any]) -> None:
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    await asyncio.to_thread(core.create_namespaced_pod, namespace, body)
    await asyncio.to_thread(core.patch_namespaced_pod_status, name, namespace,
                            {"status": {"phase": "Running"}})


@pytest.fixture
async def service(nats_settings: NatsSettings, settings: DevicePluginSettings,
                  kube_api: KubeApi, kubelet: KubeletStub) -> AsyncIterator[Service]:
    common = dataclasses.replace(common_settings(nats_settings),
                                 kube=KubeSettings(kubeconfig=str(kube_api.kubeconfig)))
    svc = Service(common, dataclasses.replace(settings, spot=False), KEY)
    svc.start_plugins()
    yield svc
    await svc.close()


async def test_running_shadow_pods_become_devices(
        kube_api: KubeApi, kubelet: KubeletStub, service: Service) -> None:
    core = client.CoreV1Api(kube_api.client)
    await run_pod(core, shadow_pod("shadow-x", 4))
    await run_pod(core, shadow_pod("dev-y", 8, "share-dev"))
    await run_pod(core, shadow_pod("elsewhere", 4, node="other-node"))
    await run_pod(core, shadow_pod("mallory", 4, namespace="tenant-a"))  # a tenant's fake ShadowPod
    listed = await kubelet.wait_list(SHARE4, lambda d: len(d) == 4, timeout=10)
    assert sorted(listed) == [f"{SYSTEM}/shadow-x-{i}" for i in range(4)]
    await kubelet.wait_list("gpushare/share-dev-gpu-8", lambda d: len(d) == 8, timeout=10)
    response = await kubelet.allocate(SHARE4, [f"{SYSTEM}/shadow-x-2"])
    annotation = response.container_responses[0].annotations[ids.ANN_DEVICES_FROM + "*"]
    assert json.loads(annotation) == {f"{SYSTEM}/shadow-x/main": {"*": [f"{SYSTEM}/shadow-x-2"]}}
    await asyncio.to_thread(core.delete_namespaced_pod, "shadow-x", SYSTEM,
                            grace_period_seconds=0)
    await kubelet.wait_list(SHARE4, lambda d: not any(h == "Healthy" for h in d.values()),
                            timeout=10)

"""The local cluster runner's API helpers: scenario namespaces, node-bound and unbound tokens."""

from __future__ import annotations

import pytest
from gpushare_sim.run.kubeapi import ApiRefused, ensure_namespace, mint_node_token, mint_token
from kubernetes import client

from tests.support.kubeapi import KubeApi


def test_node_token_for_a_service(kube_api: KubeApi) -> None:
    core = client.CoreV1Api(kube_api.client)
    core.create_node({"metadata": {"name": "gpu-node-1"}})
    minted = mint_node_token(kube_api.kubeconfig, "gpu-node-1", "gpushare-deviceplugin", audiences=["gpushare"])
    again = mint_node_token(kube_api.kubeconfig, "gpu-node-1", "gpushare-deviceplugin", audiences=["gpushare"])
    assert minted.token != again.token and minted.expires.endswith("Z")
    review = client.AuthenticationV1Api(kube_api.client).create_token_review(
        {"spec": {"token": minted.token, "audiences": ["gpushare"]}})  # fmt: skip
    assert review.status.authenticated
    assert review.status.user.username == "system:serviceaccount:gpushare-system:gpushare-deviceplugin"
    assert review.status.user.extra["authentication.kubernetes.io/node-name"] == ["gpu-node-1"]
    with pytest.raises(ApiRefused, match='read node gpu-node-9: 404 nodes "gpu-node-9" not found'):
        mint_node_token(kube_api.kubeconfig, "gpu-node-9", "gpushare-solver")
    with pytest.raises(ApiRefused, match="less than 10 minutes"):
        mint_node_token(kube_api.kubeconfig, "gpu-node-1", "gpushare-solver", expiration_s=60)


def test_unbound_token_for_a_service_that_acts_for_no_node(kube_api: KubeApi) -> None:
    minted = mint_token(kube_api.kubeconfig, "gpushare-console", audiences=["gpushare"])
    assert minted.node == "" and minted.service_account == "gpushare-console"
    review = client.AuthenticationV1Api(kube_api.client).create_token_review(
        {"spec": {"token": minted.token, "audiences": ["gpushare"]}})  # fmt: skip
    assert review.status.authenticated
    assert review.status.user.username == "system:serviceaccount:gpushare-system:gpushare-console"
    assert "authentication.kubernetes.io/node-name" not in (review.status.user.extra or {})


def test_ensure_namespace_is_idempotent(kube_api: KubeApi) -> None:
    ensure_namespace(kube_api.kubeconfig, "sharegpu")
    ensure_namespace(kube_api.kubeconfig, "sharegpu")
    assert client.CoreV1Api(kube_api.client).read_namespace("sharegpu").status.phase == "Active"
    with pytest.raises(ApiRefused, match="create namespace Bad_Name: 422"):
        ensure_namespace(kube_api.kubeconfig, "Bad_Name")

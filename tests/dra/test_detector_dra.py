"""The detector on a DRA node: the CDI devices of gpushare's claims in pod-resources read back
as the owners and borrowers of cards, as on the device-plugin path."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from gpushare_common import dra
from gpushare_common import events as ev
from gpushare_common.adapters.kubeletapi import podresources_v1_pb2 as pr
from gpushare_common.adapters.podresources import _pod_devices
from gpushare_common.pods import PodError, PodKind, PodRules, read_pod
from gpushare_detector.handlers import pod_facts

RULES = PodRules()
UID = str(uuid.uuid4())


def cdi(role: str, card: str) -> str:
    return dra.cdi_device(role, UID, card).qualified


def claim_pod(name: str = "dev", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": name, "uid": f"uid-{name}", "labels": labels or {}},
            "spec": {"nodeName": "n1", "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}],
                     "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
                                    {"name": "side"}]},
            "status": {"phase": "Running"}}


def test_pod_resources_fold_gpushare_claims_cdi_devices() -> None:
    message = pr.PodResources(name="dev", namespace="ml", containers=[pr.ContainerResources(
        name="main", dynamic_resources=[pr.DynamicResource(claim_name="dev-gpu", claim_namespace="ml",
                                                           claim_resources=[pr.ClaimResource(cdi_devices=[
                                                               pr.CDIDevice(name=cdi("exclusive", "GPU-1")),
                                                               pr.CDIDevice(name="nvidia.com/gpu=0")])])])])
    assert _pod_devices(message) == {"main": {dra.CDI_KIND: (cdi("exclusive", "GPU-1"),)}}


def test_claims_are_read_as_the_cards_they_hold() -> None:
    devices = {"main": {dra.CDI_KIND: (cdi("exclusive", "GPU-1"), cdi("spot", "GPU-2"), cdi("share", "GPU-3"),
                                       "gpushare.k8s.io/gpu=garbled")}, "side": {}}
    assert RULES.claimed_devices(devices) == {
        "main": {"nvidia.com/gpu": ("GPU-1",), "gpushare/spot-gpu": ("spot-GPU-2",)}, "side": {}}


def test_a_lendable_dev_machine_on_an_exclusive_claim_is_an_owner() -> None:
    view = read_pod(claim_pod(labels={"gpushare.k8s.io/lendable": "true"}), RULES)
    assert view.kind is PodKind.ORDINARY and view.claims == {"main": ("gpu",)} and view.lendable_label
    (fact,) = pod_facts(view, RULES, "n1", {"main": {dra.CDI_KIND: (cdi("exclusive", "GPU-1"),)}}).values()
    assert isinstance(fact, ev.ReservedEvent) and fact.lendable and fact.devices == ("GPU-1",)
    assert (fact.pod, fact.container, fact.vendor_resource) == ("ml/dev", "main", "nvidia.com/gpu")


def test_a_spot_claim_is_a_borrower_and_a_share_holds_no_card() -> None:
    view = read_pod(claim_pod("borrower"), RULES)
    (fact,) = pod_facts(view, RULES, "n1", {"main": {dra.CDI_KIND: (cdi("spot", "GPU-2"),)}}).values()
    assert isinstance(fact, ev.SpotEvent) and fact.devices == ("spot-GPU-2",) and fact.pod_uid == "uid-borrower"
    assert pod_facts(view, RULES, "n1", {"main": {dra.CDI_KIND: (cdi("share", "GPU-3"),)}}) == {}


def test_malformed_claim_references_are_a_pod_error() -> None:
    body = claim_pod()
    body["spec"]["containers"][0]["resources"]["claims"] = [{"nom": "gpu"}]
    with pytest.raises(PodError, match=r"resources\.claims"):
        read_pod(body, RULES)

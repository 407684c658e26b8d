"""Admission requests for pods, as the API server builds them when validating admission runs.

Pods are defaulted, carry their status, and get the service-account token volume the
ServiceAccount admission plugin adds unless ``automountServiceAccountToken`` is false. The
ShadowPod is the shadow-controller's own template (``gpushare_shadow_controller.template``) with
the settings its Deployment in k8s/base gives it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import yaml
from gpushare_common.mapping import QuotaKey
from gpushare_common.settings import load
from gpushare_shadow_controller.settings import ShadowSettings
from gpushare_shadow_controller.template import shadow_pod

from tests.deploy.admission import Request
from tests.deploy.chart import BASE

NS = "gpushare-system"
SOLVER = f"system:serviceaccount:{NS}:gpushare-solver"
SHADOW_CONTROLLER = f"system:serviceaccount:{NS}:gpushare-shadow-controller"
TENANT = "alice@example.com"
NODE_NAME = "authentication.kubernetes.io/node-name"
USING = "gpushare.k8s.io/Using"

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where PyYAML was built with it


def shipped_docs() -> list[dict[str, Any]]:
    """The objects in k8s/base, a copy of its own for each caller (they edit what they get)."""
    return copy.deepcopy(_parsed_base())


@functools.cache
def _parsed_base() -> list[dict[str, Any]]:
    """Parsed once per process: the module's requests are built from it at import, for every case."""
    return [d for p in sorted(BASE.glob("*.yaml")) if p.name != "kustomization.yaml"
            for d in yaml.load_all(p.read_text(), Loader=_LOADER) if d]  # fmt: skip


def solver_token(node: str) -> dict[str, list[str]]:
    """userInfo.extra of a request made with the solver pod's bound service-account token."""
    return {"authentication.kubernetes.io/pod-name": ["gpushare-solver-x1"],
            "authentication.kubernetes.io/pod-uid": ["6b4c0c8e"], NODE_NAME: [node]}  # fmt: skip


def admitted(pod: dict[str, Any], node: str | None = "node-a", running: bool = True) -> dict[str, Any]:
    """``pod`` as stored by the API server: defaulted, bound to ``node``, with its status."""
    pod = copy.deepcopy(pod)
    meta, spec = pod["metadata"], pod["spec"]
    meta.update({"uid": f"uid-{meta['name']}", "resourceVersion": "100", "creationTimestamp": "2026-01-01T00:00:00Z",
                 "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1"}]})
    for container in spec["containers"]:
        container.setdefault("imagePullPolicy", "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        limits = container.get("resources", {}).get("limits", {})
        if limits:
            container["resources"].setdefault("requests", dict(limits))
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.update({"dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler", "securityContext": {},
                 "enableServiceLinks": True, "priority": 0, "preemptionPolicy": "PreemptLowerPriority"})
    spec.setdefault("serviceAccountName", "default")
    spec["serviceAccount"] = spec["serviceAccountName"]
    spec["tolerations"] = [*spec.get("tolerations", []), *[
        {"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        for t in ("not-ready", "unreachable")]]
    if spec.get("automountServiceAccountToken") is not False:  # the ServiceAccount admission plugin
        spec["volumes"] = [*spec.get("volumes", []), {"name": "kube-api-access-x7k2p", "projected": {
            "sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}}]
        for container in spec["containers"]:
            container["volumeMounts"] = [*container.get("volumeMounts", []), {
                "name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True}]
    if node:
        spec["nodeName"] = node
    pod["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    if node and running:
        pod["status"] |= {"phase": "Running", "hostIP": "10.0.0.7", "hostIPs": [{"ip": "10.0.0.7"}],
                          "podIP": "10.1.0.9", "podIPs": [{"ip": "10.1.0.9"}], "startTime": "2026-01-01T00:00:01Z",
                          "conditions": [{"type": "Ready", "status": "True"},
                                         {"type": "PodScheduled", "status": "True"}],
                          "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0,
                                                 "image": c["image"], "imageID": "", "started": True,
                                                 "state": {"running": {"startedAt": "2026-01-01T00:00:02Z"}}}
                                                for c in spec["containers"]]}  # fmt: skip
    return pod


def tenant_pod(name: str = "inference-1", namespace: str = "team-a", **extra: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": namespace,
                                        "annotations": {"team.example.com/owner": "alice"}},
                           "spec": {"containers": [{"name": "app", "image": "busybox",
                                                    "resources": {"limits": {"gpushare/share-gpu-4": "1"}}}],
                                    "runtimeClassName": "gpushare"}}  # fmt: skip
    pod["metadata"] |= extra
    return pod


def shadow_settings(docs: list[dict[str, Any]] | None = None) -> ShadowSettings:
    """The shadow-controller's settings as its Deployment in k8s/base (or in ``docs``) gives them."""
    docs = docs if docs is not None else shipped_docs()
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-shadow-template"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("controller")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = dict(config["data"]) | {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return load(ShadowSettings, "GPUSHARE_SHADOW_", env)


def template_pod(namespace: str = NS, kind: str = "share", docs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = shadow_pod(QuotaKey(namespace, kind, 4), f"gpushare-shadow-{kind}-4-a1b2c3",
                                     shadow_settings(docs))
    return pod


def create(pod: dict[str, Any], user: str, node: str | None = None) -> Request:
    body = admitted(pod, node=node, running=False)
    del body["status"]["qosClass"]
    return Request("CREATE", body["metadata"]["namespace"], body["metadata"]["name"], user, object=body)


def update(old: dict[str, Any], change: Callable[[dict[str, Any]], None], user: str,
           subresource: str = "", extra: dict[str, list[str]] | None = None) -> Request:
    """An UPDATE whose object is ``old`` changed by ``change`` (plus what every write changes)."""
    new = copy.deepcopy(old)
    change(new)
    new["metadata"]["managedFields"] = [*old["metadata"]["managedFields"],
                                        {"manager": "gpushare", "operation": "Update", "apiVersion": "v1"}]
    return Request("UPDATE", old["metadata"]["namespace"], old["metadata"]["name"], user, object=new,
                   old_object=old, subresource=subresource, extra=extra or {})


def delete(old: dict[str, Any], user: str, extra: dict[str, list[str]] | None = None) -> Request:
    return Request("DELETE", old["metadata"]["namespace"], old["metadata"]["name"], user, old_object=old,
                   extra=extra or {})

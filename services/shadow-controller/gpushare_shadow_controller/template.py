"""The ShadowPod a quota key needs: one container ``main`` holding one real card, sleeping.

When its share kind is capped with MPS (``mps_kinds``, or the profile ``mps`` in
``isolation_profiles``), ``main`` runs NVIDIA's MPS control daemon for the card instead,
on the ShadowPod's own host directories (``<isolation_host_path>/<namespace>_<pod>/{pipe,log,shm}``,
the ones the runtime mounts into each SharePod), sets one share of N as every client's
default, and is Ready only while the daemon answers.  A capped ShadowPod is annotated
with its isolation profile, which tells the device plugin to sign the caps of each share;
a profile other than ``mps`` needs no daemon (the vendor's driver enforces what the
runtime sets from the node's vendor table).
"""

from __future__ import annotations

import secrets
from typing import Any

from gpushare_common import ids, isolation
from gpushare_common.mapping import QuotaKey

from .placement import ANYWHERE, Placement
from .settings import ShadowSettings

MPS = isolation.MPS
# started in the foreground so that the container ends (and restarts) when it dies; the
# defaults bind every client of this card that does not carry its own share's caps
MPS_SCRIPT = """set -eu
nvidia-cuda-mps-control -f &
daemon=$!
trap 'echo quit | nvidia-cuda-mps-control; wait "$daemon"; exit 0' TERM INT
until echo get_default_active_thread_percentage | nvidia-cuda-mps-control >/dev/null 2>&1; do
  kill -0 "$daemon" 2>/dev/null || exit 1
  sleep 0.2
done
echo "set_default_active_thread_percentage $((100 / GPUSHARE_SHARES))" | nvidia-cuda-mps-control
memory=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
echo "set_default_device_pinned_mem_limit 0 $((memory / GPUSHARE_SHARES))M" | nvidia-cuda-mps-control
wait "$daemon"
"""
MPS_PROBE = ["/bin/sh", "-c", "echo get_default_active_thread_percentage | nvidia-cuda-mps-control"]
MPS_MOUNTS = {"pipe": isolation.MPS_PIPE_DIR, "log": isolation.MPS_LOG_DIR, "shm": isolation.SHM_DIR}


def shadow_name(quota: QuotaKey) -> str:
    return f"gpushare-shadow-{quota.kind}-{quota.spec}-{secrets.token_hex(3)}"


def shadow_pod(quota: QuotaKey, name: str, settings: ShadowSettings, placement: Placement = ANYWHERE) -> dict[str, Any]:
    """The ShadowPod for ``quota``; made for SharePods that may run only on some nodes
    (``placement``), it carries their constraints and names them in an annotation."""
    card = {settings.vendor_resource: "1"}
    container: dict[str, Any] = {
        "name": ids.SHADOW_CONTAINER,
        "image": settings.image,
        "resources": {"limits": dict(card), "requests": dict(card)},
    }
    spec: dict[str, Any] = {
        "containers": [container],
        "automountServiceAccountToken": False,  # a pause container needs no API access
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 0,
        "tolerations": settings.tolerations_list(),
    }
    if settings.priority_class:
        spec["priorityClassName"] = settings.priority_class
    if settings.runtime_class:
        spec["runtimeClassName"] = settings.runtime_class
    selector = settings.node_selector_map()
    if selector:
        spec["nodeSelector"] = selector
    annotations = {ids.ANN_SHARE_KIND: quota.kind, ids.ANN_SHARE_SPEC: str(quota.spec)}
    if not placement.anywhere:
        placement.apply(spec)
        annotations[ids.ANN_PLACEMENT] = placement.text
    profile = settings.isolation_of(quota.kind, quota.spec)
    if profile == MPS:
        _run_mps(spec, container, quota, f"{quota.namespace}/{name}", settings)
    if profile:
        annotations[ids.ANN_ISOLATION] = profile
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": quota.namespace,
            "labels": {ids.LABEL_POD_DESCRIPTION: ids.SHADOW_POD_LABEL_VALUE,
                       "app.kubernetes.io/managed-by": "gpushare-shadow-controller"},
            "annotations": annotations,
        },
        "spec": spec,
    }


def _run_mps(spec: dict[str, Any], container: dict[str, Any], quota: QuotaKey, key: str,
             settings: ShadowSettings) -> None:
    """``main`` runs the MPS control daemon on the ShadowPod's host directories."""
    host = isolation.shadow_dir(settings.isolation_host_path, key)
    container.update({
        "image": settings.mps_image,
        "command": ["/bin/sh", "-c", settings.mps_script or MPS_SCRIPT],
        "env": [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": isolation.MPS_PIPE_DIR},
                {"name": "CUDA_MPS_LOG_DIRECTORY", "value": isolation.MPS_LOG_DIR},
                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
                {"name": "GPUSHARE_SHARES", "value": str(quota.spec)}],
        "volumeMounts": [{"name": f"mps-{d}", "mountPath": path} for d, path in MPS_MOUNTS.items()],
        "readinessProbe": {"exec": {"command": MPS_PROBE}, "periodSeconds": 5,
                           "timeoutSeconds": 5, "failureThreshold": 2},
    })
    spec["volumes"] = [{"name": f"mps-{d}", "hostPath": {"path": f"{host}/{d}",
                                                         "type": "DirectoryOrCreate"}}
                       for d in MPS_MOUNTS]

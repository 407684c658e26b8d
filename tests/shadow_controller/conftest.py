"""The API emulator with the namespaces the ShadowPod scenarios use."""

from __future__ import annotations

from tests.support.kubeapi import kube_api_with

kube_api = kube_api_with("ml", "user-1", "user-2")

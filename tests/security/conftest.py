"""The attack suite: each test plays an attacker (a tenant, or one compromised node service)."""

from __future__ import annotations

from tests.solver.conftest import bridge, kube  # noqa: F401  (fixtures)
from tests.support.kubeapi import kube_api_with

kube_api = kube_api_with("apps", "spot", "dev", "kube-system", "mallory", "team-a", "team-b")

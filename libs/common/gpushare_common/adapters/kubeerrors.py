"""The Kubernetes adapter's configuration error, in a module of its own so that a service that never
talks to the API server (the kmod-bridge) can name it without importing the ``kubernetes`` package."""

from __future__ import annotations


class KubeConfigError(ValueError):
    """A kubeconfig or in-cluster configuration that cannot be used: a setting's error, exit 2."""

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"Kubernetes configuration {source}: {reason}")

"""Kubernetes API emulator: enough of the REST API for the official client, state in memory."""

from .app import ApiSettings, build_app
from .server import ApiServer, ServerSettings, kubeconfig, write_kubeconfig
from .store import Store

__all__ = [
    "ApiServer",
    "ApiSettings",
    "ServerSettings",
    "Store",
    "build_app",
    "kubeconfig",
    "write_kubeconfig",
]

"""Kubernetes API emulator: enough of the REST API for the official client, state in memory."""

from .app import ApiSettings, build_app
from .server import ApiServer, ServerSettings, TlsFiles, kubeconfig, write_kubeconfig
from .store import Store

__all__ = [
    "ApiServer",
    "ApiSettings",
    "ServerSettings",
    "Store",
    "TlsFiles",
    "build_app",
    "kubeconfig",
    "write_kubeconfig",
]

"""Where the Kubernetes API is and how to authenticate: a kubeconfig, or the pod's own account.

:func:`load_endpoint` reads, in this order: the kubeconfig named in the settings; the
in-cluster configuration (``KUBERNETES_SERVICE_HOST``/``_PORT`` and the service account's
token and CA under ``/var/run/secrets/kubernetes.io/serviceaccount``); the kubeconfig named
by ``KUBECONFIG`` (its first file) or ``~/.kube/config``.

From a kubeconfig: the current context's cluster (``server``, ``certificate-authority`` or
``-data``, ``insecure-skip-tls-verify``, ``tls-server-name``) and user (``token``,
``tokenFile``, ``client-certificate``/``client-key`` or their ``-data``, ``username``/
``password``). A user with an ``exec`` or ``auth-provider`` plugin is refused with an error
that says what to use instead. Relative paths are relative to the kubeconfig's directory.

A token read from a file (the service account's is rotated by the kubelet) is read again
every minute, as client-go does. Errors are :class:`KubeConfigError`, naming the file and
the field.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0


class KubeConfigError(ValueError):
    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"Kubernetes configuration {source}: {reason}")


@dataclass
class Endpoint:
    """The API server's address, the TLS context to reach it, and the credentials to present."""

    server: str
    ssl_context: ssl.SSLContext | None = None  # None for plain http
    token: str = ""
    token_file: str = ""
    basic: tuple[str, str] | None = None
    source: str = ""
    _read_at: float = field(default=0.0, repr=False)

    def authorization(self) -> str:
        """The ``Authorization`` header's value ("" for none)."""
        if self.token_file and time.monotonic() - self._read_at >= TOKEN_REREAD_S:
            try:
                self.token = Path(self.token_file).read_text().strip()
            except OSError as err:
                if not self.token:
                    raise KubeConfigError(self.source, f"token file {self.token_file}: {err.strerror}") from None
            self._read_at = time.monotonic()
        if self.token:
            return f"Bearer {self.token}"
        if self.basic:
            raw = f"{self.basic[0]}:{self.basic[1]}".encode()
            return "Basic " + base64.b64encode(raw).decode()
        return ""


def load_endpoint(kubeconfig: str = "", environ: dict[str, str] | None = None) -> Endpoint:
    env = dict(os.environ) if environ is None else environ
    if kubeconfig:
        return from_kubeconfig(Path(kubeconfig))
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"):
        return in_cluster(env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"])
    named = env.get("KUBECONFIG", "").split(os.pathsep)[0]
    return from_kubeconfig(Path(named) if named else Path.home() / ".kube" / "config")


def in_cluster(host: str, port: str, account: Path = SERVICE_ACCOUNT) -> Endpoint:
    host = f"[{host}]" if ":" in host else host
    ca = account / "ca.crt"
    if not ca.exists():
        raise KubeConfigError(str(account), "no ca.crt: is a service account token mounted?")
    context = ssl.create_default_context(cafile=str(ca))
    endpoint = Endpoint(f"https://{host}:{port}", context, token_file=str(account / "token"), source="in-cluster")
    endpoint.authorization()  # the token must be there now
    return endpoint


def from_kubeconfig(path: Path) -> Endpoint:
    import yaml  # only here: pyyaml costs 4 MB of memory, and a pod in the cluster needs no file

    source = str(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as err:
        raise KubeConfigError(source, f"cannot be read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise KubeConfigError(source, f"is not YAML: {err}") from None
    if not isinstance(doc, dict):
        raise KubeConfigError(source, "is not a kubeconfig (expected a mapping)")
    context_name = doc.get("current-context")
    context = _named(doc, "contexts", "context", context_name, source) if context_name else \
        _only(doc, "contexts", "context", source)
    cluster = _named(doc, "clusters", "cluster", context.get("cluster"), source)
    user = _named(doc, "users", "user", context.get("user"), source) if context.get("user") else {}
    base = path.parent
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("http://", "https://")):
        raise KubeConfigError(source, f"cluster server {server!r} is not an http(s) URL")
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise KubeConfigError(source, f"user {plugin} plugins are not supported: give the user a token, "
                                          "a tokenFile or a client certificate")
    endpoint = Endpoint(server.rstrip("/"), source=source)
    if server.startswith("https://"):
        endpoint.ssl_context = _tls(cluster, user, base, source)
    token, token_file = user.get("token"), user.get("tokenFile")
    if token:
        endpoint.token = str(token)
    elif token_file:
        endpoint.token_file = str(_path(base, token_file))
        endpoint.authorization()
    elif user.get("username") is not None:
        endpoint.basic = (str(user.get("username")), str(user.get("password") or ""))
    return endpoint


def _tls(cluster: dict[str, Any], user: dict[str, Any], base: Path, source: str) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify") is True:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        ca_data, ca_file = cluster.get("certificate-authority-data"), cluster.get("certificate-authority")
        if ca_data:
            context.load_verify_locations(cadata=_decoded(ca_data, "certificate-authority-data", source).decode())
        elif ca_file:
            context.load_verify_locations(cafile=str(_path(base, ca_file)))
    cert = _pem(user, "client-certificate", base, source)
    key = _pem(user, "client-key", base, source)
    if cert and key:
        _load_chain(context, cert, key, source)
    elif cert or key:
        raise KubeConfigError(source, "a client certificate needs its key (client-certificate and client-key)")
    return context


def _load_chain(context: ssl.SSLContext, cert: bytes, key: bytes, source: str) -> None:
    """ssl takes the pair from files only: a private temporary file, removed at once."""
    fd, name = tempfile.mkstemp(prefix="kubecert-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(cert + b"\n" + key)
        context.load_cert_chain(name)
    except ssl.SSLError as err:
        raise KubeConfigError(source, f"client certificate or key unusable: {err}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)


def _pem(user: dict[str, Any], name: str, base: Path, source: str) -> bytes:
    data, file = user.get(f"{name}-data"), user.get(name)
    if data:
        return _decoded(data, f"{name}-data", source)
    if file:
        try:
            return _path(base, file).read_bytes()
        except OSError as err:
            raise KubeConfigError(source, f"{name} {file}: {err.strerror}") from None
    return b""


def _decoded(value: object, name: str, source: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise KubeConfigError(source, f"{name} is not base64") from None


def _path(base: Path, value: object) -> Path:
    path = Path(str(value)).expanduser()
    return path if path.is_absolute() else base / path


def _listed(doc: dict[str, Any], plural: str) -> list[Any]:
    found = doc.get(plural)
    return found if isinstance(found, list) else []


def _named(doc: dict[str, Any], plural: str, single: str, name: object, source: str) -> dict[str, Any]:
    for item in _listed(doc, plural):
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(single), dict):
            return dict(item[single])
    raise KubeConfigError(source, f"no {single} named {name!r} in {plural}")


def _only(doc: dict[str, Any], plural: str, single: str, source: str) -> dict[str, Any]:
    items = [i for i in _listed(doc, plural) if isinstance(i, dict) and isinstance(i.get(single), dict)]
    if len(items) != 1:
        raise KubeConfigError(source, f"no current-context, and not exactly one {single} in {plural}")
    return dict(items[0][single])

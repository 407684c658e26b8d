"""Where the API is and how to authenticate, through the ``kubernetes`` package's loaders: the
sources in order, unusable configurations as one clear error, the emulator over TLS with a
client certificate, and the pod's own account with a token that rotates."""

from __future__ import annotations

import base64
import datetime
import os
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpushare_common.adapters.kube import Kube, KubeConfigError, Retryable
from gpushare_common.adapters.kubeclient import load_configuration
from gpushare_common.settings import KubeSettings
from gpushare_sim.apiserver import ApiSettings, TlsFiles, authn, objects
from gpushare_sim.apiserver.kinds import NODES, PODS, SERVICEACCOUNTS
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.config import incluster_config

from tests.support.kubeapi import KubeApi, pod_manifest, start_kube_api
from tests.support.pki import Pki, make_pki


def kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any] | None = None) -> Path:
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
           "clusters": [{"name": "k", "cluster": cluster}], "users": [{"name": "u", "user": user or {}}]}
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Where the package's in-cluster loader finds the pod's token and CA (a directory of the test's)."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(account / "token"))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(account / "ca.crt"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    yield account


def test_the_sources_in_order(tmp_path: Path, service_account: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    named = kubeconfig(tmp_path / "named", {"server": "http://named:1"}, {"token": "t"})
    other = kubeconfig(tmp_path / "other", {"server": "http://other:2"}, {"token": "t"})
    (service_account / "token").write_text("sa-token")
    (service_account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("KUBECONFIG", str(other))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert load_configuration(KubeSettings(kubeconfig=str(named))).host == "http://named:1"  # the setting first
    in_cluster = load_configuration(KubeSettings())
    assert (in_cluster.host, in_cluster.api_key["BearerToken"]) == ("https://[fd00::1]:443", "bearer sa-token")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert load_configuration(KubeSettings()).host == "http://other:2"  # then KUBECONFIG


def test_in_cluster_without_a_mounted_token_says_so(service_account: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(KubeConfigError, match="in-cluster: Service token file does not exist"):
        Kube(KubeSettings())


@pytest.mark.parametrize("write, reason", [
    (None, "cannot be read|Invalid kube-config file"),
    ("{unclosed", "is not YAML"),
    ("current-context: nope\ncontexts: []\nclusters: []\nusers: []\n", "nope"),
    ("apiVersion: v1\nkind: Config\n", "current-context|context"),
])
def test_an_unusable_kubeconfig_names_the_file(tmp_path: Path, write: str | None, reason: str) -> None:
    path = tmp_path / "cfg"
    if write is not None:
        path.write_text(write)
    with pytest.raises(KubeConfigError, match=reason) as err:
        Kube(KubeSettings(kubeconfig=str(path)))
    assert str(err.value).startswith(f"Kubernetes configuration {path}: ")


def configuration_or_error(doc: Any) -> None:
    """Any document read as a kubeconfig is a configuration or a KubeConfigError, nothing else."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="gs-kubeconfig-") as file:
        file.write(yaml.safe_dump(doc))
        file.flush()
        try:
            load_configuration(KubeSettings(kubeconfig=file.name))
        except KubeConfigError:
            pass


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12))
@settings(max_examples=100)
def test_any_yaml_document_is_a_configuration_or_a_kubeconfig_error(doc: Any) -> None:
    configuration_or_error(doc)


_VALUES = st.none() | st.booleans() | st.integers() | st.text(max_size=6) | st.just("http://h:1") | \
    st.just("https://h:1") | st.just("c") | st.just("k") | st.just("u") | st.lists(st.text(max_size=3), max_size=2)
_KEYS = st.sampled_from(["server", "token", "tokenFile", "username", "password", "insecure-skip-tls-verify",
                         "certificate-authority-data", "client-certificate-data", "client-key-data", "cluster", "user",
                         "name", "context"])


@given(st.fixed_dictionaries({}, optional={
    "current-context": _VALUES,
    "contexts": st.lists(st.fixed_dictionaries({"name": _VALUES}, optional={
        "context": st.dictionaries(_KEYS, _VALUES, max_size=3) | _VALUES}), max_size=2) | _VALUES,
    "clusters": st.lists(st.fixed_dictionaries({"name": _VALUES}, optional={
        "cluster": st.dictionaries(_KEYS, _VALUES, max_size=4) | _VALUES}), max_size=2) | _VALUES,
    "users": st.lists(st.fixed_dictionaries({"name": _VALUES}, optional={
        "user": st.dictionaries(_KEYS, _VALUES, max_size=4) | _VALUES}), max_size=2) | _VALUES}))
@settings(max_examples=150)
def test_any_kubeconfig_shape_is_a_configuration_or_a_kubeconfig_error(doc: Any) -> None:
    configuration_or_error(doc)


# --- the emulator over TLS ----------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_api(pki: Pki, tmp_path: Path) -> Iterator[KubeApi]:
    """The emulator over HTTPS, asking every client for a certificate its CA signed."""
    tls = TlsFiles(pki.server_cert, pki.server_key, client_ca=pki.ca)
    with start_kube_api(directory=tmp_path, tls=tls, ca=pki.ca) as api:
        api.server.call(lambda: objects.create(api.store, NODES, "", {"metadata": {"name": "n1"}}))
        yield api


async def get_node(path: Path) -> str:
    kube = Kube(KubeSettings(kubeconfig=str(path), qps_timeout_s=5))
    try:
        return str((await kube.get_node("n1"))["metadata"]["name"])
    finally:
        await kube.close()


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # insecure-skip-tls-verify
async def test_tls_with_the_cluster_ca_and_a_client_certificate(tls_api: KubeApi, pki: Pki, tmp_path: Path) -> None:
    client = {"client-certificate": str(pki.client_cert), "client-key-data": b64(pki.client_key), "token": "t"}
    trusted = {"server": tls_api.url, "certificate-authority-data": b64(pki.ca)}
    assert await get_node(kubeconfig(tmp_path / "ok", trusted, client)) == "n1"
    with pytest.raises(Retryable, match="certificate"):  # the system's CAs do not know this one
        await get_node(kubeconfig(tmp_path / "untrusted", {"server": tls_api.url}, client))
    with pytest.raises(Retryable, match="get node n1"):  # the server wants a client certificate
        await get_node(kubeconfig(tmp_path / "anonymous", trusted, {"token": "t"}))
    skip = {"server": tls_api.url, "insecure-skip-tls-verify": True}
    assert await get_node(kubeconfig(tmp_path / "skip", skip, client)) == "n1"


# --- in the cluster: the pod's account, its token rotated -------------------------------


class _Later:
    """``datetime`` as the in-cluster loader sees it, ``ahead`` seconds in the future."""

    def __init__(self, ahead_s: float) -> None:
        self.timedelta = datetime.timedelta
        ahead = datetime.timedelta(seconds=ahead_s)
        self.datetime = types.SimpleNamespace(now=lambda: datetime.datetime.now() + ahead)


def issue_token(api: KubeApi, pod: str) -> str:
    request = {"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod}}}
    answer = api.server.call(lambda: authn.issue(api.store, "ml", "solver", request))
    return str(answer["status"]["token"])


async def test_in_cluster_a_rotated_token_is_read_again(pki: Pki, tmp_path: Path, service_account: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    tls = TlsFiles(pki.server_cert, pki.server_key)
    with start_kube_api(ApiSettings(authenticate=True), directory=tmp_path, namespaces=("ml",), tls=tls) as api:
        def seed() -> None:
            objects.create(api.store, SERVICEACCOUNTS, "ml", {"metadata": {"name": "solver"}})
            for name in ("first", "second"):
                body = pod_manifest(name)
                body["spec"]["serviceAccountName"] = "solver"
                objects.create(api.store, PODS, "ml", body)

        api.server.call(seed)
        (service_account / "ca.crt").write_bytes(pki.ca.read_bytes())
        (service_account / "token").write_text(issue_token(api, "first"))
        host, port = api.url.removeprefix("https://").split(":")
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
        kube = Kube(KubeSettings())
        try:
            assert (await kube.get_pod("ml", "first"))["metadata"]["name"] == "first"
            (service_account / "token").write_text(issue_token(api, "second"))  # the kubelet rotates it
            api.server.call(lambda: api.store.remove(PODS, ("ml", "first")))  # and the old one stops holding
            with pytest.raises(Retryable, match="401"):  # the token is read again once a minute
                await kube.get_pod("ml", "second")
            monkeypatch.setattr(incluster_config, "datetime", _Later(61))
            assert (await kube.get_pod("ml", "second"))["metadata"]["name"] == "second"
        finally:
            await kube.close()


def test_a_service_with_an_unusable_kubeconfig_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "cfg"
    path.write_text("current-context: nope\ncontexts: []\nclusters: []\nusers: []\n")
    env = {**os.environ, "GPUSHARE_NODE_NAME": "n1", "GPUSHARE_KUBE_KUBECONFIG": str(path),
           "GPUSHARE_NATS_URL": "nats://127.0.0.1:1", "GPUSHARE_HTTP_PORT": "0"}
    done = subprocess.run([sys.executable, "-m", "gpushare_shadow_controller"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"gpushare-shadow-controller: Kubernetes configuration {path}: "), last
    assert "nope" in last and "Traceback" not in done.stderr


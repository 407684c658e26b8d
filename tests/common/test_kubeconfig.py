"""Where the API is and how to authenticate: kubeconfig forms, the in-cluster account, and a
real TLS server that checks the client's certificate and token."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpushare_common.adapters.kube import Kube, NotFound, Retryable
from gpushare_common.adapters.kubeconfig import Endpoint, KubeConfigError, from_kubeconfig, in_cluster, load_endpoint
from gpushare_common.settings import KubeSettings
from hypothesis import given, settings
from hypothesis import strategies as st


def kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any] | None = None) -> Path:
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
           "clusters": [{"name": "k", "cluster": cluster}], "users": [{"name": "u", "user": user or {}}]}
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_token_a_token_file_and_basic_credentials(tmp_path: Path) -> None:
    plain = from_kubeconfig(kubeconfig(tmp_path / "a", {"server": "http://127.0.0.1:1/"}, {"token": "t0"}))
    assert (plain.server, plain.ssl_context, plain.authorization()) == ("http://127.0.0.1:1", None, "Bearer t0")
    (tmp_path / "tok").write_text("t1\n")
    relative = from_kubeconfig(kubeconfig(tmp_path / "b", {"server": "http://h:1"}, {"tokenFile": "tok"}))
    assert relative.authorization() == "Bearer t1"
    basic = from_kubeconfig(kubeconfig(tmp_path / "c", {"server": "http://h:1"}, {"username": "u", "password": "p"}))
    assert basic.authorization() == "Basic " + base64.b64encode(b"u:p").decode()
    assert from_kubeconfig(kubeconfig(tmp_path / "d", {"server": "http://h:1"})).authorization() == ""


def test_a_token_file_is_read_again_after_a_minute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tok").write_text("first")
    endpoint = from_kubeconfig(kubeconfig(tmp_path / "k", {"server": "http://h:1"}, {"tokenFile": "tok"}))
    (tmp_path / "tok").write_text("rotated")
    assert endpoint.authorization() == "Bearer first"
    monkeypatch.setattr(endpoint, "_read_at", endpoint._read_at - 61)
    assert endpoint.authorization() == "Bearer rotated"


@pytest.mark.parametrize("cluster, user, reason", [
    ({"server": "ftp://h"}, {}, "is not an http(s) URL"),
    ({"server": "http://h"}, {"exec": {"command": "aws"}}, "exec plugins are not supported"),
    ({"server": "http://h"}, {"auth-provider": {"name": "oidc"}}, "auth-provider plugins are not supported"),
    ({"server": "https://h", "certificate-authority-data": "%%%"}, {}, "certificate-authority-data is not base64"),
    ({"server": "https://h"}, {"client-certificate": "nowhere.pem", "client-key": "k.pem"}, "nowhere.pem"),
    ({"server": "https://h"}, {"client-certificate-data": base64.b64encode(b"x").decode()}, "needs its key"),
    ({"server": "http://h"}, {"tokenFile": "missing"}, "token file"),
])
def test_bad_kubeconfigs_name_the_file_and_the_field(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any],
                                                     reason: str) -> None:  # fmt: skip
    path = kubeconfig(tmp_path / "cfg", cluster, user)
    with pytest.raises(KubeConfigError) as err:
        from_kubeconfig(path)
    assert reason in str(err.value) and str(path) in str(err.value)


def test_no_such_context_or_not_yaml(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("current-context: nope\ncontexts: []\n")
    with pytest.raises(KubeConfigError, match="no context named 'nope'"):
        from_kubeconfig(tmp_path / "x")
    (tmp_path / "y").write_text("{unclosed")
    with pytest.raises(KubeConfigError, match="is not YAML"):
        from_kubeconfig(tmp_path / "y")
    with pytest.raises(KubeConfigError, match="cannot be read"):
        from_kubeconfig(tmp_path / "absent")


def endpoint_or_error(doc: Any) -> None:
    """Any document read as a kubeconfig is an Endpoint or a KubeConfigError, nothing else."""
    path = Path("/tmp") / f"gs-kubeconfig-{abs(hash(str(doc)))}"
    path.write_text(yaml.safe_dump(doc))
    try:
        assert isinstance(from_kubeconfig(path), Endpoint)
    except KubeConfigError:
        pass
    finally:
        path.unlink()


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12))
@settings(max_examples=200)
def test_any_yaml_document_is_an_endpoint_or_a_kubeconfig_error(doc: Any) -> None:
    endpoint_or_error(doc)


_VALUES = st.none() | st.booleans() | st.integers() | st.text(max_size=6) | st.just("http://h:1") | \
    st.just("https://h:1") | st.just("c") | st.just("k") | st.just("u") | st.lists(st.text(max_size=3), max_size=2)
_KEYS = st.sampled_from(["server", "token", "tokenFile", "username", "password", "exec", "insecure-skip-tls-verify",
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
@settings(max_examples=300)
def test_any_kubeconfig_shape_is_an_endpoint_or_a_kubeconfig_error(doc: Any) -> None:
    endpoint_or_error(doc)


def test_in_cluster_and_the_order_of_sources(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=r"no ca\.crt"):
        in_cluster("10.0.0.1", "443", tmp_path)
    pki = make_pki(tmp_path)
    account = tmp_path / "sa"
    account.mkdir()
    shutil.copy(pki["ca.crt"], account / "ca.crt")
    (account / "token").write_text("sa-token")
    found = in_cluster("fd00::1", "443", account)
    assert (found.server, found.authorization()) == ("https://[fd00::1]:443", "Bearer sa-token")
    named = kubeconfig(tmp_path / "named", {"server": "http://named:1"})
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBECONFIG": str(named)}
    assert load_endpoint(str(named), env).server == "http://named:1"  # the setting first
    assert load_endpoint("", {"KUBECONFIG": str(named)}).server == "http://named:1"


# --- a real TLS server -----------------------------------------------------------------------


def make_pki(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made by openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make certificates")
    d = directory / "pki"
    d.mkdir(exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=test-ca")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, cn in (("server", "127.0.0.1"), ("client", "gpushare-solver")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={cn}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", *(["-extfile", "san.ext"] if name == "server" else []))
    return {n: d / n for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


@pytest.fixture
async def tls_api(tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, Path], list[dict[str, str]]]]:
    """An HTTPS server (asyncio and ssl) that asks for a client certificate and answers node GETs."""
    pki = make_pki(tmp_path)
    seen: list[dict[str, str]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                peer = writer.get_extra_info("peercert")
                subject = dict(x[0] for x in peer["subject"]) if peer else {}
                auth = next((line.split(":", 1)[1].strip() for line in head.split("\r\n")
                             if line.lower().startswith("authorization:")), "")
                seen.append({"cn": subject.get("commonName", ""), "auth": auth})
                name = head.split(" ")[1].rsplit("/", 1)[-1]
                status, doc = (200, {"kind": "Node", "metadata": {"name": "n1"}}) if name == "n1" else \
                    (404, {"kind": "Status", "code": 404, "message": f'nodes "{name}" not found'})
                body = json.dumps(doc).encode()
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki["ca.crt"]))
    context.load_cert_chain(pki["server.crt"], pki["server.key"])
    context.verify_mode = ssl.CERT_OPTIONAL
    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    try:
        yield f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}", pki, seen
    finally:
        server.close()


async def test_tls_with_the_cluster_ca_a_client_certificate_and_a_token(
        tmp_path: Path, tls_api: tuple[str, dict[str, Path], list[dict[str, str]]]) -> None:
    url, pki, seen = tls_api
    ca = base64.b64encode(pki["ca.crt"].read_bytes()).decode()
    user = {"client-certificate": str(pki["client.crt"]),
            "client-key-data": base64.b64encode(pki["client.key"].read_bytes()).decode(), "token": "t"}
    kube = Kube(KubeSettings(kubeconfig=str(kubeconfig(tmp_path / "cfg", {"server": url,
                                                                          "certificate-authority-data": ca}, user))))
    try:
        assert (await kube.get_node("n1"))["metadata"]["name"] == "n1"
        with pytest.raises(NotFound, match="404"):
            await kube.get_node("x")
    finally:
        await kube.close()
    assert seen[0] == {"cn": "gpushare-solver", "auth": "Bearer t"}
    untrusted = Kube(KubeSettings(kubeconfig=str(kubeconfig(tmp_path / "bad", {"server": url}))))
    try:
        with pytest.raises(Retryable, match="certificate"):  # the system's CAs do not know this one
            await untrusted.get_node("n1")
    finally:
        await untrusted.close()
    insecure = Kube(KubeSettings(kubeconfig=str(kubeconfig(tmp_path / "skip", {
        "server": url, "insecure-skip-tls-verify": True}))))
    try:
        assert (await insecure.get_node("n1"))["metadata"]["name"] == "n1"
    finally:
        await insecure.close()


def test_a_service_with_an_unusable_kubeconfig_exits_2_with_one_line(tmp_path: Path) -> None:
    import os
    import sys

    path = kubeconfig(tmp_path / "cfg", {"server": "https://h:1"}, {"exec": {"command": "aws"}})
    env = {**os.environ, "GPUSHARE_NODE_NAME": "n1", "GPUSHARE_KUBE_KUBECONFIG": str(path),
           "GPUSHARE_NATS_URL": "nats://127.0.0.1:1", "GPUSHARE_HTTP_PORT": "0"}
    done = subprocess.run([sys.executable, "-m", "gpushare_shadow_controller"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"gpushare-shadow-controller: Kubernetes configuration {path}: user exec plugins are not supported: "
        "give the user a token, a tokenFile or a client certificate")
    assert "Traceback" not in done.stderr

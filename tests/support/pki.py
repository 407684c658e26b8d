"""Certificates for tests, made by the openssl command: a CA, a server certificate for
127.0.0.1 and a client certificate, all signed by that CA."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(directory: Path, client_cn: str = "gpushare-solver") -> Pki:
    d = directory / "pki"
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=test-ca")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, cn in (("server", "127.0.0.1"), ("client", client_cn)):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={cn}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", *(["-extfile", "san.ext"] if name == "server" else []))
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key")

"""Run ``python -m gpushare_detector`` as a real process (tests and the benchmark)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare_common.settings import NatsSettings

from tests.support.service import http_env, http_port


@dataclass
class DetectorProcess:
    proc: subprocess.Popen[bytes]
    ports_dir: Path
    log: Path

    @property
    def port(self) -> int:
        """The HTTP port the detector bound (waits until it serves)."""
        return http_port(self.ports_dir, self.proc)

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as response:
                body = response.read()
                status = response.status
        except urllib.error.HTTPError as err:
            body, status = err.read(), err.code
        return status, json.loads(body) if path != "/metrics" else body.decode()

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"detector exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            try:
                if self.get("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"detector not ready: {self.log.read_text()[-3000:]}")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def start_detector(nats: NatsSettings, kubeconfig: Path, socket: Path, workdir: Path, node: str = "node-1",
                   environ: dict[str, str] | None = None, **extra: str) -> DetectorProcess:
    env = {
        **os.environ, **http_env(workdir),
        "GPUSHARE_NODE_NAME": node,
        "GPUSHARE_KUBE_KUBECONFIG": str(kubeconfig), "GPUSHARE_NATS_URL": nats.url,
        "GPUSHARE_NATS_ENSURE_LAYOUT": "true",
        "GPUSHARE_NATS_PREFIX": nats.prefix, "GPUSHARE_NATS_STREAM": nats.stream,
        "GPUSHARE_NATS_KV_PREFIX": nats.kv_prefix, "GPUSHARE_NATS_STREAM_MAX_BYTES": str(64 << 20),
        "GPUSHARE_DETECTOR_POD_RESOURCES_SOCKET": str(socket),
        **{f"GPUSHARE_DETECTOR_{k.upper()}": v for k, v in extra.items()},
        **(environ or {}),
    }
    log = workdir / "detector.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpushare_detector"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    return DetectorProcess(proc, workdir, log)

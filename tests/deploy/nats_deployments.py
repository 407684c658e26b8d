"""The shipped NATS configurations, run on this machine with the nats-server k8s/ deploys.

- :class:`ComposeNats`: compose/nats.conf with the users compose's nats-config container writes
  (its entrypoint, run here), the stream and buckets made by its nats-install container.
- :class:`ChartNats`: the chart's nats.conf (one server) with AUTH_ISSUER from the StatefulSet's
  init container command, the auth callout service with the environment of the chart's
  Deployment, a TokenReview against the API emulator, and service-account tokens minted for the
  leaf's and the console's accounts bound to a Node (as the projected tokens of their pods are),
  audience as the chart sets it; and each node's leaf server as the chart's DaemonSet runs it:
  its init container's command writes the node's part of the configuration (users, domain,
  remotes with the node's token), its agent makes the node's layout. The node services are
  users of their node's leaf, the console (observer) and the leaf role clients of the cluster.

Both give :meth:`settings` (a Bus's, as a role on a node) and :meth:`probe` (a raw connection),
for each of their :attr:`roles` (compose runs no DRA driver, so it has no dra-driver user), and
:meth:`domain` (where an observer in the cluster finds a node's stream and buckets).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import yaml
from gpushare_common.layout import NODE_ROLES, SERVICE_ROLES, Layout
from gpushare_common.ports import port_of
from gpushare_common.settings import NatsSettings
from gpushare_nats_auth.natsconf import STATIC_ROLES
from gpushare_sim.natsd import ANY_PORT, leaf_listener
from gpushare_sim.run.kubeapi import mint_node_token
from gpushare_sim.run.procs import wait_ports
from kubernetes import client

from tests.deploy import tools
from tests.deploy.chart import render
from tests.support import procs
from tests.support.kubeapi import KubeApi, start_kube_api
from tests.support.service import http_env, http_port

ROOT = Path(__file__).resolve().parents[2]
NODE_A, NODE_B = "gpu-node-1", "gpu-node-2"
BIN = Path(sys.executable).parent


class Probe:
    """A raw connection: publish or subscribe, and whether the server refused it."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: Any = None

    async def on_error(self, err: Exception) -> None:
        self.errors.append(str(err))

    async def refused(self, action: str, subject: str) -> bool:
        """Whether the server answered ``pub``/``sub`` on ``subject`` with a permissions violation.
        The server answers in order, so the violation comes before the PONG of a PING sent after
        the command; nats-py writes a flush's PING ahead of its buffered commands (and the buffer
        right after it), so only the second flush's PONG is sure to follow the answer."""
        before = len(self.errors)
        if action == "pub":
            await self.nc.publish(subject, b"{}")
        else:
            await self.nc.subscribe(subject)
        await self.nc.flush(5)
        await self.nc.flush(5)
        return any("permissions violation" in e.lower() and subject.lower() in e.lower() for e in self.errors[before:])

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


class Server:
    """One nats-server process from a config file, stopped on ``stop()``."""

    def __init__(self, config: Path, env: dict[str, str]) -> None:
        self.port, self.config, self.env = ANY_PORT, config, env  # a restart takes back the port it bound
        self.ports: dict[str, list[str]] = {}  # what it reported it bound, by kind
        self.log = config.with_suffix(".log")
        self.start()

    def start(self) -> None:
        started = self.log.read_text().count("Server is ready") if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([str(tools.nats_server()), "-c", str(self.config), "-a", "127.0.0.1", "-p",
                                          str(self.port), "-m", "-1", "--ports_file_dir", str(self.config.parent)],
                                         env={**os.environ, **self.env}, stdout=out, stderr=out)  # fmt: skip
        procs.allow(self.proc.pid)
        wait_for(lambda: self.log.read_text().count("Server is ready") > started, self.proc, self.log)
        self.ports = wait_ports(self.config.parent, self.proc)
        self.port = port_of(self.ports["nats"][0])

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop(self.proc)


def wait_for(ready: Any, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{proc.args!r} (exit {proc.poll()}):\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.02)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    procs.disallow(proc.pid)


def run(argv: list[str], env: dict[str, str]) -> None:
    """A one-shot container's command, here (its console script from this environment)."""
    done = subprocess.run([str(BIN / argv[0]), *argv[1:]], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"


class Deployment:
    name = ""
    server: Server
    roles: frozenset[str] = frozenset()  # the roles a client can have here

    def credentials(self, role: str, node: str) -> dict[str, str]:
        raise NotImplementedError

    def url(self, role: str, node: str) -> str:
        """Where ``role`` on ``node`` connects."""
        return self.server.url

    def domain(self, node: str) -> str:
        """The JetStream domain holding ``node``'s stream and buckets, seen from the observer's server."""
        return ""

    def settings(self, role: str, node: str = NODE_A) -> NatsSettings:
        return NatsSettings(url=self.url(role, node), reconnect_wait_s=0.1, connect_timeout_s=2,
                            **self.credentials(role, node))  # type: ignore[arg-type]

    async def probe(self, role: str, node: str = NODE_A, **options: Any) -> Probe:
        probe = Probe()
        probe.nc = await nats.connect(self.url(role, node), error_cb=probe.on_error, max_reconnect_attempts=0,
                                      inbox_prefix=f"_INBOX.{role}.{node}" if role in NODE_ROLES else
                                      f"_INBOX.{role}", **{**self.credentials(role, node), **options})  # fmt: skip
        return probe


class ComposeNats(Deployment):
    name = "compose"
    roles = frozenset(STATIC_ROLES)
    # as compose/gen-env.sh makes them: a letter first, or nats-server may read one as a number
    PASSWORDS = {f"{r.replace('-', '_').upper()}_PASSWORD": f"p{secrets.token_hex(8)}" for r in STATIC_ROLES}

    def __init__(self, work: Path) -> None:
        services = yaml.safe_load((ROOT / "compose" / "docker-compose.yaml").read_text())["services"]
        (work / "users").mkdir(parents=True)
        entry = [a.replace("${NODE_NAME:-gpu-node-1}", NODE_A).replace("/etc/nats/users", str(work / "users"))
                 for a in services["nats-config"]["entrypoint"]]  # fmt: skip
        run(entry, {})
        config = work / "nats.conf"
        config.write_text((ROOT / "compose" / "nats.conf").read_text().replace("/data/jetstream", f"{work}/js"))
        self.server = Server(config, self.PASSWORDS)
        install = services["nats-install"]
        env = {k: str(v) for k, v in install["environment"].items()}
        run([a.replace("${NODE_NAME:-gpu-node-1}", NODE_A) for a in install["entrypoint"]],
            {**env, "GPUSHARE_NATS_URL": self.server.url,
                                    "GPUSHARE_NATS_PASSWORD": self.PASSWORDS["INSTALLER_PASSWORD"]})

    def credentials(self, role: str, node: str) -> dict[str, str]:
        return {"user": role, "password": self.PASSWORDS[f"{role.replace('-', '_').upper()}_PASSWORD"]}


class ChartNats(Deployment):
    name = "chart"
    NODES = (NODE_A, NODE_B)

    def __init__(self, work: Path, kube: KubeApi, callout_env: dict[str, str] | None = None) -> None:
        self.work, self.kube, self.extra_env = work, kube, callout_env or {}
        docs = render({"nats": {"replicas": 1}})
        self.docs = {(d["kind"], d["metadata"]["name"]): d for d in docs}
        self.passwords = {"AUTH_PASSWORD": f"p{secrets.token_hex(8)}", "INSTALLER_PASSWORD": f"p{secrets.token_hex(8)}"}
        self.issuer = work / "secret" / "issuer"
        self.issuer.parent.mkdir(parents=True)
        self.issuer.write_text(secrets.token_hex(32))
        self.server = self._start_server()
        self.audience = self._callout_env()["GPUSHARE_AUTH_AUDIENCE"]
        # the service account of each role, from the callout's role table as the chart sets it
        pairs = (p.split("=") for p in self._callout_env()["GPUSHARE_AUTH_ROLES"].split(","))
        self.accounts = {role: key.split("/")[1] for key, role in pairs}
        self.roles = frozenset({*self.accounts, *SERVICE_ROLES, "installer"})
        self.callout = self._start_callout()
        core = client.CoreV1Api(kube.client)
        for node in self.NODES:
            core.create_node({"metadata": {"name": node}})
        self.tokens: dict[tuple[str, str, str], str] = {}
        self.leaves = {node: self._start_leaf(node) for node in self.NODES}
        self.agents = {node: self._start_agent(node) for node in self.NODES}

    def _pod(self, kind: str, name: str) -> dict[str, Any]:
        return self.docs[(kind, name)]["spec"]["template"]["spec"]  # type: ignore[no-any-return]

    def _start_server(self) -> Server:
        (config_dir := self.work / "nats").mkdir()
        text = self.docs[("ConfigMap", "nats-config")]["data"]["nats.conf"]
        text = text.replace("/data/jetstream", f"{self.work}/js")
        (config_dir / "nats.conf").write_text(text.replace("port: 7422", f"port: {ANY_PORT}"))
        (init,) = self._pod("StatefulSet", "gpushare-nats")["initContainers"]
        local = {"issuer-secret": self.issuer.parent, "issuer": self.work / "nats-auth"}  # volume -> here
        mounts = {m["mountPath"]: local[m["name"]] for m in init["volumeMounts"]}
        (self.work / "nats-auth").mkdir()
        run([_localise(a, mounts) for a in init["command"]], {})
        server = Server(config_dir / "nats.conf", self.passwords)
        self.leaf_port = leaf_listener(server.ports)  # where the leaves connect; a restart takes it back
        (config_dir / "nats.conf").write_text(text.replace("port: 7422", f"port: {self.leaf_port}"))
        return server

    def _callout_env(self) -> dict[str, str]:
        (container,) = self._pod("Deployment", "gpushare-nats-auth")["containers"]
        env = {e["name"]: str(e["value"]) for e in container["env"] if "value" in e}
        for item in container["env"]:
            if "valueFrom" in item:
                env[item["name"]] = self.passwords[item["valueFrom"]["secretKeyRef"]["key"]]
        return env

    def _start_callout(self) -> subprocess.Popen[bytes]:
        env = {**self._callout_env(), "GPUSHARE_NATS_URL": self.server.url, "GPUSHARE_NATS_RECONNECT_WAIT_S": "0.1",
               "GPUSHARE_AUTH_ISSUER_SEED_FILE": str(self.issuer),
               "GPUSHARE_KUBE_KUBECONFIG": str(self.kube.kubeconfig),
               **http_env(self.work), "GPUSHARE_LOG_JSON": "false", **self.extra_env}  # fmt: skip
        log = self.work / "nats-auth.log"
        with log.open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "gpushare_nats_auth"], env={**os.environ, **env},
                                    stdout=out, stderr=out)  # fmt: skip
        procs.allow(proc.pid)
        started = log.read_text().count("answering authorization requests")
        wait_for(lambda: log.read_text().count("answering authorization requests") > started, proc, log)
        self.status_url = f"http://127.0.0.1:{http_port(self.work, proc)}/status"
        return proc

    def restart_callout(self, down: bool = False) -> None:
        """Stop the callout; start it again unless ``down``."""
        stop(self.callout)
        if not down:
            self.callout = self._start_callout()

    def _leaf_container(self, name: str) -> dict[str, Any]:
        pod = self._pod("DaemonSet", "gpushare-nats-leaf")
        return next(c for c in [*pod["initContainers"], *pod["containers"]] if c["name"] == name)

    def _leaf_command(self, name: str, node: str) -> list[str]:
        """A container's command of the leaf's pod on ``node``, its paths and addresses here."""
        root = self.work / f"leaf-{node}"
        token = root / "token"
        token.parent.mkdir(parents=True, exist_ok=True)
        token.write_text(mint_node_token(self.kube.kubeconfig, node, self.accounts["leaf"],
                                         audiences=[self.audience]).token)  # the kubelet's, not cached
        mounts = {"/var/lib/gpushare/nats-leaf": root / "state", "/etc/nats-leaf/node": root / "node",
                  "/var/run/nats-leaf": root / "run", "/var/run/secrets/gpushare/nats": root}  # fmt: skip
        hub = f"nats-leaf://127.0.0.1:{self.leaf_port}"
        command = [_localise(a, mounts) for a in self._leaf_container(name)["command"]]
        assert not [a for a in command if a.startswith(("/var/", "/etc/"))], command  # nothing of this machine
        for index, arg in enumerate(command):
            command[index] = arg.replace("$(NODE_NAME)", node).replace("$(NODE_IP)", "127.0.0.1")
            if command[index - 1] == "--hub":
                command[index] = hub
            if command[index - 1] == "--url":
                command[index] = self.leaves[node].url
        return command

    def _start_leaf(self, node: str) -> Server:
        run(self._leaf_command("config", node), {})
        text = self.docs[("ConfigMap", "nats-leaf-config")]["data"]["leaf.conf"]
        root = self.work / f"leaf-{node}"
        (root / "run").mkdir(exist_ok=True)
        config = root / "leaf.conf"
        config.write_text(text.replace("/var/run/nats-leaf", str(root / "run")).replace("http_port", "# http_port"))
        return Server(config, {"NODE_IP": "127.0.0.1"})

    def _start_agent(self, node: str) -> subprocess.Popen[bytes]:
        """The leaf's agent: it makes the node's stream and buckets (waited for here), then follows the token."""
        command = self._leaf_command("agent", node)
        log = self.work / f"leaf-{node}" / "agent.log"
        with log.open("ab") as out:
            proc = subprocess.Popen([str(BIN / command[0]), *command[1:]], stdout=out, stderr=out)
        procs.allow(proc.pid)
        wait_for(lambda: "ready on its leaf" in log.read_text(), proc, log, timeout=60)
        return proc

    def url(self, role: str, node: str) -> str:
        return self.leaves[node].url if role in SERVICE_ROLES else self.server.url

    def domain(self, node: str) -> str:
        return Layout().node_domain(node)

    def token(self, role: str, node: str = NODE_A, account: str = "", audience: str = "") -> str:
        """A token of the service account of ``role`` (or ``account``) bound to ``node``."""
        key = (account or self.accounts[role], node, audience or self.audience)
        if key not in self.tokens:
            self.tokens[key] = mint_node_token(self.kube.kubeconfig, node, key[0], audiences=[key[2]]).token
        return self.tokens[key]

    def credentials(self, role: str, node: str) -> dict[str, str]:
        if role == "installer":
            return {"user": "installer", "password": self.passwords["INSTALLER_PASSWORD"]}
        if role in SERVICE_ROLES:  # a user of its node's leaf, its password in the file the leaf made
            return {"user": role, "password": (self.work / f"leaf-{node}" / "state" / "users" / role).read_text()}
        return {"token": self.token(role, node)}

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.status_url, timeout=2) as answer:
            return json.loads(answer.read())  # type: ignore[no-any-return]

    def stop(self) -> None:
        for agent in getattr(self, "agents", {}).values():
            stop(agent)
        for leaf in getattr(self, "leaves", {}).values():
            leaf.stop()
        if self.callout.poll() is None:
            stop(self.callout)
        self.server.stop()


def _localise(arg: str, mounts: dict[str, Path]) -> str:
    """A container's argument with a path of (or inside) a mount moved to where that volume is here."""
    for path, here in mounts.items():
        if arg == path or arg.startswith(path + "/"):
            return str(here) + arg[len(path):]
    return arg


@contextlib.contextmanager
def compose_nats() -> Iterator[ComposeNats]:
    with tempfile.TemporaryDirectory(prefix="gsn-") as work:
        deployment = ComposeNats(Path(work))
        try:
            yield deployment
        finally:
            deployment.server.stop()


@contextlib.contextmanager
def chart_nats(callout_env: dict[str, str] | None = None) -> Iterator[ChartNats]:
    with tempfile.TemporaryDirectory(prefix="gsn-") as work, start_kube_api(directory=Path(work)) as kube:
        deployment = ChartNats(Path(work), kube, callout_env)
        try:
            yield deployment
        finally:
            deployment.stop()


async def refused_connect(deployment: Deployment, **credentials: Any) -> str:
    """The error of a connection the server refuses (AuthorizationError), as text."""
    try:
        nc = await nats.connect(deployment.server.url, max_reconnect_attempts=0, connect_timeout=5,
                                allow_reconnect=False, **credentials)  # fmt: skip
    except Exception as err:  # nats-py raises its own types for a refused CONNECT
        return f"{type(err).__name__}: {err}"
    await nc.close()
    raise AssertionError("the server accepted the connection")

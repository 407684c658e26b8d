"""The local cluster: nats-server, the API emulator, simulated nodes with their
kernel stand-in and leaf server, and every gpushare service, each as its own process.

NATS is laid out as in Kubernetes: a cluster of 1, 3 or 5 servers, and on each node a
leaf server connected to it (``leaves``) that holds the node's stream and buckets and
that the node's services use. The auth callout (``natsauth``) grants each leaf its own
node's traffic only, and the console its observer role; ``nats_auth=False`` (``make run
ARGS=--no-nats-auth``) runs open servers instead, for debugging.

``async with Cluster(settings, timeline) as cluster:`` starts everything in
order, waits until each part answers, and on exit (also on an error or a
cancellation) stops everything in reverse order and removes the run
directory. Each process logs to ``<run dir>/logs/<name>.log``.

Every process binds its own ports (any free one) and reports them in ``<run dir>/ports``
(:mod:`gpushare_common.ports`); the cluster reads them there and writes them into the process's
command, so that a restart takes back the address its clients know.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from gpushare_common.bus.install import install
from gpushare_common.ports import port_of
from gpushare_common.settings import (
    HTTP_PREFIX,
    KUBE_PREFIX,
    LOG_PREFIX,
    NODE_PREFIX,
    HttpSettings,
    KubeSettings,
    LogSettings,
    NatsSettings,
    NodeSettings,
    env_of,
)

from gpushare_sim import natsd
from gpushare_sim.run.evidence import keep_evidence
from gpushare_sim.run.leaves import NodeNats
from gpushare_sim.run.narrate import Timeline
from gpushare_sim.run.natsauth import NatsAuth
from gpushare_sim.run.procs import Child, ChildError, wait_path
from gpushare_sim.run.services import ServiceSettings, console, node_services, shadow_controller
from gpushare_sim.shorttmp import short_mkdtemp


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    nodes: int = 1
    gpus: int = 4
    containerd: str = "auto"  # the node simulator's --containerd
    containerd_api: str = "cri"  # the node simulator's --containerd-api: cri (as a kubelet) or ctr
    run_dir: Path | None = None  # None: a fresh directory under /tmp (socket paths are short there)
    keep_dir: bool = False  # leave the run directory (logs) behind after the stop
    services: ServiceSettings = field(default_factory=ServiceSettings)
    kernel_timeout_ms: int = 10_000
    log_level: str = "INFO"
    nats_servers: int = 1  # 3: a NATS cluster (routes on loopback), stream and buckets at 3 replicas
    nats_auth: bool = True  # the auth callout and per-node tokens (False: an open server, for debugging)
    console: bool = True  # the cluster view in the browser (services/console)
    evidence: str = ""  # a label: the logs are kept under .run/<label>-error-<time> when the run ends in an error


@dataclass
class Node:
    name: str
    dir: Path
    kernel: Child
    sim: Child
    cmd_socket: Path
    hook_socket: Path
    nats: NodeNats
    endpoints: dict[str, str] = field(default_factory=dict)
    dra: bool = False  # a DRA node: the DRA driver instead of the device plugins

    @property
    def containerd(self) -> bool:
        return self.endpoints.get("containerd_kind", "process") != "process"


class Cluster:
    def __init__(self, settings: ClusterSettings, timeline: Timeline | None = None) -> None:
        self.settings = settings
        self.timeline = timeline or Timeline(out=None)
        self.run_dir = settings.run_dir or short_mkdtemp("gsr-")
        self.logs = self.run_dir / "logs"
        self.kubeconfig = self.run_dir / "kubeconfig"
        self.api_url = ""
        self.ports = self.run_dir / "ports"  # where every process reports the ports it bound
        names = ["nats-server"] if settings.nats_servers == 1 else \
            [f"nats-server-{i}" for i in range(1, settings.nats_servers + 1)]
        self.nats = natsd.members(names, self.run_dir / "nats", self.ports, leaves=True)
        self.nodes: list[Node] = []
        self.children: dict[str, Child] = {}  # start order
        self.auth = NatsAuth(self.run_dir / "nats") if settings.nats_auth else None
        self._rotation: asyncio.Task[None] | None = None

    @property
    def nats_url(self) -> str:
        """Every server of the NATS cluster, comma-separated (clients pick one, then fail over)."""
        return ",".join(f"nats://127.0.0.1:{m.client_port}" for m in self.nats)

    @property
    def nats_replicas(self) -> int:
        return min(len(self.nats), 3)

    def nats_settings(self, **overrides: object) -> NatsSettings:
        """Client settings for this cluster's NATS (the scenarios' and tools' own connections: the
        installer's user, which may do anything)."""
        credentials: dict[str, object] = dict(self.auth.installer()) if self.auth is not None else {}
        return NatsSettings(url=self.nats_url, stream_replicas=self.nats_replicas, reconnect_wait_s=0.2,
                            **{**credentials, **overrides})  # type: ignore[arg-type]

    def leaf(self, node: str = "") -> NodeNats:
        """The leaf server of ``node`` (the first node by default)."""
        return next(n.nats for n in self.nodes if n.name == (node or self.nodes[0].name))

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1", **env_of(LogSettings, LOG_PREFIX, level=self.settings.log_level),
                **extra}  # fmt: skip

    def _service_env(self) -> dict[str, str]:
        """What every service process is given: HTTP on loopback, any free port, reported in the
        cluster's ports directory; the API server."""
        return {**env_of(HttpSettings, HTTP_PREFIX, host="127.0.0.1", port=0, ports_dir=str(self.ports)),
                **env_of(KubeSettings, KUBE_PREFIX, kubeconfig=str(self.kubeconfig))}

    def _child(self, name: str, argv: list[str], env: dict[str, str] | None = None, ports: bool = True) -> Child:
        child = Child(name, argv, env or self.env(), self.logs / f"{name}.log",
                      ports_dir=self.ports if ports else None)  # fmt: skip
        self.children[name] = child
        return child.start()

    async def _bound(self, child: Child, timeout: float = 60.0) -> dict[str, list[str]]:
        """The ports ``child`` bound, written into its command: a restart takes them back."""
        ports = await child.wait_ports(timeout)
        if "GPUSHARE_HTTP_PORT" in child.env:
            child.env["GPUSHARE_HTTP_PORT"] = str(port_of(ports["http"][0]))
        for flag, kind in (("--port", "http"), ("--port", "api"), ("--exporter-port", "exporter")):
            if flag in child.argv and ports.get(kind):
                child.argv[child.argv.index(flag) + 1] = str(port_of(ports[kind][0]))
        return ports

    # --- start ------------------------------------------------------------

    async def __aenter__(self) -> Cluster:
        try:
            await self.start()
        except BaseException:
            self._keep_on_error()
            await self.stop()
            raise
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        tb: TracebackType | None) -> None:  # fmt: skip
        if error is not None:
            self._keep_on_error()
        await self.stop()

    def _keep_on_error(self) -> None:
        """An error (or an interruption) ends the run: keep its logs when a label was given."""
        if self.settings.evidence and self.logs.exists():
            keep_evidence(self.logs, f"{self.settings.evidence}-error")

    async def start(self) -> None:
        say = self.timeline.step
        self.logs.mkdir(parents=True, exist_ok=True)
        self.ports.mkdir(parents=True, exist_ok=True)  # nats-server does not create it
        say("run directory", path=self.run_dir, logs=self.logs)
        await self._start_nats()
        say(f"nats-server -js up ({len(self.nats)} server{'s' if len(self.nats) > 1 else ''}); "
            "each node's stream and buckets on its own leaf server", url=self.nats_url)
        await self._start_apiserver()
        say("Kubernetes API emulator up", url=self.api_url, kubeconfig=self.kubeconfig)
        if self.auth is not None:
            await self._start_callout(self.auth)
        for index in range(1, self.settings.nodes + 1):
            node = await self._start_node(f"gpu-node-{index}", schedule=index == 1)
            mode = _container_mode(node)
            say(f"node {node.name} up: {self.settings.gpus} fake cards, kernel stand-in, leaf server "
                f"(domain {node.nats.domain}), containers as {mode}")
        waits: list[Awaitable[None]] = [self._start_shadow_controller()]
        for node in self.nodes:
            waits += await self._start_services(node)
        if self.settings.console:
            waits.append(self._start_console())
        await asyncio.gather(*waits)
        if self.auth is not None:
            self._rotation = asyncio.ensure_future(self.auth.rotate(self.kubeconfig, self._reload_leaves))
        say("every service ready", processes=len(self.children))

    async def _start_nats(self) -> None:
        try:
            binary = natsd.server_binary()
        except natsd.NatsNotInstalled as err:
            raise ChildError("nats-server", str(err)) from None
        authorization = ""
        if self.auth is not None:
            await asyncio.to_thread(self.auth.prepare)
            authorization = self.auth.authorization()
        started: list[natsd.Member] = []
        for member in self.nats:  # one after another: each dials the members bound before it
            self._nats_config(natsd.seeded(member, started), authorization)
            child = self._child(member.name, [binary, "-c", str(self._nats_config_path(member))])
            ports = await child.wait_ports()
            leaf_port = await asyncio.to_thread(natsd.leaf_listener, ports) if member.leaf_port else 0
            started.append(natsd.bound(member, ports, leaf_port))
        self.nats = natsd.meshed(started)
        for member in self.nats:  # a restart takes back its ports and dials every other member
            self._nats_config(member, authorization)

    def _nats_config_path(self, member: natsd.Member) -> Path:
        return self.run_dir / "nats" / f"{member.name}.conf"

    def _nats_config(self, member: natsd.Member, authorization: str) -> None:
        config = self._nats_config_path(member)
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(natsd.server_config(member, authorization=authorization))

    async def _start_apiserver(self) -> None:
        argv = [sys.executable, "-m", "gpushare_sim.apiserver", "--port", "0", "--ports-dir", str(self.ports),
                "--kubeconfig", str(self.kubeconfig),
                "--state-file", str(self.run_dir / "apiserver-state.json")]  # survives a restart
        self.api_url = (await self._bound(self._child("apiserver", argv)))["api"][0]

    async def add_node(self, dra: bool = False) -> Node:
        """One more node (``dra``: a DRA node) and its services, while the cluster runs."""
        node = await self._start_node(f"gpu-node-{len(self.nodes) + 1}", schedule=False, dra=dra)
        await asyncio.gather(*await self._start_services(node))
        return node

    async def _start_leaf(self, name: str) -> NodeNats:
        """The node's leaf server, connected to every member of the cluster, and its layout."""
        leaf = NodeNats.make(name, natsd.ANY_PORT, self.run_dir / "leaves", tuple(m.leaf_port for m in self.nats),
                             self.auth is not None, self.ports)  # fmt: skip
        config = await asyncio.to_thread(leaf.write, await self._leaf_token(name))
        child = self._child(leaf.child, [natsd.server_binary(), "-c", str(config)])
        leaf.client_port = port_of((await child.wait_ports())["nats"][0])
        await asyncio.to_thread(leaf.write_server)  # a restart takes back the port its services know
        await install(leaf.settings(), deadline_s=60, node=name)
        return leaf

    async def _leaf_token(self, node: str) -> str:
        """The token of the node's leaf for the cluster, as last minted ("" without the callout)."""
        if self.auth is None:
            return ""
        path = self.auth.tokens.get(("leaf", node))
        if path is None:
            path = await asyncio.to_thread(self.auth.mint, self.kubeconfig, "leaf", node)
        return path.read_text()

    async def _reload_leaves(self) -> None:
        """Each leaf's remotes with its fresh token, read again (SIGHUP: it reconnects), as the
        leaf's agent does in Kubernetes."""
        for node in self.nodes:
            await asyncio.to_thread(node.nats.write, await self._leaf_token(node.name))
            child = self.children[node.nats.child]
            if child.proc is not None and child.alive():
                child.proc.send_signal(signal.SIGHUP)

    async def _start_node(self, name: str, schedule: bool, dra: bool = False) -> Node:
        kdir = self.run_dir / f"k{len(self.nodes) + 1}"
        (kdir / "hook").mkdir(parents=True)
        cmd, hook = kdir / "cmd.sock", kdir / "hook" / "hook.sock"
        kernel = self._child(f"kernel@{name}", [sys.executable, "-m", "gpushare_sim.kernel", "--socket",
                             str(cmd), "--hook-socket", str(hook),
                             "--timeout-ms", str(self.settings.kernel_timeout_ms)], ports=False)  # fmt: skip
        await wait_path(hook, kernel)
        argv = [sys.executable, "-m", "gpushare_sim.node", "--name", name, "--api", str(self.kubeconfig),
                "--dir", str(self.run_dir), "--gpus", str(self.settings.gpus), "--port", "0",
                "--exporter-port", "0", "--ports-dir", str(self.ports), "--containerd", self.settings.containerd,
                "--containerd-api", self.settings.containerd_api,
                "--kmod-socket", str(hook), *(["--schedule"] if schedule else []),
                *(["--dra"] if dra else [])]  # fmt: skip
        sim = self._child(f"node@{name}", argv)
        await self._bound(sim, timeout=120)  # reported once its endpoints are written
        await sim.wait_ready()
        leaf = await self._start_leaf(name)  # after its Node exists: the leaf's token is bound to it
        node = Node(name, self.run_dir / name, kernel, sim, cmd, hook, leaf, dra=dra)
        node.endpoints = json.loads((node.dir / "endpoints.json").read_text())
        self.nodes.append(node)
        return node

    async def _start_callout(self, auth: NatsAuth) -> None:
        env = self.env(**env_of(HttpSettings, HTTP_PREFIX, host="127.0.0.1", port=0, ports_dir=str(self.ports)),
                       **auth.callout_env(self.nats_url, self.kubeconfig))  # fmt: skip
        child = self._child("nats-auth", [sys.executable, "-m", "gpushare_nats_auth"], env)
        await self._ready(child, "NATS auth callout ready: each node service gets its role on its own node only")

    async def _start_services(self, node: Node) -> list[Awaitable[None]]:
        """Start the node's services at once (they wait for each other); one readiness wait each.
        Each connects to its node's leaf server as its role's user there."""
        waits: list[Awaitable[None]] = []
        for service, module, extra in node_services(self, node):
            env = self.env(**env_of(NodeSettings, NODE_PREFIX, name=node.name), **self._service_env(),
                           **node.nats.env(service), **extra)  # fmt: skip
            child = self._child(f"{service}@{node.name}", [sys.executable, "-m", module], env)
            waits.append(self._ready(child, f"{service} ready on {node.name}"))
        return waits

    async def _ready(self, child: Child, text: str, path: str = "/readyz") -> None:
        await self._bound(child, timeout=120)
        await child.wait_ready(path, timeout=120)
        self.timeline.step(text, status=f"{child.http}/status")

    async def _start_shadow_controller(self) -> None:
        env = self.env(**self._service_env(), **shadow_controller(self))
        child = self._child("shadow-controller", [sys.executable, "-m", "gpushare_shadow_controller"], env)
        idle = self.settings.services.idle_timeout_s
        await self._ready(child, f"shadow-controller ready (ShadowPod idle timeout {idle}s)", "/healthz")

    async def _start_console(self) -> None:
        """The cluster view, read-only: the observer's NATS role (a token bound to no node, with the
        callout), the API's pods and nodes."""
        token: dict[str, str] = {}
        if self.auth is not None:
            path = await asyncio.to_thread(self.auth.mint, self.kubeconfig, "console")
            token = {"GPUSHARE_NATS_TOKEN_FILE": str(path)}
        env = self.env(**self._service_env(), GPUSHARE_NATS_URL=self.nats_url,
                       GPUSHARE_NATS_STREAM_REPLICAS=str(self.nats_replicas), **console(self), **token)  # fmt: skip
        child = self._child("console", [sys.executable, "-m", "gpushare_console"], env)
        await self._bound(child, timeout=120)
        await child.wait_ready("/readyz", timeout=120)
        self.timeline.step(f"console ready: open {self.console_url} in a browser")

    @property
    def console_url(self) -> str:
        """The cluster view's page ("" without a console)."""
        child = self.children.get("console")
        return f"{child.http}/" if child is not None else ""

    # --- use --------------------------------------------------------------

    def child(self, name: str) -> Child:
        return self.children[name]

    def service(self, service: str, node: str = "") -> Child:
        return self.children[f"{service}@{node or self.nodes[0].name}"]

    def check(self) -> None:
        """Raise :class:`ChildError` when any part has died."""
        for child in self.children.values():
            child.check_running()

    def status_endpoints(self) -> dict[str, str]:
        return {name: f"{c.http}/status" for name, c in self.children.items() if c.http}

    async def restart(self, name: str) -> None:
        """Stop and start one part again (same ports, settings and, for NATS, store)."""
        child = self.children[name]
        await asyncio.to_thread(child.stop)
        child.start()  # in the loop's own thread: a child dies with the thread that started it
        await self.started(child)

    async def started(self, child: Child) -> None:
        """Wait until a child started again listens (and, with HTTP, answers its readiness)."""
        if child.ports_dir is not None:
            await child.wait_ports()
        if child.http:
            await child.wait_ready("/healthz" if child.name == "shadow-controller" else "/readyz")

    # --- stop -------------------------------------------------------------

    async def stop(self) -> None:
        """Stop every part in reverse order (nodes stop their containers and containerd)."""
        if self._rotation is not None:
            self._rotation.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rotation
        for name in reversed(list(self.children)):
            child = self.children[name]
            if child.proc is not None:
                await asyncio.to_thread(child.stop, 30.0 if name.startswith("node@") else 10.0)
        if self.children:
            self.timeline.step("everything stopped", processes=len(self.children))
        self.children.clear()
        if not self.settings.keep_dir:
            _remove_tree(self.run_dir)  # blocking on purpose: the last step, also while a loop shuts down


def _container_mode(node: Node) -> str:
    kind = node.endpoints.get("containerd_kind", "process")
    if kind == "cri":
        return "real containers (private containerd's CRI plugin, gpushare runtime handler)"
    if kind == "containerd":
        return "real containers (private containerd, ctr run + runc or gpushare-runtime)"
    return "plain processes (no root or no containerd here)"


def _remove_tree(path: Path) -> None:
    """Remove the run directory, unmounting anything a crashed part left mounted under it."""
    with contextlib.suppress(OSError):
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(str(path) + "/")), reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    shutil.rmtree(path, ignore_errors=True)


def describe(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)

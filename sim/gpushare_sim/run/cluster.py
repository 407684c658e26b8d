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
import tempfile
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from gpushare_common.bus.install import install
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
from gpushare_sim.run.procs import Child, ChildError, free_port, wait_path, wait_port
from gpushare_sim.run.services import ServiceSettings, console, node_services, shadow_controller


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
        self.run_dir = settings.run_dir or Path(tempfile.mkdtemp(prefix="gsr-", dir="/tmp"))
        self.logs = self.run_dir / "logs"
        self.kubeconfig = self.run_dir / "kubeconfig"
        self.api_url = ""
        names = ["nats-server"] if settings.nats_servers == 1 else \
            [f"nats-server-{i}" for i in range(1, settings.nats_servers + 1)]
        self.nats = natsd.members(names, [free_port() for _ in names], [free_port() for _ in names],
                                  self.run_dir / "nats", [free_port() for _ in names])
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

    def _service_env(self, port: int) -> dict[str, str]:
        """What every service process is given: its HTTP address (loopback) and the API server."""
        return {**env_of(HttpSettings, HTTP_PREFIX, host="127.0.0.1", port=port),
                **env_of(KubeSettings, KUBE_PREFIX, kubeconfig=str(self.kubeconfig))}

    def _child(self, name: str, argv: list[str], env: dict[str, str] | None = None, http: str = "") -> Child:
        child = Child(name, argv, env or self.env(), self.logs / f"{name}.log", http)
        self.children[name] = child
        return child.start()

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
        for member in self.nats:
            config = self.run_dir / "nats" / f"{member.name}.conf"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(natsd.server_config(member, authorization=authorization))
            self._child(member.name, [binary, "-c", str(config)])
        for member in self.nats:
            await wait_port(member.client_port, self.children[member.name])

    async def _start_apiserver(self) -> None:
        port = free_port()
        argv = [sys.executable, "-m", "gpushare_sim.apiserver", "--port", str(port),
                "--kubeconfig", str(self.kubeconfig),
                "--state-file", str(self.run_dir / "apiserver-state.json")]  # survives a restart
        self.api_url = f"http://127.0.0.1:{port}"
        await wait_port(port, self._child("apiserver", argv))

    async def add_node(self, dra: bool = False) -> Node:
        """One more node (``dra``: a DRA node) and its services, while the cluster runs."""
        node = await self._start_node(f"gpu-node-{len(self.nodes) + 1}", schedule=False, dra=dra)
        await asyncio.gather(*await self._start_services(node))
        return node

    async def _start_leaf(self, name: str) -> NodeNats:
        """The node's leaf server, connected to every member of the cluster, and its layout."""
        leaf = NodeNats.make(name, free_port(), self.run_dir / "leaves", tuple(m.leaf_port for m in self.nats),
                             self.auth is not None)  # fmt: skip
        config = await asyncio.to_thread(leaf.write, await self._leaf_token(name))
        child = self._child(leaf.child, [natsd.server_binary(), "-c", str(config)])
        await wait_port(leaf.client_port, child)
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
                             "--timeout-ms", str(self.settings.kernel_timeout_ms)])  # fmt: skip
        await wait_path(hook, kernel)
        port = free_port()
        argv = [sys.executable, "-m", "gpushare_sim.node", "--name", name, "--api", str(self.kubeconfig),
                "--dir", str(self.run_dir), "--gpus", str(self.settings.gpus), "--port", str(port),
                "--exporter-port", str(free_port()), "--containerd", self.settings.containerd,
                "--containerd-api", self.settings.containerd_api,
                "--kmod-socket", str(hook), *(["--schedule"] if schedule else []),
                *(["--dra"] if dra else [])]  # fmt: skip
        sim = self._child(f"node@{name}", argv, http=f"http://127.0.0.1:{port}")
        await wait_path(self.run_dir / name / "endpoints.json", sim, timeout=120)
        await sim.wait_ready()
        leaf = await self._start_leaf(name)  # after its Node exists: the leaf's token is bound to it
        node = Node(name, self.run_dir / name, kernel, sim, cmd, hook, leaf, dra=dra)
        node.endpoints = json.loads((node.dir / "endpoints.json").read_text())
        self.nodes.append(node)
        return node

    async def _start_callout(self, auth: NatsAuth) -> None:
        port = free_port()
        env = self.env(**env_of(HttpSettings, HTTP_PREFIX, host="127.0.0.1", port=port),
                       **auth.callout_env(self.nats_url, self.kubeconfig))  # fmt: skip
        child = self._child("nats-auth", [sys.executable, "-m", "gpushare_nats_auth"], env, f"http://127.0.0.1:{port}")
        await self._ready(child, "NATS auth callout ready: each node service gets its role on its own node only")

    async def _start_services(self, node: Node) -> list[Awaitable[None]]:
        """Start the node's services at once (they wait for each other); one readiness wait each.
        Each connects to its node's leaf server as its role's user there."""
        waits: list[Awaitable[None]] = []
        for service, module, extra in node_services(self, node):
            port = free_port()
            env = self.env(**env_of(NodeSettings, NODE_PREFIX, name=node.name), **self._service_env(port),
                           **node.nats.env(service), **extra)  # fmt: skip
            child = self._child(f"{service}@{node.name}", [sys.executable, "-m", module], env,
                                f"http://127.0.0.1:{port}")  # fmt: skip
            waits.append(self._ready(child, f"{service} ready on {node.name}"))
        return waits

    async def _ready(self, child: Child, text: str, path: str = "/readyz") -> None:
        await child.wait_ready(path, timeout=120)
        self.timeline.step(text, status=f"{child.http}/status")

    async def _start_shadow_controller(self) -> None:
        port = free_port()
        env = self.env(**self._service_env(port), **shadow_controller(self))
        child = self._child("shadow-controller", [sys.executable, "-m", "gpushare_shadow_controller"],
                            env, f"http://127.0.0.1:{port}")  # fmt: skip
        idle = self.settings.services.idle_timeout_s
        await self._ready(child, f"shadow-controller ready (ShadowPod idle timeout {idle}s)", "/healthz")

    async def _start_console(self) -> None:
        """The cluster view, read-only: the observer's NATS role (a token bound to no node, with the
        callout), the API's pods and nodes."""
        port = free_port()
        token: dict[str, str] = {}
        if self.auth is not None:
            path = await asyncio.to_thread(self.auth.mint, self.kubeconfig, "console")
            token = {"GPUSHARE_NATS_TOKEN_FILE": str(path)}
        env = self.env(GPUSHARE_HTTP_HOST="127.0.0.1", GPUSHARE_HTTP_PORT=str(port), GPUSHARE_NATS_URL=self.nats_url,
                       GPUSHARE_NATS_STREAM_REPLICAS=str(self.nats_replicas),
                       GPUSHARE_KUBE_KUBECONFIG=str(self.kubeconfig), **console(self), **token)  # fmt: skip
        child = self._child("console", [sys.executable, "-m", "gpushare_console"], env, f"http://127.0.0.1:{port}")
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
        """Stop and start one part again (same port, settings and, for NATS, store)."""
        child = self.children[name]
        await asyncio.to_thread(child.stop)
        child.start()  # in the loop's own thread: a child dies with the thread that started it
        port = self.nats_port(name)
        if port:
            await wait_port(port, child)
        elif name == "apiserver":
            await wait_port(int(self.api_url.rsplit(":", 1)[1]), child)
        elif child.http:
            await child.wait_ready("/healthz" if name == "shadow-controller" else "/readyz")

    def nats_port(self, name: str) -> int:
        """The client port of the NATS server ``name`` (a member or a node's leaf; 0: not one)."""
        member = next((m.client_port for m in self.nats if m.name == name), 0)
        return member or next((n.nats.client_port for n in self.nodes if n.nats.child == name), 0)

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

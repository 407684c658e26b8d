"""``python -m gpushare_sim.node``: parse settings, build, run until a signal.

HTTP: ``/healthz``, ``/readyz``, ``/status`` (JSON), ``/containerLogs/<ns>/<pod>/<container>``
(a container's output, as the kubelet serves it to the API server), ``POST /kubelet/restart``
(re-create kubelet.sock, as a kubelet restart does; SIGHUP does the same) and
``POST /gpus/{index}/health?healthy=false`` (fault injection); the exporter
serves ``/metrics`` on its own port.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from contextlib import AsyncExitStack
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from gpushare_common.http import Health, bound_port, serve, service_app
from gpushare_common.ports import remove_ports, write_ports
from gpushare_common.settings import HttpSettings
from gpushare_common.tasks import Tasks, run_service, wait_first
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from gpushare_sim.node import logs
from gpushare_sim.node.adapters.backend import build_runner
from gpushare_sim.node.adapters.kube import SimKube
from gpushare_sim.node.app import NodeSim
from gpushare_sim.node.events import EventRecorder
from gpushare_sim.node.settings import NodeSimSettings
from gpushare_sim.scheduler import Scheduler


def parse_args(argv: list[str] | None = None) -> NodeSimSettings:
    p = argparse.ArgumentParser(prog="python -m gpushare_sim.node", description=__doc__)
    p.add_argument("--name", required=True, help="node name")
    p.add_argument("--api", default="", help="kubeconfig of the API server (empty: no API)")
    p.add_argument("--dir", required=True, type=Path, help="simulator directory")
    p.add_argument("--gpus", type=int, default=4, help="number of fake cards")
    p.add_argument("--host", default="127.0.0.1", help="HTTP listen address")
    p.add_argument("--port", type=int, default=0, help="HTTP port (/healthz, /status)")
    p.add_argument("--exporter-port", type=int, default=0, help="DCGM-style /metrics port")
    p.add_argument("--ports-dir", default="", help="report the bound ports in a ports file here")
    p.add_argument("--containerd", default="auto", help="auto | none | containerd socket")
    p.add_argument("--namespace", default="k8s.io", help="containerd namespace (ctr; the CRI's is k8s.io)")
    p.add_argument("--containerd-api", choices=("cri", "ctr"), default="cri",
                   help="cri: containerd's CRI plugin, as a kubelet (default); ctr: ctr run with our own spec")
    p.add_argument("--runtime-handler", default="gpushare", help="the CRI runtime handler of the pods")
    p.add_argument("--runtime", default="auto", help="auto | none | runc-compatible binary")
    p.add_argument("--kmod-socket", default="", help="kernel stand-in socket")
    p.add_argument("--cpu", default="16")
    p.add_argument("--memory", default="64Gi")
    p.add_argument("--label", action="append", default=[], help="extra node label K=V")
    p.add_argument("--schedule", action="store_true", help="also run the simple scheduler")
    p.add_argument("--dra", action="store_true",
                   help="a DRA node: DRA drivers register in <dir>/<node>/plugins_registry; the vendor "
                        "plugin serves discovery only")
    a = p.parse_args(argv)
    if a.gpus < 0:
        p.error("--gpus must be >= 0")
    labels = dict(item.split("=", 1) for item in a.label if "=" in item)
    return NodeSimSettings(
        name=a.name, sim_dir=a.dir.resolve(), kubeconfig=a.api, gpus=a.gpus,
        http_host=a.host, http_port=a.port, exporter_port=a.exporter_port, ports_dir=a.ports_dir,
        containerd=a.containerd, containerd_namespace=a.namespace, containerd_api=a.containerd_api,
        runtime_handler=a.runtime_handler,
        runtime_binary=a.runtime, kmod_socket=a.kmod_socket, cpu=a.cpu,
        memory=a.memory, labels=labels, schedule=a.schedule, dra=a.dra,
    )  # fmt: skip


def http_app(sim: NodeSim, health: Health) -> FastAPI:
    app = service_app("sim-node", health, CollectorRegistry(), sim.status)

    @app.post("/kubelet/restart")
    async def restart() -> dict[str, int]:
        await sim.restart_kubelet()
        return {"restarts": sim.plugins.restarts}

    @app.get("/containerLogs/{namespace}/{pod}/{container}", response_model=None)
    async def container_logs(namespace: str, pod: str, container: str,
                             request: Request) -> StreamingResponse | JSONResponse:  # fmt: skip
        try:
            wanted = logs.parse(request.query_params)
            state = sim.kubelet.container(namespace, pod, container)
            if state is None:
                raise logs.LogError(404, f"container {container} of pod {namespace}/{pod} is not on this node")
            source = logs.source(pod, state, wanted.previous)
        except logs.LogError as err:
            return JSONResponse({"message": str(err)}, status_code=err.code)
        return StreamingResponse(logs.stream(source, wanted), media_type="text/plain")

    @app.post("/gpus/{index}/health")
    async def gpu_health(index: int, healthy: bool = True) -> dict[str, object]:
        card = sim.cards[index]
        assert sim.vendor is not None
        await sim.vendor.set_health(card.device_id, healthy)
        return {"device": card.device_id, "healthy": healthy}

    return app


def exporter_app(sim: NodeSim) -> FastAPI:
    app = FastAPI(title="gpushare sim exporter", docs_url=None, redoc_url=None)

    @app.get("/metrics")
    async def metrics() -> Response:
        assert sim.exporter is not None
        return Response(await sim.exporter.scrape(), media_type=CONTENT_TYPE_LATEST)

    return app


async def run(settings: NodeSimSettings, stop: asyncio.Event) -> int:
    health = Health("kubelet")
    tasks = Tasks("sim-node")
    async with AsyncExitStack() as stack:
        api = SimKube.from_kubeconfig(settings.kubeconfig) if settings.kubeconfig else None
        if api is not None:
            stack.push_async_callback(api.close)
        runner = await build_runner(settings, stack)
        sim = NodeSim(settings, runner, api)
        await sim.start(stack)
        http = await stack.enter_async_context(
            serve(http_app(sim, health), HttpSettings(settings.http_host, settings.http_port))
        )
        exporter = await stack.enter_async_context(
            serve(exporter_app(sim), HttpSettings(settings.http_host, settings.exporter_port))
        )
        host = settings.http_host
        sim.publish_endpoints({"http": f"http://{host}:{bound_port(http)}",
                               "exporter": f"http://{host}:{bound_port(exporter)}/metrics"})  # fmt: skip
        if settings.ports_dir:
            write_ports(settings.ports_dir, "sim-node", {"http": [f"http://{host}:{bound_port(http)}"],
                                                         "exporter": [f"http://{host}:{bound_port(exporter)}"]})
            stack.callback(remove_ports, settings.ports_dir, "sim-node")
        if api is not None:
            tasks.spawn("pod-sync", sim.sync_loop(stop))
            tasks.spawn("node-status", sim.node_status_loop())
            tasks.spawn("node-lease", sim.node_lease_loop())
            if settings.schedule:
                scheduler_events = EventRecorder(api, "default-scheduler")
                scheduler_events.start()
                stack.push_async_callback(scheduler_events.close)
                tasks.spawn("scheduler", Scheduler(api, events=scheduler_events).run(stop))
        if sim.dra is not None:
            tasks.spawn("dra-plugins", sim.dra.run(stop, sim.retry_unprepare))
        stack.push_async_callback(tasks.cancel_all)
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGHUP, lambda: tasks.spawn("kubelet-restart", sim.restart_kubelet(), False)
        )
        health.set("kubelet", True)
        await wait_first(stop, tasks)
        code = 1 if tasks.failure else 0  # loops that end after the stop are no failure
    return code


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return run_service("sim-node", lambda stop: run(settings, stop))

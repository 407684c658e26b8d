"""Helpers to run a simulated node inside a test or a scenario."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from gpushare_sim.node.adapters.backend import build_runner
from gpushare_sim.node.adapters.runners import Runner
from gpushare_sim.node.app import NodeApi, NodeSim
from gpushare_sim.node.settings import NodeSimSettings
from gpushare_sim.shorttmp import short_mkdtemp

T = TypeVar("T")


def short_sim_dir() -> Path:
    """A fresh simulator directory with a short path (unix socket paths are limited to 108 bytes)."""
    return short_mkdtemp("gsim-")


@asynccontextmanager
async def running_node(
    settings: NodeSimSettings, api: NodeApi | None = None, runner: Runner | None = None
) -> AsyncIterator[NodeSim]:
    """Start a node (kubelet stand-in and fake GPUs); stop and clean it up on exit."""
    async with AsyncExitStack() as stack:
        chosen = runner or await build_runner(settings, stack)
        sim = NodeSim(settings, chosen, api)
        await sim.start(stack)
        yield sim


async def wait_until(
    probe: Callable[[], T | None] | Callable[[], Awaitable[T | None]],
    timeout: float = 15.0,
    what: str = "condition",
    interval: float = 0.05,
) -> T:
    """Poll ``probe`` until it returns something truthy; TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def pod_manifest(
    name: str,
    command: list[str],
    *,
    namespace: str = "default",
    node: str = "",
    resources: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    uid: str = "",
    containers: list[str] | None = None,
) -> dict[str, Any]:
    """A pod in its JSON form: every container runs ``command`` with ``resources`` as limits."""
    spec: dict[str, Any] = {
        "containers": [
            {"name": c, "image": "busybox", "command": command,
             "resources": {"limits": dict(resources or {})}}
            for c in (containers or ["main"])
        ],
        "restartPolicy": "Never",
    }  # fmt: skip
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "annotations": dict(annotations or {})}  # fmt: skip
    if uid:
        meta["uid"] = uid
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}

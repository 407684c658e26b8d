"""Fixtures for the solver tests: a private containerd with a busybox root filesystem,
the Kubernetes API emulator, a stand-in kmod-bridge answering on the kmod subject."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from gpushare_common.adapters.kube import Kube
from gpushare_common.bus import Bus
from gpushare_common.events import AnyEvent, KmodCommand, KmodReply
from gpushare_common.settings import KubeSettings, NatsSettings

from tests.runtime.conftest import containerd, rootfs  # noqa: F401  (fixtures)
from tests.support.kubeapi import KubeApi, kube_api_with

kube_api = kube_api_with("apps", "dev", "team", "batch", "spot")  # the namespaces these tests put pods in

NODE = "node-a"


@dataclass
class FakeBridge:
    """Answers kmod commands like the kmod-bridge would, and records them with their arrival time."""

    commands: list[tuple[float, KmodCommand]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    status: int = 0
    silent_first: str = ""  # the first command of this op is answered too late (a lost reply)
    replied: list[KmodCommand] = field(default_factory=list)

    async def answer(self, event: AnyEvent) -> KmodReply:
        assert isinstance(event, KmodCommand)
        self.commands.append((time.perf_counter(), event))
        self.changed.set()
        if event.op == self.silent_first:
            self.silent_first = ""
            await asyncio.sleep(2.0)
        else:
            self.replied.append(event)
        return KmodReply(node=event.node, op=event.op, status=self.status)

    def ops(self, op: str) -> list[KmodCommand]:
        return [c for _, c in self.commands if c.op == op]

    def answered(self, op: str) -> list[KmodCommand]:
        """Commands answered in time (not the silenced one)."""
        return [c for c in self.replied if c.op == op]


@pytest.fixture
async def kube(kube_api: KubeApi) -> AsyncIterator[Kube]:
    client = Kube(KubeSettings(kubeconfig=str(kube_api.kubeconfig)))
    yield client
    await client.close()


@pytest.fixture
async def bridge(nats_settings: NatsSettings) -> AsyncIterator[FakeBridge]:
    fake = FakeBridge()
    bus = Bus(nats_settings, "test-kmod-bridge")
    await bus.connect()
    await bus.serve(bus.subjects.node_kmod(NODE), fake.answer)
    yield fake
    await bus.drain()


async def wait_for(predicate: object, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll a (sync or async) predicate until it is true; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()  # type: ignore[operator]
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")

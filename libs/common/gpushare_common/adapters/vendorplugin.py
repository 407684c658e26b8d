"""Client of a vendor device plugin (e.g. ``nvidia.com/gpu``): its own ListAndWatch stream.

The vendor's plugin knows the node's real cards, their health and, where it fills the
kubelet's ``TopologyInfo``, their NUMA nodes. gpushare's spot plugin and DRA driver read it
as a client on its unix socket, the way the kubelet does. No gRPC exception escapes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from ..logging import get_logger
from ..retry import Backoff, Supervised
from .kubeletapi import deviceplugin_v1beta1_pb2 as pb
from .kubeletapi import deviceplugin_v1beta1_pb2_grpc as _pbg

pbg: Any = _pbg  # generated stubs carry no types
log = get_logger("vendorplugin")
HEALTHY = "Healthy"


@dataclass(frozen=True, slots=True)
class VendorCard:
    """One card as the vendor's plugin lists it."""

    id: str
    healthy: bool
    numa_nodes: tuple[int, ...] = ()


VendorCards = dict[str, VendorCard] | None  # None: the vendor plugin is absent


def cards_of(response: Any) -> dict[str, VendorCard]:
    """A ListAndWatch response as cards by ID."""
    return {
        d.ID: VendorCard(d.ID, d.health == HEALTHY,
                         tuple(sorted(n.ID for n in d.topology.nodes)) if d.HasField("topology") else ())
        for d in response.devices
    }


async def watch_vendor(resource: str, socket_path: str, stop: asyncio.Event,
                       backoff_min_s: float = 0.2, backoff_max_s: float = 5.0
                       ) -> AsyncIterator[VendorCards]:
    """Yield the vendor plugin's full card list on every change, ``None`` while it is absent.

    Retries with backoff until ``stop``; one log line per transition.
    """
    loop = Supervised(f"follow the vendor plugin {resource}", stop, Backoff(backoff_min_s, backoff_max_s),
                      socket=socket_path)  # fmt: skip
    async for attempt in loop:
        if os.path.exists(socket_path):  # noqa: ASYNC240  (one stat of a local socket)
            async for cards in _stream(socket_path, stop):
                if not attempt.progressed:
                    log.info("vendor plugin connected", resource=resource, socket=socket_path)
                    attempt.progress()
                yield cards
        if not stop.is_set():
            attempt.failed("vendor plugin absent" if not attempt.progressed else "vendor plugin stream ended")
            yield None


async def _stream(socket_path: str, stop: asyncio.Event) -> AsyncIterator[dict[str, VendorCard]]:
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
            call = pbg.DevicePluginStub(channel).ListAndWatch(pb.Empty())
            stopper = asyncio.ensure_future(stop.wait())
            stopper.add_done_callback(lambda _: call.cancel())
            try:
                async for response in call:
                    yield cards_of(response)
            finally:
                stopper.cancel()
    except grpc.aio.AioRpcError as err:
        log.debug("vendor stream ended", socket=socket_path, code=err.code().name)
    except asyncio.CancelledError:
        if not stop.is_set():
            raise

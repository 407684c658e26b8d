"""Client of a vendor device plugin (e.g. nvidia.com/gpu): its own ListAndWatch stream."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import grpc
from gpushare_common.adapters.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpushare_common.adapters.kubeletapi import deviceplugin_v1beta1_pb2_grpc as _pbg
from gpushare_common.logging import get_logger
from gpushare_common.retry import Backoff, wait_for_stop

from ..devices import HEALTHY, UNHEALTHY, Health

pbg: Any = _pbg  # generated stubs carry no types
log = get_logger("deviceplugin.vendor")
VendorCards = dict[str, Health] | None  # None: the vendor plugin is absent


async def watch_vendor(resource: str, socket_path: str, stop: asyncio.Event,
                       backoff_min_s: float = 0.2, backoff_max_s: float = 5.0
                       ) -> AsyncIterator[VendorCards]:
    """Yield the vendor plugin's full card list on every change, ``None`` while it is absent.

    Retries with backoff until ``stop``; one log line per transition.
    """
    backoff = Backoff(backoff_min_s, backoff_max_s, jitter=0.0)
    present = True  # so that the first absence is logged
    while not stop.is_set():
        seen = False
        if os.path.exists(socket_path):  # noqa: ASYNC240  (one stat of a local socket)
            async for cards in _stream(socket_path, stop):
                if not seen:
                    log.info("vendor plugin connected", resource=resource, socket=socket_path)
                    seen, present = True, True
                    backoff.reset()
                yield cards
        if present:
            log.warning("vendor plugin absent, retrying", resource=resource, socket=socket_path)
            present = False
        yield None
        await wait_for_stop(stop, backoff.next())


async def _stream(socket_path: str, stop: asyncio.Event) -> AsyncIterator[dict[str, Health]]:
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
            call = pbg.DevicePluginStub(channel).ListAndWatch(pb.Empty())
            stopper = asyncio.ensure_future(stop.wait())
            stopper.add_done_callback(lambda _: call.cancel())
            try:
                async for response in call:
                    yield {d.ID: HEALTHY if d.health == HEALTHY else UNHEALTHY
                           for d in response.devices}
            finally:
                stopper.cancel()
    except grpc.aio.AioRpcError as err:
        log.debug("vendor stream ended", socket=socket_path, code=err.code().name)
    except asyncio.CancelledError:
        if not stop.is_set():
            raise


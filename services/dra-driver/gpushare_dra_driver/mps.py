"""The MPS control daemon of a DRA node, started and supervised by the driver.

On a device-plugin node each capped ShadowPod runs NVIDIA's MPS control daemon for its card;
a DRA node has no ShadowPods, so the driver runs it. One daemon serves every card of the node
(each share's container sees only its card, and its caps are its own environment:
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` = card memory x k / N, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``
= 100 k / N); its directories are ``<isolation_dir>/dra/{pipe,log,shm}``, the ``shadow_dir`` of
every capped share on the node (the chart mounts the host's ``shm`` there as the driver's
``/dev/shm``, which the daemon inherits and each share mounts too).

- It starts with the first prepared share of a vendor whose isolation profile needs it
  (``mps_profiles``), and NodePrepareResources answers only once its control socket answers:
  the share's container never starts before its daemon. A daemon that does not answer within
  ``mps_ready_s`` fails those claims (their specs are removed; the kubelet asks again).
- It stops once the last such share is unprepared.
- While needed, a daemon that died is started again (every ``poll_s``), and one started by the
  other instance of a rolling update (its control socket answers) is used as it is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpushare_common import dra
from gpushare_common.logging import get_logger

from .adapters.daemon import DaemonProcess, control_answers
from .claims import ClaimRef
from .prepare import Preparer
from .state import PreparedClaim

log = get_logger("dra.mps")
SUBDIRS = ("pipe", "log", "shm")


class DaemonError(Exception):
    """The daemon did not come up: why."""


class MpsDaemon:
    def __init__(self, node: str, directory: str, command: str, ready_s: float,
                 process: Callable[[str, dict[str, str], list[str]], DaemonProcess] = DaemonProcess) -> None:
        self.node = node
        self.directory = directory.rstrip("/")
        self.control = f"{self.directory}/pipe/control"
        env = {"CUDA_MPS_PIPE_DIRECTORY": f"{self.directory}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{self.directory}/log"}
        self.process = process(command, env, [f"{self.directory}/{d}" for d in SUBDIRS])
        self.ready_s = ready_s
        self.needed = False
        self.starts = 0
        self.last_error = ""
        self._lock = asyncio.Lock()

    def answers(self) -> bool:
        return control_answers(self.control)

    async def ensure(self, needed: bool) -> None:
        """Running and answering while ``needed``, stopped when not; DaemonError when it does not come up."""
        async with self._lock:
            self.needed = needed
            if needed:
                await self._up()
            elif self.process.running():
                status = await self.process.stop()
                log.info("MPS control daemon stopped: no capped share left", node=self.node, status=status)

    async def _up(self) -> None:
        if self.process.running() or self.answers():
            return  # ours, answering since it started (supervised); or the other instance's (a rolling update)
        await self.process.start()
        self.starts += 1
        if await self._answering():
            self.last_error = ""
            log.info("MPS control daemon started", node=self.node, pid=self.process.pid, starts=self.starts)
            return
        status = await self.process.stop()
        self.last_error = f"its control socket {self.control} did not answer in {self.ready_s:g} s " \
                          f"(exit status {status})"
        raise DaemonError(self.last_error)

    async def _answering(self) -> bool:
        deadline = time.monotonic() + self.ready_s
        while not self.answers():
            if not self.process.running() or time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def supervise(self, poll_s: float) -> None:
        """Start it again whenever it is needed and neither it nor another instance's answers."""
        while True:
            await asyncio.sleep(poll_s)
            if not self.needed or self.process.running() or self.answers():
                continue
            log.warning("MPS control daemon gone while capped shares run; starting it again", node=self.node)
            try:
                await self.ensure(self.needed)
            except DaemonError as err:
                log.warning("MPS control daemon did not come back", node=self.node, error=str(err))

    async def close(self) -> None:
        await self.process.stop()

    def status(self) -> dict[str, Any]:
        return {"needed": self.needed, "pid": self.process.pid, "answers": self.answers(), "starts": self.starts,
                "directory": self.directory, "last_error": self.last_error}


async def answered_with_daemon(mps: MpsDaemon, preparer: Preparer, profiles: Sequence[str],
                               results: dict[str, PreparedClaim | str]) -> dict[str, PreparedClaim | str]:
    """Answer capped shares only once the MPS control daemon answers; if it cannot, those of
    this call fail and are unprepared (the kubelet asks again)."""
    capped = preparer.capped_cards(profiles)
    if not capped:
        return results
    try:
        await mps.ensure(True)
        return results
    except DaemonError as err:
        failed = [c for c in results.values() if isinstance(c, PreparedClaim) and any(
            card in capped and role == dra.ROLE_SHARE for card, role in zip(c.cards, c.roles, strict=False))]
        await preparer.unprepare([ClaimRef(c.namespace, c.name, c.uid) for c in failed])
        mps.needed = bool(preparer.capped_cards(profiles))
        why = f"the MPS control daemon did not start ({err}); its caps would not hold"
        return {**results, **{c.uid: f"claim {c.namespace}/{c.name}: {why}" for c in failed}}

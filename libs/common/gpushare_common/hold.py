"""How long the kernel holds a returning owner: the module's ``timeout_ms`` and ``max_hold_ms``.

The kernel module is the one source of these bounds (its parameters, writable at run time
through ``/sys/module/gpushare/parameters/``). It reports them in the head of every STATS
and HOLD reply; the kmod-bridge reads them at each registration and heartbeat and hands
them on with every reply (:class:`~gpushare_common.events.KmodReply`), so the solver learns
them from the kernel too. Every timer of an owner-back derives from them:

- the kmod-bridge's HOLD, every third of ``timeout_ms`` from the notice until the solver
  answers; the kernel itself stops it at hit + ``max_hold_ms``;
- the solver's wait for killed borrowers, ``max_hold_ms`` (no owner waits longer).

The defaults below are the module's own (``kmod/gpushare_main.c``, checked by
``tests/kmod/test_protocol_header.py``); user space uses them only until the kernel has
answered, and on a node without the module (where nothing is held). The kernel stand-in of
the simulator starts with them too.
"""

from __future__ import annotations

from dataclasses import dataclass

MODULE_TIMEOUT_MS = 3000  # the module parameter timeout_ms, as loaded without arguments
MODULE_MAX_HOLD_MS = 30000  # the module parameter max_hold_ms, as loaded without arguments


@dataclass(frozen=True, slots=True)
class HoldTiming:
    """The kernel's hold parameters; ``known`` once a kernel reported them."""

    timeout_ms: int = MODULE_TIMEOUT_MS
    max_hold_ms: int = MODULE_MAX_HOLD_MS
    known: bool = False

    @property
    def hold_every_s(self) -> float:
        """How often a HOLD keeps an owner blocked: a third of ``timeout_ms``, so that one HOLD
        lost or late still lands before the deadline."""
        return self.timeout_ms / 3000

    @property
    def max_hold_s(self) -> float:
        return self.max_hold_ms / 1000

    def updated(self, timeout_ms: int, max_hold_ms: int) -> HoldTiming:
        """These values when the kernel reported both (a reply without them changes nothing)."""
        if timeout_ms <= 0 or max_hold_ms <= 0:
            return self
        return HoldTiming(timeout_ms, max_hold_ms, True)

"""A test instrument of the kernel stand-in, not part of the module: the borrowers an owner's
return must outlive, checked at the instant the owner's blocked call is let go.

On the hook socket: ``{"op": "guard", "owner": ns, "borrowers": [ns, ...], "pids": [pid, ...]}``
arms a guard (``pids``: a live process of each borrower namespace, whose namespace the guard
holds open so its id cannot be given to a new namespace before the verdict),
``{"op": "verdicts"}`` returns every verdict so far.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence


class Guards:
    """A test instrument, not part of the module: the borrowers an owner's return must outlive.

    ``arm(owner, borrowers)`` names the pid namespaces of the borrowers of an owner's card; the
    instant the owner's blocked call is let go (RELEASE, DELETE or the timeout), every process
    of the node is looked at, and a borrower namespace that still has a live process makes a
    verdict with ``alive`` set: the owner ran beside its borrower. Checked causally, at the
    release itself, not from timestamps."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.armed: dict[int, tuple[int, ...]] = {}
        self.pinned: dict[int, list[int]] = {}  # owner -> open fds of its borrowers' namespaces
        self.verdicts: list[dict[str, object]] = []

    def arm(self, owner: int, borrowers: Sequence[int], pids: Sequence[int] = ()) -> None:
        """Arm a guard. A namespace id is given to a new namespace as soon as the old one is
        freed: a borrower dying just before the release would let a new container's process
        pass for it. Holding each borrower's namespace open (through ``pids``, a live process
        of each) keeps its id its own until the verdict."""
        self._unpin(owner)
        self.armed[owner] = tuple(borrowers)
        fds = []
        for pid in pids:
            try:
                fd = os.open(f"{self.proc}/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            if os.fstat(fd).st_ino in borrowers:
                fds.append(fd)
            else:  # the pid is no longer the borrower's
                os.close(fd)
        self.pinned[owner] = fds

    def settle(self, owner: int, how: str) -> None:
        borrowers = self.armed.pop(owner, ())
        if borrowers:
            alive = sorted(self._live_pids(set(borrowers)))
            self.verdicts.append({"owner": owner, "borrowers": list(borrowers), "how": how,
                                  "alive": alive, "ts": time.time()})  # fmt: skip
        self._unpin(owner)

    def _unpin(self, owner: int) -> None:
        for fd in self.pinned.pop(owner, []):
            os.close(fd)

    def _live_pids(self, namespaces: set[int]) -> list[int]:
        found = []
        for name in os.listdir(self.proc):
            if not name.isdigit():
                continue
            try:
                if os.stat(f"{self.proc}/{name}/ns/pid").st_ino in namespaces and not _zombie(self.proc, name):
                    found.append(int(name))
            except OSError:
                continue
        return found


def _zombie(proc: str, pid: str) -> bool:
    with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as handle:
        return handle.read().rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def instrument(guards: Guards, call: dict[str, object]) -> dict[str, object]:
    """The test instrument's lines: ``{"op": "guard", "owner": ns, "borrowers": [ns, ...], "pids": [...]}``
    and ``{"op": "verdicts"}`` (every verdict so far)."""
    if call.get("op") == "guard":
        listed, owner, pids = call.get("borrowers"), call.get("owner"), call.get("pids")
        try:
            borrowers = [int(b) for b in listed] if isinstance(listed, list) else []
            guards.arm(int(str(owner)), borrowers, [int(p) for p in pids] if isinstance(pids, list) else [])
        except (TypeError, ValueError) as err:
            return {"error": f"bad guard line: {err!r}"}
        return {"armed": True}
    if call.get("op") == "verdicts":
        return {"verdicts": guards.verdicts}
    return {"error": f"unknown op {call.get('op')!r}"}

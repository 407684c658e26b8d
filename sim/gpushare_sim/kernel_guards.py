"""A test instrument of the kernel stand-in, not part of the module: the borrowers an owner's
return must outlive, checked at the instant the owner's blocked call is let go.

On the hook socket: ``{"op": "guard", "owner": ns, "borrowers": [ns, ...]}`` arms a guard,
``{"op": "verdicts"}`` returns every verdict so far.
"""

from __future__ import annotations

import os
import time


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
        self.verdicts: list[dict[str, object]] = []

    def arm(self, owner: int, borrowers: list[int]) -> None:
        self.armed[owner] = tuple(borrowers)

    def settle(self, owner: int, how: str) -> None:
        borrowers = self.armed.pop(owner, ())
        if borrowers:
            alive = sorted(self._live_pids(set(borrowers)))
            self.verdicts.append({"owner": owner, "borrowers": list(borrowers), "how": how,
                                  "alive": alive, "ts": time.time()})  # fmt: skip

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
    """The test instrument's lines: ``{"op": "guard", "owner": ns, "borrowers": [ns, ...]}``
    and ``{"op": "verdicts"}`` (every verdict so far)."""
    if call.get("op") == "guard":
        listed, owner = call.get("borrowers"), call.get("owner")
        try:
            borrowers = [int(b) for b in listed] if isinstance(listed, list) else []
            guards.arm(int(str(owner)), borrowers)
        except (TypeError, ValueError) as err:
            return {"error": f"bad guard line: {err!r}"}
        return {"armed": True}
    if call.get("op") == "verdicts":
        return {"verdicts": guards.verdicts}
    return {"error": f"unknown op {call.get('op')!r}"}

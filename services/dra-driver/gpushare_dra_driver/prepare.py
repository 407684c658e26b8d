"""NodePrepareResources and NodeUnprepareResources: idempotent, persisted, all or nothing.

Prepare, per claim: a claim already prepared answers what it answered before (nothing is
written twice); otherwise the claim is read from the API (outside the lock, the claims of one
call at once), its allocation checked
(:mod:`.claims`), its CDI spec built and checked (:mod:`.cdi`), and the spec file written
with the claim's record in its annotations (:mod:`.state`): one atomic write, after which the
claim is prepared for a restarted driver too; a claim that fails at any step writes nothing
and gets its error. Unprepare removes the spec file; an unknown claim is already unprepared. A claim this process
does not know is looked for in the CDI directory first: during a rolling update another
instance of the driver may have prepared it, and either instance may be asked to unprepare it.
At start, :meth:`Preparer.recover` reads the records back from the spec files, merges those of
an older version's state file (rewriting spec files it names that went missing or carry no
record) and removes spec files of this driver that record nothing (a crash mid-write).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpushare_common import dra, isolation
from gpushare_common.logging import get_logger
from gpushare_common.vendors import VendorResource

from . import cdi
from .cards import Card
from .claims import Allocated, ClaimError, ClaimRef, Slots, allocated
from .state import PreparedClaim, PreparedDevice, PreparedState, record_of, with_record

log = get_logger("dra.prepare")
Obj = dict[str, Any]


class ClaimSource(Protocol):
    async def get_claim(self, namespace: str, name: str) -> Obj: ...


class ClaimUnreadable(Exception):
    """The claim could not be read (gone, or the API failed): the message says which."""


class Files(Protocol):
    def write_spec(self, name: str, doc: Obj) -> None: ...
    def remove_spec(self, name: str) -> None: ...
    def read_spec(self, name: str) -> object: ...
    def has_spec(self, name: str) -> bool: ...
    def spec_names(self) -> list[str]: ...
    def exists(self, path: str) -> bool: ...
    def make_dirs(self, paths: Sequence[str]) -> None: ...
    def drop_state(self) -> None: ...


class RequestError(ValueError):
    """A malformed request (not one claim's problem): the whole call is refused."""


@dataclass
class Node:
    """What prepare needs to know of the node: its pool, cards, vendor table and settings."""

    driver: str
    pool: str
    shares: int
    vendors: Mapping[str, VendorResource]
    device_root: str  # prefix of device nodes' host paths in the CDI specs
    host_root: str  # where this process sees the host's /dev
    mps_dir: str  # the node's MPS directories: every capped share's shadow_dir
    cards: Callable[[], Mapping[str, tuple[Card, bool]]]
    slots: Callable[[], Slots] = dict  # slot devices (unchanged pods' share kinds)


def check_refs(refs: Sequence[ClaimRef]) -> None:
    seen: set[str] = set()
    for index, ref in enumerate(refs):
        for field in ("namespace", "name", "uid"):
            if not getattr(ref, field):
                raise RequestError(f"claims[{index}].{field} is empty (required)")
        if ref.uid in seen:
            raise RequestError(f"claims[{index}]: claim UID {ref.uid} appears twice")
        seen.add(ref.uid)


class Preparer:
    def __init__(self, node: Node, claims: ClaimSource, files: Files, state: PreparedState) -> None:
        self.node = node
        self.claims = claims
        self.files = files
        self.state = state
        self._lock = asyncio.Lock()
        self._profiles: dict[str, isolation.Isolation] = {}  # vendor resource -> its parsed profile

    def shared_cards(self) -> frozenset[str]:
        """Cards with shares prepared here."""
        return frozenset(card for claim in self.state.claims.values()
                         for card, role in zip(claim.cards, claim.roles, strict=False) if role == dra.ROLE_SHARE)

    # --- prepare -------------------------------------------------------------------------

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        """Per claim UID: what was prepared, or why not (a string). The claims not prepared yet
        are read from the API first, all at once and outside the lock (the kubelet prepares
        several pods' claims at the same time: one slow read must not hold the others up)."""
        return (await self.prepare_timed(refs))[0]

    async def prepare_timed(self, refs: Sequence[ClaimRef]) -> tuple[dict[str, PreparedClaim | str], float | None]:
        """:meth:`prepare`, and the seconds its read of the claims from the API took (None: every
        claim was prepared before, nothing was read)."""
        check_refs(refs)
        wanted = [ref for ref in refs if self._known(ref.uid) is None]
        started = time.perf_counter()
        read = await asyncio.gather(*(self._read(ref) for ref in wanted))
        read_s = time.perf_counter() - started if wanted else None
        bodies = {ref.uid: body for ref, body in zip(wanted, read, strict=True)}
        async with self._lock:
            return {ref.uid: await self._prepare_one(ref, bodies.get(ref.uid)) for ref in refs}, read_s

    async def _read(self, ref: ClaimRef) -> Obj | str:
        try:
            return await self.claims.get_claim(ref.namespace, ref.name)
        except ClaimUnreadable as err:
            return str(err)

    def _known(self, uid: str) -> PreparedClaim | None:
        """The claim as prepared here, or by another instance of the driver (a rolling update: the
        old and the new one share the CDI directory, and the kubelet may call either)."""
        known = self.state.claims.get(uid)
        if known is not None and not self.files.has_spec(known.file):  # unprepared by the other one
            del self.state.claims[uid]
            known = None
        if known is None:
            name = cdi.spec_file_name(uid)
            known = record_of(name, self.files.read_spec(name))
            if known is not None and known.uid == uid:
                self.state.claims[uid] = known
        return known

    async def _prepare_one(self, ref: ClaimRef, claim: Obj | str | None) -> PreparedClaim | str:
        known = self._known(ref.uid)
        if known is not None:  # prepared before, by a call that held the lock while this one read,
            return known  # or by the other instance of a rolling update
        if claim is None:  # prepared when this call came, unprepared since (rare): read it now
            claim = await self._read(ref)
        try:
            if isinstance(claim, str):
                raise ClaimUnreadable(claim)
            devices = allocated(claim, ref, self.node.driver, self.node.pool, self.node.cards(),
                                self.node.shares, self.node.slots())
            prepared = self._build(ref, devices)
        except (ClaimUnreadable, ClaimError, cdi.CdiSpecError, isolation.IsolationError, dra.DraNameError) as err:
            log.warning("claim not prepared", claim=ref.key, uid=ref.uid, error=str(err))
            return str(err)
        self._write(prepared)
        log.info("claim prepared", claim=ref.key, uid=ref.uid,
                 devices=",".join(d.device for d in prepared.devices))
        return prepared

    def _build(self, ref: ClaimRef, devices: list[Allocated]) -> PreparedClaim:
        host = self.node.host_root.rstrip("/")
        spec = cdi.claim_spec(ref.uid, devices, self.node.vendors, self.node.device_root,
                              lambda path: self.files.exists(host + path), self._caps)
        cdi.check_spec(spec)
        by_device: dict[str, list[Allocated]] = {}
        for item in devices:
            by_device.setdefault(item.device, []).append(item)
        prepared = tuple(
            PreparedDevice(requests=tuple(sorted({i.request for i in items if i.request})), pool=self.node.pool,
                           device=name,
                           cdi_ids=(dra.cdi_device(items[0].role, ref.uid, items[0].card.id).qualified,))
            for name, items in by_device.items())
        return with_record(PreparedClaim(namespace=ref.namespace, name=ref.name, uid=ref.uid,
                                         file=cdi.spec_file_name(ref.uid), devices=prepared, spec=spec,
                                         roles=tuple(i.role for i in devices),
                                         cards=tuple(i.card.id for i in devices)))

    def _profile(self, resource: str) -> isolation.Isolation | None:
        """The isolation profile of a vendor resource's shares (None: not in the vendor table)."""
        vendor = self.node.vendors.get(resource)
        if vendor is None:
            return None
        found = self._profiles.get(resource)
        if found is None:
            doc = isolation.NVIDIA_MPS if vendor.isolation == "nvidia-mps" else vendor.isolation
            found = isolation.parse_isolation(f"vendor table {resource}", "isolation", doc)
            self._profiles[resource] = found
        return found

    def capped_cards(self, profiles: Sequence[str]) -> frozenset[str]:
        """Cards with prepared shares of an isolation profile in ``profiles`` (those needing a daemon)."""
        vendors = {card.id: card.vendor for card, _ in self.node.cards().values()}
        found = set()
        for claim in self.state.claims.values():
            for card, role in zip(claim.cards, claim.roles, strict=False):
                if role != dra.ROLE_SHARE or card not in vendors:
                    continue
                with contextlib.suppress(isolation.IsolationError):
                    profile = self._profile(vendors[card])
                    if profile is not None and profile.name in profiles:
                        found.add(card)
        return frozenset(found)

    def _caps(self, item: Allocated) -> isolation.ShareEdits | None:
        """A share's caps where its vendor offers them (N = capacity, k = its shares)."""
        found = self._profile(item.card.vendor) if item.role == dra.ROLE_SHARE else None
        if found is None or found.soft:
            return None
        values: dict[str, int | str | None] = {
            "n": self.node.shares, "k": item.shares, "card_memory_mib": item.card.memory_mib,
            "percent": max(100 * item.shares // self.node.shares, 1), "shadow_dir": self.node.mps_dir}
        edits = isolation.compute(found, values, f"share of {item.card.id}")
        self.files.make_dirs([m["source"] for m in edits.mounts])
        return edits

    def _write(self, prepared: PreparedClaim) -> None:
        self.files.write_spec(prepared.file, prepared.spec)
        self.state.claims[prepared.uid] = prepared

    # --- unprepare -----------------------------------------------------------------------

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Per claim UID: "" when it is unprepared (or never was), else why not."""
        check_refs(refs)
        async with self._lock:
            return {ref.uid: self._unprepare_one(ref) for ref in refs}

    def _unprepare_one(self, ref: ClaimRef) -> str:
        known = self._known(ref.uid)
        if known is None:
            return ""
        try:
            self.files.remove_spec(known.file)
        except OSError as err:
            return f"claim {ref.key}: cannot remove {known.file}: {err}"
        del self.state.claims[ref.uid]
        log.info("claim unprepared", claim=ref.key, uid=ref.uid)
        return ""

    # --- start ---------------------------------------------------------------------------

    def recover(self) -> tuple[list[str], list[str]]:
        """(spec files removed as leaks, spec files rewritten) after a restart: the records are
        read back from the spec files; those of an older version's state file are merged."""
        legacy = {c.file: c for c in self.state.claims.values()}
        found: dict[str, PreparedClaim] = {}
        leaks = []
        for name in self.files.spec_names():
            claim = record_of(name, self.files.read_spec(name))
            if claim is not None:
                found[claim.uid] = claim
            elif name not in legacy:
                leaks.append(name)
                self.files.remove_spec(name)
        rewritten = []
        for name, claim in sorted(legacy.items()):
            if claim.uid not in found:  # missing, or written by an older version without its record
                claim = with_record(claim)
                self.files.write_spec(name, claim.spec)
                found[claim.uid] = claim
                rewritten.append(name)
        self.state.claims = found
        self.files.drop_state()
        return leaks, rewritten

    def status(self) -> dict[str, Any]:
        return {uid: {"claim": f"{c.namespace}/{c.name}", "devices": [d.device for d in c.devices],
                      "roles": list(c.roles), "file": c.file}
                for uid, c in sorted(self.state.claims.items())}

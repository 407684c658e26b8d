"""Prepare and unprepare: CDI files written and removed, idempotent, persisted across restarts,
and bad input refused with nothing written."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from gpushare_common import dra
from gpushare_common.vendors import DEFAULT_VENDORS, VendorResource
from gpushare_dra_driver.adapters.files import NodeFiles
from gpushare_dra_driver.claims import ClaimRef
from gpushare_dra_driver.prepare import ClaimUnreadable, Node, Preparer, RequestError
from gpushare_dra_driver.state import RECORD_KEY, PreparedClaim, PreparedState, StateError

from tests.dra.builders import GPU, NODE, card, claim, devices, result

CARDS = [card(0), card(1)]


class Claims:
    """The API's claims, by key (the adapter boundary)."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.reads = 0

    def add(self, body: dict[str, Any]) -> ClaimRef:
        meta = body["metadata"]
        self.claims[f"{meta['namespace']}/{meta['name']}"] = body
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        found = self.claims.get(f"{namespace}/{name}")
        if found is None:
            raise ClaimUnreadable(f"claim {namespace}/{name}: not found")
        return found


def make(tmp_path: Path, claims: Claims, vendors: dict[str, VendorResource] | None = None) -> Preparer:
    files = NodeFiles(str(tmp_path / "cdi"), str(tmp_path / "plugin" / "prepared.json"))
    soft = {GPU: VendorResource(GPU, ("NVIDIA_VISIBLE_DEVICES",), ("/dev/nvidia{id}",))}
    node = Node(dra.DRIVER, NODE, 100, vendors or soft, str(tmp_path), str(tmp_path), str(tmp_path / "iso"),
                lambda: devices(CARDS))
    return Preparer(node, claims, files, files.load_state())


def cdi_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cdi").glob("*")) if (tmp_path / "cdi").exists() else []


async def test_prepare_writes_one_spec_per_claim_and_answers_its_cdi_devices(tmp_path: Path) -> None:
    claims = Claims()
    ref = claims.add(claim(results=[result(f"gpu-{NODE}-0", "25")]))
    result_ = (await make(tmp_path, claims).prepare([ref]))[ref.uid]
    assert isinstance(result_, PreparedClaim)
    (device,) = result_.devices
    assert (device.pool, device.device, device.requests) == (NODE, f"gpu-{NODE}-0", ("gpu",))
    assert device.cdi_ids == (f"{dra.CDI_KIND}=share.{ref.uid}.GPU-{NODE}-0",)
    assert cdi_files(tmp_path) == [f"gpushare.k8s.io-claim-{ref.uid}.json"]
    written = json.loads((tmp_path / "cdi" / cdi_files(tmp_path)[0]).read_text())
    assert written == result_.spec and written["kind"] == dra.CDI_KIND
    record = json.loads(written["annotations"][RECORD_KEY])  # the spec file is the record: one write
    assert (record["uid"], record["name"], record["devices"][0]["cdi_ids"]) == (ref.uid, "c1", list(device.cdi_ids))
    assert not (tmp_path / "plugin" / "prepared.json").exists()


async def test_preparing_twice_reads_and_writes_nothing_the_second_time(tmp_path: Path) -> None:
    claims = Claims()
    ref = claims.add(claim(results=[result(f"gpu-{NODE}-1", "50")]))
    preparer = make(tmp_path, claims)
    first = await preparer.prepare([ref])
    spec = tmp_path / "cdi" / cdi_files(tmp_path)[0]
    stamp = spec.stat().st_mtime_ns
    assert await preparer.prepare([ref]) == first
    assert claims.reads == 1 and spec.stat().st_mtime_ns == stamp


async def test_a_restarted_driver_neither_leaks_nor_prepares_twice(tmp_path: Path) -> None:
    claims = Claims()
    kept = claims.add(claim("kept", results=[result(f"gpu-{NODE}-0", "25")]))
    gone = claims.add(claim("gone", results=[result(f"gpu-{NODE}-1", "25")]))
    preparer = make(tmp_path, claims)
    await preparer.prepare([kept, gone])
    (tmp_path / "cdi" / f"gpushare.k8s.io-claim-{uuid.uuid4()}.json").write_text("{}")  # crash mid-write
    (tmp_path / "cdi" / f"gpushare.k8s.io-claim-{uuid.uuid4()}.json").write_text("{not json")
    (tmp_path / "cdi" / f"gpushare.k8s.io-claim-{gone.uid}.json").unlink()  # removed by hand: unprepared
    (tmp_path / "cdi" / "nvidia.com-gpu.json").write_text("{}")  # not ours: left alone
    again = make(tmp_path, claims)
    leaks, rewritten = again.recover()
    assert len(leaks) == 2 and rewritten == []
    assert cdi_files(tmp_path) == sorted([f"gpushare.k8s.io-claim-{kept.uid}.json", "nvidia.com-gpu.json"])
    reads = claims.reads
    assert (await again.prepare([kept]))[kept.uid] == (await preparer.prepare([kept]))[kept.uid]
    assert claims.reads == reads
    assert await again.unprepare([kept, gone]) == {kept.uid: "", gone.uid: ""}
    assert cdi_files(tmp_path) == ["nvidia.com-gpu.json"]
    fresh = make(tmp_path, claims)
    fresh.recover()
    assert fresh.state.claims == {}


async def test_an_older_versions_state_file_is_merged_and_removed(tmp_path: Path) -> None:
    """Older versions kept the records in one state file and wrote spec files without them: at
    start the records are merged, each spec file gets its record, and the state file goes."""
    claims = Claims()
    old = claims.add(claim("old", results=[result(f"gpu-{NODE}-0", "25")]))
    lost = claims.add(claim("lost", results=[result(f"gpu-{NODE}-1", "25")]))
    prepared = await make(tmp_path, claims).prepare([old, lost])
    legacy = {uid: msgspec.structs.replace(c, spec={k: v for k, v in c.spec.items() if k != "annotations"})
              for uid, c in prepared.items() if isinstance(c, PreparedClaim)}
    state = tmp_path / "plugin" / "prepared.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_bytes(msgspec.json.encode(PreparedState(claims=legacy)))
    (tmp_path / "cdi" / legacy[old.uid].file).write_bytes(msgspec.json.encode(legacy[old.uid].spec))
    (tmp_path / "cdi" / legacy[lost.uid].file).unlink()
    again = make(tmp_path, claims)
    leaks, rewritten = again.recover()
    assert leaks == [] and sorted(rewritten) == sorted([legacy[old.uid].file, legacy[lost.uid].file])
    assert not state.exists() and sorted(again.state.claims) == sorted([old.uid, lost.uid])
    fresh = make(tmp_path, claims)
    fresh.recover()
    assert fresh.state.claims == again.state.claims == prepared
    reads = claims.reads
    assert (await fresh.prepare([old, lost])) == prepared and claims.reads == reads


async def test_unprepare_of_an_unknown_claim_is_already_done(tmp_path: Path) -> None:
    ref = ClaimRef("ml", "never", str(uuid.uuid4()))
    assert await make(tmp_path, Claims()).unprepare([ref]) == {ref.uid: ""}


@pytest.mark.parametrize("body, error", [
    (None, "claim ml/c1: not found"),
    (claim(results=[result("gpu-unknown")]), "unknown device 'gpu-unknown'"),
    (claim(results=[result(f"gpu-{NODE}-0", "250")]), "250 is outside [1, 100]"),
    (claim(), "the claim is not allocated"),
])
async def test_bad_claims_get_their_error_and_nothing_is_written(tmp_path: Path, body: Any, error: str) -> None:
    claims = Claims()
    ref = claims.add(body) if body is not None else ClaimRef("ml", "c1", str(uuid.uuid4()))
    good = claims.add(claim("good", results=[result(f"gpu-{NODE}-1", "25")]))
    results = await make(tmp_path, claims).prepare([ref, good])
    assert isinstance(results[ref.uid], str) and error in str(results[ref.uid])
    assert isinstance(results[good.uid], PreparedClaim)
    assert cdi_files(tmp_path) == [f"gpushare.k8s.io-claim-{good.uid}.json"]


@pytest.mark.parametrize("refs, error", [
    ([ClaimRef("", "c", "u")], r"claims\[0\].namespace is empty"),
    ([ClaimRef("ml", "c", "")], r"claims\[0\].uid is empty"),
    ([ClaimRef("ml", "a", "u"), ClaimRef("ml", "b", "u")], "appears twice"),
])
async def test_malformed_requests_are_refused_whole(tmp_path: Path, refs: list[ClaimRef], error: str) -> None:
    preparer = make(tmp_path, Claims())
    with pytest.raises(RequestError, match=error):
        await preparer.prepare(refs)
    with pytest.raises(RequestError, match=error):
        await preparer.unprepare(refs)
    assert cdi_files(tmp_path) == [] and not (tmp_path / "plugin" / "prepared.json").exists()


async def test_a_capped_share_gets_caps_and_its_directories(tmp_path: Path) -> None:
    claims = Claims()
    ref = claims.add(claim(results=[result(f"gpu-{NODE}-0", "25")]))
    prepared = (await make(tmp_path, claims, DEFAULT_VENDORS).prepare([ref]))[ref.uid]
    assert isinstance(prepared, PreparedClaim)
    env = prepared.spec["devices"][0]["containerEdits"]["env"]  # type: ignore[index]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M" in env and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env
    assert (tmp_path / "iso" / "pipe").is_dir()  # the node's MPS directories


async def test_a_share_whose_caps_cannot_be_computed_is_refused(tmp_path: Path) -> None:
    claims = Claims()
    ref = claims.add(claim(results=[result(f"gpu-{NODE}-0", "25")]))
    CARDS.append(card(5, memory=None))
    try:
        ref = claims.add(claim("nomem", results=[result(f"gpu-{NODE}-5", "25")]))
        results = await make(tmp_path, claims, DEFAULT_VENDORS).prepare([ref])
    finally:
        CARDS.pop()
    assert "card_memory_mib is not known" in str(results[ref.uid])
    assert cdi_files(tmp_path) == []


def test_an_unreadable_state_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "plugin" / "prepared.json"
    path.parent.mkdir()
    path.write_text('{"claims": {"a": {"namespace": 1}}}')
    with pytest.raises(StateError, match=str(path)):
        NodeFiles(str(tmp_path / "cdi"), str(path)).load_state()


class SlowClaims(Claims):
    """Reads that take ``delay_s`` each, counting how many are under way at once."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.reading = self.most = 0

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.reading += 1
        self.most = max(self.most, self.reading)
        try:
            await asyncio.sleep(self.delay_s)
            return await super().get_claim(namespace, name)
        finally:
            self.reading -= 1


async def test_claims_are_read_at_once_and_outside_the_lock(tmp_path: Path) -> None:
    claims = SlowClaims(0.2)
    refs = [claims.add(claim(name=f"c{i}", results=[result(f"gpu-{NODE}-{i % 2}", "25")])) for i in range(4)]
    preparer = make(tmp_path, claims)
    started = time.monotonic()
    # two calls of the kubelet (two pods) at the same time, one of them with three claims
    first, second = await asyncio.gather(preparer.prepare(refs[:3]), preparer.prepare(refs[3:]))
    elapsed = time.monotonic() - started
    assert all(isinstance(r, PreparedClaim) for r in [*first.values(), *second.values()])
    assert claims.most == 4, "every claim's read was under way at once"
    assert elapsed < 0.6, f"reads serialised: {elapsed:.2f} s for four reads of 0.2 s"
    assert len(cdi_files(tmp_path)) == 4


async def test_a_claim_prepared_by_a_call_made_meanwhile_is_written_once(tmp_path: Path) -> None:
    claims = SlowClaims(0.1)
    ref = claims.add(claim(results=[result(f"gpu-{NODE}-0", "25")]))
    preparer = make(tmp_path, claims)
    writes = 0
    write_spec = preparer.files.write_spec

    def counted(name: str, doc: dict[str, Any]) -> None:
        nonlocal writes
        writes += 1
        write_spec(name, doc)

    preparer.files.write_spec = counted  # type: ignore[method-assign]
    first, second = await asyncio.gather(preparer.prepare([ref]), preparer.prepare([ref]))
    assert first == second and isinstance(first[ref.uid], PreparedClaim)
    assert writes == 1


async def test_prepare_reports_its_claims_read_apart_from_the_rest(tmp_path: Path) -> None:
    """bench.dra shows the driver's own time beside the total: the read is timed on its own, and
    a call that reads nothing (every claim prepared before) reports no read."""
    claims = SlowClaims(0.05)
    ref = claims.add(claim(results=[result(f"gpu-{NODE}-0", "25")]))
    preparer = make(tmp_path, claims)
    results, read_s = await preparer.prepare_timed([ref])
    assert isinstance(results[ref.uid], PreparedClaim) and read_s is not None and read_s >= 0.05
    assert (await preparer.prepare_timed([ref]))[1] is None

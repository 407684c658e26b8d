"""MappingCache, ShareDeviceCount, and their persistence in a real JetStream KV bucket."""

from __future__ import annotations

import pytest
from gpushare_common.bus import Bus
from gpushare_common.mapping import (
    IDLE_SPACE,
    MappingCache,
    MappingError,
    PersistentMapping,
    ShareDeviceCount,
)
from gpushare_common.settings import NatsSettings
from hypothesis import given
from hypothesis import strategies as st


def test_use_unuse_and_lookups() -> None:
    cache = MappingCache()
    assert cache.create("gs/s1", ["gs/s1-0", "gs/s1-1"], kind="shadow")
    assert not cache.create("gs/s1", ["gs/s1-0", "gs/s1-1"], kind="shadow")
    assert cache.use("gs/s1", "ml/a", "gs/s1-0")
    assert not cache.use("gs/s1", "ml/a", "gs/s1-0")  # idempotent
    with pytest.raises(MappingError, match="already used by ml/a"):
        cache.use("gs/s1", "ml/b", "gs/s1-0")
    with pytest.raises(MappingError, match="unknown owner"):
        cache.use("gs/none", "ml/b", "x")
    assert cache.users_of("gs/s1") == {"ml/a"}
    assert cache.owner_of("gs/s1-1") == "gs/s1"
    assert cache.free_devices("gs/s1") == ["gs/s1-1"]
    assert not cache.unuse("gs/s1", "ml/b", "gs/s1-0")
    assert cache.unuse("gs/s1", "ml/a", "gs/s1-0")
    assert cache.snapshot() == {"gs/s1": {"gs/s1-0": "", "gs/s1-1": ""}}
    assert cache.delete("gs/s1") is not None and cache.owner_of("gs/s1-0") is None


def test_recreate_keeps_users_of_kept_devices() -> None:
    cache = MappingCache()
    cache.create(IDLE_SPACE, ["spot-a", "spot-b"])
    cache.use(IDLE_SPACE, "b/x", "spot-a")
    cache.create(IDLE_SPACE, ["spot-a", "spot-c"])
    assert cache.snapshot()[IDLE_SPACE] == {"spot-a": "b/x", "spot-c": ""}
    assert cache.owner_of("spot-b") is None
    assert cache.unuse_everywhere("b/x") == [(IDLE_SPACE, "spot-a")]


@pytest.mark.parametrize(("pending", "free", "spec", "create"), [
    (5, 0, 4, 2), (4, 0, 4, 1), (8, 0, 4, 2), (1, 0, 1, 1), (3, 3, 1, 0),
    (5, 4, 4, 1), (0, 0, 4, 0), (0, 7, 4, 0), (9, 1, 2, 4), (17, 0, 16, 2),
])
def test_shadow_pods_to_create(pending: int, free: int, spec: int, create: int) -> None:
    count = ShareDeviceCount(pipelining=-pending, ready=free)
    assert count.shadow_pods_to_create(spec) == create


@given(st.integers(0, 500), st.integers(0, 500), st.integers(1, 16))
def test_creation_formula_covers_demand_without_excess(pending: int, free: int, spec: int) -> None:
    create = ShareDeviceCount(pipelining=-pending, ready=free).shadow_pods_to_create(spec)
    assert free + create * spec >= pending
    assert create == 0 or free + (create - 1) * spec < pending


async def test_mapping_survives_a_client_restart(nats_settings: NatsSettings) -> None:
    first = Bus(nats_settings, "test")
    await first.connect()
    await first.wait_for_stream()
    mapping = PersistentMapping(await first.store("solver", "n1.mapping"))
    mapping.cache.create("dev/owner", ["GPU-0"], kind="spot-owner")
    mapping.cache.create(IDLE_SPACE, ["spot-GPU-0", "spot-GPU 1"])
    mapping.cache.use(IDLE_SPACE, "spot/borrower", "spot-GPU-0")
    assert await mapping.flush() == 2
    mapping.cache.delete("dev/owner")
    assert await mapping.flush() == 1
    await first.drain()

    second = Bus(nats_settings, "test")
    await second.connect()
    restored = PersistentMapping(await second.store("solver", "n1.mapping"))
    assert await restored.load() == 1
    assert restored.cache.snapshot() == {IDLE_SPACE: {"spot-GPU 1": "", "spot-GPU-0": "spot/borrower"}}
    await second.drain()

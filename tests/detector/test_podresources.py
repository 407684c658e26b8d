from __future__ import annotations

from pathlib import Path

import pytest
from gpushare_common.adapters.podresources import PodNotFound, PodResources, PodResourcesError

from tests.detector.podres_server import PodResourcesServer


async def test_list_and_get_over_a_real_grpc_socket(podresources: PodResourcesServer) -> None:
    podresources.table["dev/alice"] = {"main": {"nvidia.com/gpu": ("G2", "G1")}, "dind": {}}
    podresources.table["ns/share"] = {"app": {"gpushare/share-gpu-4": ("ns/s1-0",)}}
    client = PodResources(str(podresources.socket), timeout_s=2)
    try:
        assert await client.list() == {
            "dev/alice": {"main": {"nvidia.com/gpu": ("G1", "G2")}, "dind": {}},
            "ns/share": {"app": {"gpushare/share-gpu-4": ("ns/s1-0",)}},
        }
        assert await client.get("dev", "alice") == {"main": {"nvidia.com/gpu": ("G1", "G2")}, "dind": {}}
        with pytest.raises(PodNotFound, match="ns/ghost"):
            await client.get("ns", "ghost")
    finally:
        await client.close()


async def test_missing_kubelet_is_a_typed_error(tmp_path: Path) -> None:
    client = PodResources(str(tmp_path / "absent.sock"), timeout_s=0.5)
    try:
        with pytest.raises(PodResourcesError, match=r"UNAVAILABLE|DEADLINE"):
            await client.list()
    finally:
        await client.close()

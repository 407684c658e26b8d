"""The kubelet-plugin contract of a rolling update (kubelet 1.33+): the new instance of the
driver registers under its own sockets beside the old one, the kubelet moves to it, the old one
stops; claims prepared before, during and after the switch run, and every one is unprepared
by whichever instance the kubelet asks, each exactly once, with no spec file left."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from gpushare_common import dra
from gpushare_common.settings import NatsSettings, SettingsError
from gpushare_common.vendors import load_vendor_table
from gpushare_dra_driver.app import Service
from gpushare_dra_driver.claims import ClaimRef
from gpushare_dra_driver.prepare import Preparer
from gpushare_dra_driver.settings import DraSettings
from gpushare_sim.node.testing import wait_until

from tests.dra.builders import NODE, claim, result
from tests.dra.harness import DraNode, common, dra_node, driver_settings
from tests.dra.test_prepare import Claims, cdi_files, make
from tests.support.kubeapi import (
    KubeApi,
    kube_api,  # noqa: F401  (the fixture)
)

SHARE = {"deviceClassName": dra.SHARE_CLASS, "capacity": {"requests": {dra.SHARES: "25"}}}


def test_an_instance_gets_sockets_of_its_own() -> None:
    plain, named = DraSettings(), DraSettings(instance="0b6d2f1e-9c4a")
    assert plain.registration_socket.endswith("/gpushare.k8s.io-reg.sock") and plain.dra_socket.endswith("/dra.sock")
    assert named.registration_socket.endswith("/gpushare.k8s.io-0b6d2f1e-9c4a-reg.sock")
    assert named.dra_socket.endswith("/dra-0b6d2f1e-9c4a.sock")
    with pytest.raises(SettingsError, match="GPUSHARE_DRA_INSTANCE"):
        DraSettings(instance="../x")


async def test_either_instance_unprepares_what_the_other_prepared(tmp_path: Path) -> None:
    """Two instances on one CDI directory: a claim the old one prepared after the new one
    started is unknown to the new one's memory, yet the new one unprepares it, and the old one
    does not answer from memory for a claim the new one removed."""
    claims = Claims()
    old, new = make(tmp_path, claims), make(tmp_path, claims)
    new.recover()
    late = claims.add(claim("late", results=[result(f"gpu-{NODE}-0", "25")]))
    prepared = (await old.prepare([late]))[late.uid]
    reads = claims.reads
    assert (await new.prepare([late]))[late.uid] == prepared and claims.reads == reads  # from its file
    assert await new.unprepare([late]) == {late.uid: ""} and cdi_files(tmp_path) == []
    assert await old.unprepare([late]) == {late.uid: ""}  # again, by the other: nothing to do
    again = (await old.prepare([late]))[late.uid]  # asked again (a rollback): written again
    assert again == prepared and cdi_files(tmp_path) == [f"gpushare.k8s.io-claim-{late.uid}.json"]
    never = ClaimRef("ml", "never", str(uuid.uuid4()))
    assert await new.unprepare([late, never]) == {late.uid: "", never.uid: ""} and cdi_files(tmp_path) == []


async def test_a_rolling_update_prepares_across_the_switch(kube_api: KubeApi,  # noqa: F811
                                                           nats_settings: NatsSettings) -> None:
    async with dra_node(kube_api, nats_settings, gpus=2, instance="old") as node:
        plugins = node.sim.dra
        assert plugins is not None
        old_socket = node.driver.settings.dra_socket
        await wait_until(lambda: plugins.endpoints(dra.DRIVER) == [old_socket], 15, "the old instance registered")
        await wait_until(node.slice_devices, 15, "the node's slice")
        await node.classes()
        await node.template("quarter", SHARE)
        await node.pod("before", "quarter")
        await node.running("before")
        settings = driver_settings(node.sim.settings.node_dir, instance="new")
        vendors = load_vendor_table(str(node.sim.settings.node_dir / "runtime.json"))
        new = Service(common(node.name, kube_api.kubeconfig, nats_settings), settings, vendors)
        await new.start()
        try:
            await wait_until(lambda: plugins.endpoints(dra.DRIVER) == [old_socket, settings.dra_socket], 15,
                             "both instances registered, the new one in use")
            await node.pod("during", "quarter")  # prepared by the new instance while the old one serves too
            await node.running("during")
            def during(preparer: Preparer) -> bool:
                return any(c.name.startswith("during-") for c in preparer.state.claims.values())

            assert during(new.preparer) and not during(node.driver.preparer), "the kubelet called the new one"
            await node.driver.close()  # the old pod goes: its sockets with it
            await wait_until(lambda: plugins.endpoints(dra.DRIVER) == [settings.dra_socket], 15,
                             "the old instance deregistered")
            await node.pod("after", "quarter")
            await node.running("after")
            for name in ("before", "during", "after"):
                await node.kube.delete_pod("default", name)
            await wait_until(lambda: _gone(node, ("before", "during", "after")), 30, "pods gone, claims unprepared")
            assert new.files.spec_names() == [] and new.preparer.state.claims == {}
        finally:
            await new.close()


async def _gone(node: DraNode, names: tuple[str, ...]) -> bool:
    phases = [await node.phase(n) for n in names]
    claims = node.sim.kubelet.claims
    return all(p == "gone" for p in phases) and claims is not None and not claims.prepared

"""Property tests: any device-ID input yields a typed error (or a valid answer), never a crash.

The logic is checked directly with many examples; a real plugin gRPC server
(in its own thread and event loop) is checked with fewer, through a real
channel, so that every refusal is seen as the gRPC status the kubelet gets.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from gpushare_common import ids
from gpushare_common.adapters.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpushare_common.adapters.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pbg
from gpushare_common.pods import PodRules
from gpushare_deviceplugin.errors import PluginError
from gpushare_deviceplugin.handlers.base import PluginLogic, PreferredRequest, Signer
from gpushare_deviceplugin.handlers.share import ShadowPodView, ShareLogic, shadow_view
from gpushare_deviceplugin.handlers.spot import SpotLogic
from gpushare_deviceplugin.plugins.metrics import PluginMetrics
from gpushare_deviceplugin.plugins.plugin import DevicePlugin
from gpushare_sim.shorttmp import short_mkdtemp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from .conftest import KEY, NODE

KNOWN_SHARE = [f"ns/shadow-a-{i}" for i in range(4)]
KNOWN_SPOT = ["spot-GPU-0", "spot-GPU-1"]
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.FAILED_PRECONDITION}

device_id = st.one_of(
    st.sampled_from(KNOWN_SHARE + KNOWN_SPOT + ["", "-", "/", "spot-", "ns/-0", "ns/x-01",
                                                "ns/shadow-a-99999999", "a/b/c-1"]),
    st.text(max_size=40),
    st.builds(lambda ns, name, i: f"{ns}/{name}-{i}", st.from_regex(r"[a-z]{1,5}", fullmatch=True),
              st.from_regex(r"[a-z][-a-z]{0,8}", fullmatch=True), st.integers(-3, 9)),
    st.builds(lambda s: f"spot-{s}", st.text(max_size=20)),
)
id_lists = st.lists(device_id, max_size=6)


def logics() -> list[PluginLogic]:
    share = ShareLogic("gpushare/share-gpu-4", 4, Signer(KEY, NODE))
    share.replace_shadows([ShadowPodView("ns", "shadow-a", "share", 4)])
    spot = SpotLogic("gpushare/spot-gpu", Signer(KEY, NODE))
    spot.set_vendor_cards("nvidia.com/gpu", {"GPU-0": "Healthy", "GPU-1": "Healthy"})
    spot.apply_health({"spot-GPU-0": "Healthy"}, full=True)
    return [share, spot]


LOGICS = logics()


@settings(max_examples=300, deadline=None)
@given(st.lists(id_lists, max_size=3))
def test_allocate_answers_or_refuses(containers: list[list[str]]) -> None:
    for logic in LOGICS:
        try:
            answers = logic.allocate(containers)
        except PluginError as err:
            assert err.code in ("invalid-argument", "not-found", "failed-precondition")
            assert logic.resource in str(err)
            continue
        assert len(answers) == len(containers) > 0
        assert all(set(c) <= set(logic.board.devices()) for c in containers)


@settings(max_examples=300, deadline=None)
@given(id_lists, id_lists, st.integers(-2, 8))
def test_preferred_answers_or_refuses(available: list[str], must: list[str], size: int) -> None:
    request = PreferredRequest(tuple(available), tuple(must), size)
    for logic in LOGICS:
        try:
            [chosen] = logic.preferred([request])
        except PluginError as err:
            assert err.code == "invalid-argument"
            continue
        assert len(chosen) == size
        assert set(must) <= set(chosen) <= set(available)
        assert len(set(chosen)) == size


class ThreadedPlugins:
    """Real plugin gRPC servers served from a background event loop."""

    def __init__(self) -> None:
        self.dir = str(short_mkdtemp("dpp-"))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        metrics = PluginMetrics(CollectorRegistry())
        self.plugins = [DevicePlugin(logic, self.dir, metrics) for logic in LOGICS]

    def __enter__(self) -> ThreadedPlugins:
        self.thread.start()
        for plugin in self.plugins:
            asyncio.run_coroutine_threadsafe(plugin.start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        for plugin in self.plugins:
            asyncio.run_coroutine_threadsafe(plugin.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def stubs() -> Iterator[list[Any]]:
    with ThreadedPlugins() as served:
        channels = [grpc.insecure_channel(f"unix://{p.socket_path}") for p in served.plugins]
        yield [pbg.DevicePluginStub(c) for c in channels]
        for channel in channels:
            channel.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(id_lists, max_size=3), id_lists, st.integers(-1, 5))
def test_grpc_never_crashes(stubs: list[Any], containers: list[list[str]],
                            available: list[str], size: int) -> None:
    allocate = pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=c) for c in containers])
    preferred = pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available,
                                               allocation_size=size)])
    for stub in stubs:
        for call, request in ((stub.Allocate, allocate), (stub.GetPreferredAllocation, preferred)):
            try:
                call(request, timeout=5)
            except grpc.RpcError as err:
                assert err.code() in REFUSALS, err
                assert err.details()


json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=3),
    max_leaves=12,
)
pod_like = st.fixed_dictionaries({}, optional={
    "metadata": st.fixed_dictionaries({}, optional={
        "namespace": st.sampled_from(["gpushare-system", "ns", "", "Bad_NS"]) | st.text(max_size=8),
        "name": st.sampled_from(["shadow-a", "-x"]) | json_value,
        "labels": st.just({ids.LABEL_POD_DESCRIPTION: ids.SHADOW_POD_LABEL_VALUE,
                           "app.kubernetes.io/managed-by": "gpushare-shadow-controller"}) | json_value,
        "annotations": st.dictionaries(st.sampled_from([ids.ANN_SHARE_SPEC, ids.ANN_SHARE_KIND]),
                                       st.text(max_size=6)) | json_value,
        "deletionTimestamp": json_value,
    }),
    "spec": st.fixed_dictionaries({}, optional={"containers": st.lists(
        st.dictionaries(st.sampled_from(["name", "resources"]), json_value), max_size=3)}),
    "status": st.just({"phase": "Running"}) | json_value,
})


@settings(max_examples=300, deadline=None)
@given(pod_like)
def test_shadow_view_never_raises(pod: dict[str, Any]) -> None:
    view = shadow_view(pod, PodRules())
    if view is not None:
        assert view.namespace == "gpushare-system"
        assert isinstance(view.spec, int) and isinstance(view.container, str)
        assert view.key == f"{view.namespace}/{view.name}"


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=20), st.sampled_from(["Healthy", "Unhealthy"]),
                       max_size=5), st.booleans())
def test_any_desired_health_is_accepted(devices: dict[str, Any], full: bool) -> None:
    for logic in logics():
        logic.apply_health(devices, full)
        assert set(logic.board.devices().values()) <= {"Healthy", "Unhealthy"}

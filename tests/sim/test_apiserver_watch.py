"""Watch semantics through the official client: versions, 410 Gone, bookmarks, selectors."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from gpushare_sim.apiserver import ApiSettings, Store, objects
from gpushare_sim.apiserver.kinds import PODS
from gpushare_sim.apiserver.store import Selection
from gpushare_sim.apiserver.watch import WatchOptions, stream_events
from kubernetes import client, watch
from kubernetes.client import ApiException

from tests.support import kubeapi
from tests.support.kubeapi import KubeApi, pod_manifest, start_kube_api

kube_api = kubeapi.kube_api
LIMIT = 10  # seconds: a watch that sees nothing ends the test instead of hanging it


def take(events: Iterator[dict[str, Any]], count: int) -> list[tuple[str, str]]:
    """The first `count` events as (type, name)."""
    seen = []
    for event in events:
        seen.append((event["type"], event["raw_object"]["metadata"].get("name", "")))
        if len(seen) == count:
            break
    return seen


@pytest.fixture
def core(kube_api: KubeApi) -> client.CoreV1Api:
    kube_api.namespaces("a", "b")
    return client.CoreV1Api(kube_api.client)


def test_watch_from_a_version_replays_what_followed(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("before"))
    version = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod_manifest("p1"))
    core.patch_namespaced_pod("p1", "default", {"metadata": {"labels": {"x": "1"}}})
    core.delete_namespaced_pod("p1", "default")
    stream = watch.Watch().stream(
        core.list_namespaced_pod, "default", resource_version=version, timeout_seconds=LIMIT
    )
    assert take(stream, 3) == [("ADDED", "p1"), ("MODIFIED", "p1"), ("DELETED", "p1")]


def test_watch_without_version_starts_with_current_state(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("a", pod_manifest("p1"))
    core.create_namespaced_pod("b", pod_manifest("p2"))
    stream = watch.Watch().stream(core.list_pod_for_all_namespaces, timeout_seconds=LIMIT)
    assert sorted(take(stream, 2)) == [("ADDED", "p1"), ("ADDED", "p2")]


def test_live_events_reach_a_watcher(kube_api: KubeApi, core: client.CoreV1Api) -> None:
    version = core.list_namespaced_pod("default").metadata.resource_version
    writer_api = kube_api.new_client()
    writer = client.CoreV1Api(writer_api)

    def write() -> None:
        for index in range(3):
            writer.create_namespaced_pod("default", pod_manifest(f"p{index}"))

    thread = threading.Thread(target=write)
    stream = watch.Watch().stream(
        core.list_namespaced_pod, "default", resource_version=version, timeout_seconds=LIMIT
    )
    thread.start()
    try:
        assert take(stream, 3) == [("ADDED", "p0"), ("ADDED", "p1"), ("ADDED", "p2")]
    finally:
        thread.join()
        writer_api.close()


def test_field_selector_watch_sees_pods_enter_and_leave(core: client.CoreV1Api) -> None:
    version = core.list_pod_for_all_namespaces().metadata.resource_version
    core.create_namespaced_pod("default", pod_manifest("elsewhere", "node-2"))
    core.create_namespaced_pod("default", pod_manifest("p1"))
    binding = {"metadata": {"name": "p1"}, "target": {"kind": "Node", "name": "node-1"}}
    core.create_namespaced_pod_binding("p1", "default", binding, _preload_content=False)
    core.patch_namespaced_pod_status("p1", "default", {"status": {"phase": "Succeeded"}})
    stream = watch.Watch().stream(
        core.list_pod_for_all_namespaces,
        field_selector="spec.nodeName=node-1,status.phase!=Succeeded",
        resource_version=version,
        timeout_seconds=LIMIT,
    )
    assert take(stream, 2) == [("ADDED", "p1"), ("DELETED", "p1")]


def test_label_selector_watch(core: client.CoreV1Api) -> None:
    version = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod_manifest("other", labels={"app": "y"}))
    core.create_namespaced_pod("default", pod_manifest("mine", labels={"app": "x"}))
    stream = watch.Watch().stream(
        core.list_namespaced_pod, "default", label_selector="app=x",
        resource_version=version, timeout_seconds=LIMIT,
    )
    assert take(stream, 1) == [("ADDED", "mine")]


def test_expired_version_gives_410_and_relist_recovers(tmp_path: Path) -> None:
    with start_kube_api(ApiSettings(history=3), tmp_path) as api:
        core = client.CoreV1Api(api.client)
        old = core.list_namespaced_pod("default").metadata.resource_version
        for index in range(5):
            core.create_namespaced_pod("default", pod_manifest(f"p{index}"))
        with pytest.raises(ApiException) as error:
            take(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=old), 1)
        assert error.value.status == 410
        listed = core.list_namespaced_pod("default")
        assert len(listed.items) == 5
        core.delete_namespaced_pod("p0", "default")
        stream = watch.Watch().stream(
            core.list_namespaced_pod, "default",
            resource_version=listed.metadata.resource_version, timeout_seconds=LIMIT,
        )
        assert take(stream, 1) == [("DELETED", "p0")]


def test_timeout_ends_the_stream(core: client.CoreV1Api) -> None:
    events = list(watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1))
    assert events == []


def test_bookmarks_carry_the_current_version(tmp_path: Path) -> None:
    settings = ApiSettings(bookmark_interval=0.05)
    with start_kube_api(settings, tmp_path) as api:
        core = client.CoreV1Api(api.client)
        created = core.create_namespaced_pod("default", pod_manifest("p1"))
        stream = watch.Watch().stream(
            core.list_namespaced_pod, "default", allow_watch_bookmarks=True,
            resource_version=created.metadata.resource_version, timeout_seconds=LIMIT,
        )
        event = next(iter(stream))
        assert event["type"] == "BOOKMARK"
        assert event["raw_object"]["metadata"]["resourceVersion"] == created.metadata.resource_version


async def test_slow_watcher_is_dropped_with_410() -> None:
    """A watcher whose queue is full stops receiving and ends with an ERROR 410 event."""
    store = Store(watch_queue=2)
    watcher, first = store.watch(Selection(PODS), since=store.rv)
    assert first == []
    for index in range(3):  # nobody reads while the writer goes on
        objects.create(store, PODS, "default", pod_manifest(f"p{index}"))
    assert watcher.overflowed
    options = WatchOptions(timeout=LIMIT, bookmarks=False, bookmark_interval=1.0)
    lines = b"".join([chunk async for chunk in stream_events(store, watcher, first, options)])
    events = [msgspec.json.decode(line) for line in lines.splitlines()]
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "ERROR"]
    assert events[-1]["object"]["code"] == 410
    assert watcher not in store.watchers["pods"]


async def test_closing_watchers_ends_streams() -> None:
    store = Store()
    watcher, first = store.watch(Selection(PODS), since=None)
    options = WatchOptions(timeout=None, bookmarks=False, bookmark_interval=1.0)
    store.close_watchers()
    assert [chunk async for chunk in stream_events(store, watcher, first, options)] == []


def test_a_client_that_goes_away_leaves_no_watcher(kube_api: KubeApi, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod_manifest("p1"))
    stream = watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=LIMIT)
    assert take(stream, 1) == [("ADDED", "p1")]
    stream.close()  # closes the response: the server sees the connection go

    def open_watches() -> int:
        return kube_api.server.call(lambda: sum(len(w) for w in kube_api.store.watchers.values()))

    deadline = time.monotonic() + LIMIT
    while open_watches() and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the server's state: there is no event to wait on
    assert open_watches() == 0

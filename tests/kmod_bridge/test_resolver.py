"""Pid namespace -> container resolution: real pid namespaces (unshare), cgroup paths, task states."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpushare_common.adapters.containerd import Task
from gpushare_kmod_bridge.adapters.containerd import identity, live
from gpushare_kmod_bridge.adapters.procfs import (
    KUBELET_PATTERN,
    CgroupSource,
    host_pidns,
    match_cgroup,
    pidns_of,
)
from gpushare_kmod_bridge.resolver import ContainerProcs, ResolveError, Resolver, merge, split_key
from hypothesis import given
from hypothesis import strategies as st

from .conftest import PidnsProcess

CID = "a" * 64
TEST_PATTERN = r"gpushare-test-\w+/(?P<namespace>[^_/]+)_(?P<pod>[^_/]+)_(?P<container>[^_/]+)_(?P<container_id>\w+)$"


class FixedSource:
    name = "fixed"

    def __init__(self, *items: ContainerProcs) -> None:
        self.items = list(items)

    async def containers(self) -> list[ContainerProcs]:
        return list(self.items)


def resolver(*sources: FixedSource | CgroupSource) -> Resolver:
    return Resolver(list(sources), pidns_of, host_pidns(), min_refresh_s=0.0)


async def test_real_pid_namespace_resolves_both_ways(pidns_process: PidnsProcess) -> None:
    source = FixedSource(ContainerProcs("c1", (pidns_process.pid, os.getpid()), "team-a/dev-1", "main"))
    res = resolver(source)
    owner = await res.owner(pidns_process.pidns)
    assert owner is not None and (owner.pod, owner.container) == ("team-a/dev-1", "main")
    assert await res.owner(host_pidns() or 0) is None  # the host's own namespace is no container's
    found = await res.namespaces(["team-a/dev-1", "team-a/dev-1/main", "team-a/dev-1/other"])
    assert found == {"team-a/dev-1": [pidns_process.pidns], "team-a/dev-1/main": [pidns_process.pidns],
                     "team-a/dev-1/other": []}


async def test_new_and_stopped_containers_show_up_on_refresh() -> None:
    source = FixedSource()
    res = resolver(source)
    first, second = PidnsProcess(), PidnsProcess()
    try:
        assert await res.owner(first.pidns) is None
        source.items.append(ContainerProcs("c1", (first.pid,), "ns/p1", "main"))
        assert (await res.owner(first.pidns)) is not None  # unknown -> refreshed at once
        source.items = [ContainerProcs("c2", (second.pid,), "ns/p2", "main")]
        second_owner = await res.owner(second.pidns)
        assert second_owner is not None and second_owner.pod == "ns/p2"
        await res.refresh()
        assert first.pidns not in res.snapshot.owners
    finally:
        first.stop()
        second.stop()


@pytest.fixture
def test_cgroup() -> Iterator[Path]:
    """A cgroup (v2, or v1 ``pids``) named as the test pattern expects; removed afterwards."""
    for base in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if (base / "cgroup.procs").exists() and os.access(base, os.W_OK):
            break
    else:
        pytest.skip("no writable cgroup hierarchy (needs root)")
    top = base / f"gpushare-test-{uuid.uuid4().hex[:8]}"
    leaf = top / f"team-b_infer-0_main_{CID[:12]}"
    try:
        leaf.mkdir(parents=True)
    except OSError as err:
        pytest.skip(f"cannot create a cgroup under {base}: {err}")
    yield leaf
    leaf.rmdir()
    top.rmdir()


async def test_cgroup_source_with_a_real_pid_namespace(test_cgroup: Path) -> None:
    process = PidnsProcess()
    try:
        (test_cgroup / "cgroup.procs").write_text(str(process.pid))
        res = resolver(CgroupSource(TEST_PATTERN))
        owner = await res.owner(process.pidns)
        assert owner is not None
        assert (owner.pod, owner.container, owner.container_id) == ("team-b/infer-0", "main", CID[:12])
        assert await res.namespaces(["team-b/infer-0/main"]) == {"team-b/infer-0/main": [process.pidns]}
    finally:
        process.stop()


def test_kubelet_layouts_match() -> None:
    pattern = re.compile(KUBELET_PATTERN)
    uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    lines = [
        f"0::/kubepods/burstable/pod{uid}/{CID}",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid.replace('-', '_')}.slice/"
        f"cri-containerd-{CID}.scope",
        f"4:memory:/kubepods/pod{uid}/{CID}\n0::/",
    ]
    for line in lines:
        assert match_cgroup(line, pattern) == {"container_id": CID}, line
    assert match_cgroup("0::/user.slice/session-1.scope", pattern) is None


@given(st.text(max_size=300))
def test_cgroup_matching_never_raises(text: str) -> None:
    found = match_cgroup(text, re.compile(KUBELET_PATTERN))
    assert found is None or len(found["container_id"]) == 64


def test_only_live_tasks_with_a_pid_are_resolved() -> None:
    tasks = [Task("box1", 1234, "RUNNING"), Task("box2", 0, "STOPPED", 137), Task("box3", 77, "PAUSED"),
             Task("box4", 0, "CREATED"), Task("box5", 88, "STOPPED"), Task("box6", 99, "PAUSING")]
    assert [t.container_id for t in live(tasks)] == ["box1", "box3", "box6"]


def test_identity_from_labels_or_annotations() -> None:
    cri = {"io.kubernetes.cri.sandbox-namespace": "ns", "io.kubernetes.cri.sandbox-name": "pod",
           "io.kubernetes.cri.container-name": "main"}
    kubelet = {"io.kubernetes.pod.namespace": "ns2", "io.kubernetes.pod.name": "p2",
               "io.kubernetes.container.name": "c2"}
    assert identity({}, cri) == ("ns/pod", "main")
    assert identity(kubelet, {}) == ("ns2/p2", "c2")
    assert identity(kubelet, cri) == ("ns2/p2", "c2")  # labels first
    assert identity({"io.kubernetes.pod.namespace": "ns2"}, {}) == ("", "")  # half an identity is none
    assert identity({}, {}) == ("", "")


def test_merge_joins_sources_by_container_id() -> None:
    merged = merge([ContainerProcs("c", (3, 1)), ContainerProcs("c", (2,), "ns/p", "main"),
                    ContainerProcs("d", (9,))])
    assert sorted(merged, key=lambda c: c.container_id) == [
        ContainerProcs("c", (1, 2, 3), "ns/p", "main"), ContainerProcs("d", (9,))]


@given(st.text(max_size=40))
def test_split_key_accepts_only_pod_keys(key: str) -> None:
    try:
        pod, container = split_key(key)
    except ResolveError as err:
        assert err.key == key
    else:
        assert f"{pod}/{container}".rstrip("/") == key and pod.count("/") == 1


def test_cgroup_pattern_needs_a_container_id_group() -> None:
    with pytest.raises(ValueError, match="container_id"):
        CgroupSource(r"kubepods/(?P<pod>\w+)")


async def test_same_container_says_false_only_on_a_positive_difference(pidns_process: PidnsProcess) -> None:
    """A notice's pid is judged only when it is a process of the notice's namespace: a pid that is
    not (gone, or numbered inside a container) cannot be told, and must never wake the caller."""
    cgroups = {pidns_process.pid: "0::/kubepods/pod-a/c1\n", os.getpid(): "0::/kubepods/pod-b/c2\n"}
    res = Resolver([FixedSource(ContainerProcs("c1", (pidns_process.pid,), "ns/dev", "main"))], pidns_of,
                   host_pidns(), min_refresh_s=0.0, cgroup_of=cgroups.get)
    await res.refresh()
    ns = pidns_process.pidns
    assert res.same_container("c1", pidns_process.pid, ns) is True
    assert res.same_container("c1", os.getpid(), ns) is None  # this pid lives in another namespace
    assert res.same_container("c1", 1, ns) is None  # pid 1 of the host, as a pid inside the container
    assert res.same_container("c-unknown", pidns_process.pid, ns) is None  # no known pid to compare
    cgroups[pidns_process.pid] = "0::/kubepods/pod-x/c9\n"
    assert res.same_container("c1", pidns_process.pid, ns) is True  # both read alike: the same process
    res.snapshot.pids["c1"] = (os.getpid(),)  # a known pid of c1 in another cgroup than the caller's
    assert res.same_container("c1", pidns_process.pid, ns) is False

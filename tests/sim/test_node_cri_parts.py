"""The CRI path's pure parts: the CRI log format read back, the drop-in rendered for a private
containerd, the node's images as OCI archives, and the sandbox and container configs the kubelet
sends (the Allocate response in the container's, the pod's annotations with the sandbox)."""

from __future__ import annotations

import json
import tarfile
import tomllib
from pathlib import Path

import grpc
import pytest
from gpushare_common.adapters.kubeletapi import cri_runtime_v1_pb2 as cri
from gpushare_sim.containerd_cri import CRI_HANDLER, CRI_PLUGIN, SHIPPED_DROP_IN, CriConfig, DropInError, render_drop_in
from gpushare_sim.node import logs
from gpushare_sim.node.adapters.cri import CriClient, CriMissing, CriUnavailable
from gpushare_sim.node.adapters.crirunner import container_config, sandbox_config
from gpushare_sim.node.adapters.images import ImageError, ImageSpec, oci_archive
from gpushare_sim.node.model import BindMount, ContainerSpec, DeviceNode, LogFile, parse_pod
from gpushare_sim.node.testing import pod_manifest
from hypothesis import given
from hypothesis import strategies as st

TEXT = st.binary(max_size=40).filter(lambda b: b"\n" not in b)
RECORDS = st.lists(st.tuples(st.sampled_from([b"stdout", b"stderr"]), TEXT, st.booleans()), max_size=12)


def cri_log(records: list[tuple[bytes, bytes, bool]]) -> bytes:
    return b"".join(b"2026-01-01T00:00:00.000000001Z %s %s %s\n" % (stream, b"F" if full else b"P", text)
                    for stream, text, full in records)  # fmt: skip


def written(records: list[tuple[bytes, bytes, bool]]) -> bytes:
    return b"".join(text + (b"\n" if full else b"") for _, text, full in records)


@given(RECORDS, st.lists(st.integers(min_value=1, max_value=64), max_size=8))
def test_cri_records_read_back_as_written_however_the_reads_cut_them(
        records: list[tuple[bytes, bytes, bool]], cuts: list[int]) -> None:
    data, decoder, out, at = cri_log(records), logs.CriDecoder(), b"", 0
    for size in cuts:
        out, at = out + decoder.feed(data[at:at + size]), at + size
    assert out + decoder.feed(data[at:]) + decoder.end() == written(records)


@given(st.binary(max_size=60).filter(lambda b: b"\n" not in b))
def test_any_line_gives_text_never_an_error(line: bytes) -> None:
    text = logs.cri_record(line)
    parts = line.split(b" ", 3)
    if len(parts) >= 3 and parts[1] in (b"stdout", b"stderr"):
        assert line.endswith(text.rstrip(b"\n")) or text in (b"", b"\n")
    else:
        assert text == line + b"\n"  # not a CRI record: passed on as it is


async def test_a_cri_log_served_with_tail_and_limit(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(cri_log([(b"stdout", b"one", True), (b"stderr", b"tw", False), (b"stderr", b"o", True),
                              (b"stdout", b"three", True)]))  # fmt: skip
    source = logs.LogSource(LogFile(path, cri=True), lambda: False)

    async def served(request: logs.LogRequest) -> bytes:
        return b"".join([chunk async for chunk in logs.stream(source, request)])

    assert await served(logs.LogRequest()) == b"one\ntwo\nthree\n"
    assert await served(logs.LogRequest(tail_lines=1)) == b"three\n"
    assert await served(logs.LogRequest(limit_bytes=6)) == b"one\ntw"


def test_the_drop_in_rendered_for_one_instance(tmp_path: Path) -> None:
    config = CriConfig(Path("/opt/bin/gpushare-runtime"), "gpushare.local/pause:1")
    plugin = tomllib.loads(render_drop_in(SHIPPED_DROP_IN.read_text(), config, tmp_path))["plugins"][CRI_PLUGIN]
    handler = plugin["containerd"]["runtimes"][CRI_HANDLER]
    assert handler["options"]["BinaryName"] == "/opt/bin/gpushare-runtime"
    assert handler["options"]["Root"] == str(tmp_path / "runc")  # not runc's default, shared by all
    assert handler["pod_annotations"] == handler["container_annotations"] == ["gpushare.k8s.io/*"]
    assert plugin["sandbox_image"] == "gpushare.local/pause:1"
    assert plugin["cni"]["conf_dir"].startswith(str(tmp_path))


@pytest.mark.parametrize(("text", "reason"), [
    ("version = 2\n", "expected one BinaryName line, found 0"),
    ('BinaryName = "a"\nBinaryName = "b"\n', "expected one BinaryName line, found 2"),
    ('[plugins.x]\n  BinaryName = "a"\n', "no gpushare runtime handler in it"),
])  # fmt: skip
def test_a_drop_in_of_another_shape_is_refused_clearly(tmp_path: Path, text: str, reason: str) -> None:
    with pytest.raises(DropInError, match=reason):
        render_drop_in(text, CriConfig(Path("/bin/runc"), "p:1"), tmp_path)


def test_an_image_archive_is_the_same_for_the_same_directory(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "pause").write_bytes(b"\x7fELF")
    (root / "bin" / "sh").symlink_to("pause")
    first = oci_archive(ImageSpec("gpushare.local/pause:1", root, ("/bin/pause",)), tmp_path / "a.tar").read_bytes()
    second = oci_archive(ImageSpec("gpushare.local/pause:1", root, ("/bin/pause",)), tmp_path / "b.tar").read_bytes()
    assert first == second
    with tarfile.open(tmp_path / "a.tar") as archive:
        index = json.loads(archive.extractfile("index.json").read())  # type: ignore[union-attr]
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == "gpushare.local/pause:1"
    with pytest.raises(ImageError, match="is not a directory"):
        oci_archive(ImageSpec("x:1", tmp_path / "missing"), tmp_path / "c.tar")


def test_the_kubelets_configs_carry_the_pod_and_the_allocate_response(tmp_path: Path) -> None:
    pod = parse_pod(pod_manifest("p", ["sleep", "1"], namespace="team-a", uid="u-1",
                                 annotations={"team.example/x": "1", "gpushare.k8s.io/y": "2"}))  # fmt: skip
    spec = ContainerSpec("k" * 64, ["gpuload", "--once"], {"NVIDIA_VISIBLE_DEVICES": "GPU-0"},
                         [DeviceNode("/dev/nvidia0", "/tmp/n1/dev/nvidia0", "rw")],
                         [BindMount("/run/gpuload", "/tmp/n1/util", read_only=True)], {}, tmp_path, pod,
                         name="main", attempt=2,
                         allocated_annotations={"gpushare.k8s.io/container-devices-ids.main": "v"})
    sandbox = sandbox_config(pod, tmp_path / "logs")
    assert dict(sandbox.annotations) == pod.annotations  # all of them: containerd filters
    assert sandbox.metadata.uid == "u-1" and sandbox.hostname == ""  # host network: the node's name
    assert sandbox.linux.security_context.namespace_options.network == cri.NODE
    assert sandbox.linux.cgroup_parent == "/kubepods/besteffort/podu-1"
    config = container_config(spec, "gpushare.local/sim-node:1")
    assert (config.metadata.name, config.metadata.attempt, config.log_path) == ("main", 2, "main/2.log")
    assert [(d.container_path, d.host_path, d.permissions) for d in config.devices] == [
        ("/dev/nvidia0", "/tmp/n1/dev/nvidia0", "rw")]
    assert [(m.container_path, m.readonly) for m in config.mounts] == [("/run/gpuload", True)]
    assert {e.key: e.value for e in config.envs} == {"NVIDIA_VISIBLE_DEVICES": "GPU-0"}
    assert config.annotations["gpushare.k8s.io/container-devices-ids.main"] == "v"
    assert "team.example/x" not in config.annotations  # pod annotations go with the sandbox only
    assert list(config.command) == ["gpuload", "--once"] and config.image.image == "gpushare.local/sim-node:1"


async def test_a_socket_that_serves_no_cri_is_named_as_such(tmp_path: Path) -> None:
    """containerd with its CRI plugin off or failed answers UNIMPLEMENTED: no use waiting for it."""
    socket = tmp_path / "no-cri.sock"
    server = grpc.aio.server()
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    client = CriClient(str(socket))
    client.open()
    try:
        with pytest.raises(CriMissing, match=r"serves no CRI runtime\.v1"):
            await client.version()
        await server.stop(None)
        with pytest.raises(CriUnavailable):
            await client.image_present("gpushare.local/pause:1")
    finally:
        await client.close()
        await server.stop(None)

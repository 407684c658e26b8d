"""Container runners: one API, three ways to run a container.

* :class:`CtrRunner` runs a real container through containerd (``ctr run
  --config``) with runc or a runc-compatible runtime such as
  gpushare-runtime; the OCI spec carries the devices at their container paths,
  the bind mounts, the environment and every annotation.
* :class:`ProcessRunner` runs the command as a plain process (no root needed);
  container paths of devices and mounts are passed in ``GPULOAD_PATH_MAP`` so
  the workload program finds the host files.
* :class:`~gpushare_sim.node.adapters.crirunner.CriRunner` drives containerd's
  CRI plugin as the kubelet does (a pod sandbox, then containers in it).

All: ``start(spec) -> Started`` (the runtime's container id and where its
output goes), ``wait(id) -> exit code``, ``kill(id)``, ``remove(id)``, and
``remove_pod(pod uid)`` once the kubelet has removed the pod's containers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from gpushare_sim.node.adapters.rootfs import container_rootfs
from gpushare_sim.node.model import ContainerSpec, LogFile, Started
from gpushare_sim.run.lifeline import owned

log = logging.getLogger("gpushare_sim.node.runners")

PATH_MAP_ENV = "GPULOAD_PATH_MAP"
START_TIMEOUT = 30.0


class RunnerError(Exception):
    """A container could not be started or controlled."""

    def __init__(self, container_id: str, reason: str) -> None:
        self.container_id = container_id
        self.reason = reason
        super().__init__(f"container {container_id}: {reason}")


class Runner(Protocol):
    kind: str

    def describe(self) -> dict[str, str]: ...

    async def start(self, spec: ContainerSpec) -> Started: ...
    async def wait(self, container_id: str) -> int: ...
    async def kill(self, container_id: str) -> None: ...
    async def remove(self, container_id: str) -> None: ...
    async def remove_pod(self, pod_uid: str) -> None: ...


def _started(spec: ContainerSpec) -> Started:
    """A container this node names itself: the kubelet's id, its output in its directory's ``log``."""
    return Started(spec.container_id, LogFile(spec.workdir / "log"))


def _open_log(workdir: Path) -> BinaryIO:
    return open(workdir / "log", "ab")


def _exists(path: Path) -> bool:
    return path.exists()


def _log_tail(workdir: Path) -> str:
    return (workdir / "log").read_text(errors="replace")[-2000:]


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class _Proc:
    process: asyncio.subprocess.Process
    spec: ContainerSpec


class ProcessRunner:
    """Containers as plain processes, each in its own session (killed as a group)."""

    kind = "process"

    def describe(self) -> dict[str, str]:
        return {"kind": self.kind}

    def __init__(self, tool_dirs: list[Path]) -> None:
        self._tool_dirs = tool_dirs
        self._procs: dict[str, _Proc] = {}

    def _env(self, spec: ContainerSpec) -> dict[str, str]:
        pairs = [(d.container_path, d.host_path) for d in spec.devices]
        pairs += [(m.container_path, m.host_path) for m in spec.mounts]
        path = os.pathsep.join([*map(str, self._tool_dirs), os.environ.get("PATH", "")])
        return {**spec.env, "PATH": path, PATH_MAP_ENV: ";".join(f"{c}={h}" for c, h in pairs)}

    async def start(self, spec: ContainerSpec) -> Started:
        spec.workdir.mkdir(parents=True, exist_ok=True)
        (spec.workdir / "annotations.json").write_text(json.dumps(spec.annotations, indent=1))
        env = self._env(spec)
        program = shutil.which(spec.args[0], path=env["PATH"]) if spec.args else None
        if program is None:  # what exec would say: the lifeline (setpriv) would say it later
            raise RunnerError(spec.container_id, f"cannot exec {spec.args[:1]}: no such program on PATH")
        with _open_log(spec.workdir) as out:
            try:
                process = await asyncio.create_subprocess_exec(
                    *owned([program, *spec.args[1:]], "KILL"), env=env, stdin=subprocess.DEVNULL,
                    stdout=out, stderr=out, start_new_session=True, cwd=spec.workdir,
                )  # fmt: skip
            except OSError as err:
                raise RunnerError(spec.container_id, f"cannot exec {spec.args[:1]}: {err}") from err
        self._procs[spec.container_id] = _Proc(process, spec)
        return _started(spec)

    async def wait(self, container_id: str) -> int:
        return _exit_code(await self._proc(container_id).process.wait())

    async def kill(self, container_id: str) -> None:
        proc = self._procs.get(container_id)
        if proc is not None and proc.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.process.pid, signal.SIGKILL)

    async def remove(self, container_id: str) -> None:
        await self.kill(container_id)
        proc = self._procs.pop(container_id, None)
        if proc is not None:
            await proc.process.wait()

    async def remove_pod(self, pod_uid: str) -> None:
        return None  # nothing of the pod's besides its containers

    def _proc(self, container_id: str) -> _Proc:
        try:
            return self._procs[container_id]
        except KeyError:
            raise RunnerError(container_id, "unknown container") from None


class CtrRunner:
    """Real containers through ``ctr`` against a containerd socket."""

    kind = "containerd"

    def describe(self) -> dict[str, str]:
        """Where the containers are: for the services that kill tasks through containerd."""
        command = self._ctr
        flags = dict(zip(command[1::2], command[2::2], strict=False))
        return {
            "kind": self.kind,
            "address": flags.get("--address", ""),
            "namespace": flags.get("-n", ""),
            "runtime": str(self._runtime or "runc"),
        }

    def __init__(
        self,
        ctr_command: list[str],
        rootfs_base: Path,
        runtime_binary: Path | None,
        run_flags: list[str] | None = None,
    ) -> None:
        self._ctr = ctr_command  # e.g. ["ctr", "--address", SOCK, "-n", NAMESPACE]
        self._run_flags = run_flags or []  # e.g. ["--runc-root", DIR, "--fifo-dir", DIR]
        self._base = rootfs_base
        self._runtime = runtime_binary
        self._template: dict[str, Any] | None = None
        self._procs: dict[str, _Proc] = {}

    async def _ctr_run(self, *args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            *self._ctr, *args, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
        return proc.returncode or 0, out.decode(errors="replace").strip()

    async def _spec_template(self) -> dict[str, Any]:
        if self._template is None:
            rc, out = await self._ctr_run("oci", "spec")
            if rc != 0:
                raise RunnerError("-", f"ctr oci spec failed: {out}")
            self._template = json.loads(out)
        return json.loads(json.dumps(self._template))

    async def start(self, spec: ContainerSpec) -> Started:
        spec.workdir.mkdir(parents=True, exist_ok=True)
        rootfs = await asyncio.to_thread(container_rootfs, self._base, spec.workdir / "rootfs")
        oci = oci_spec(await self._spec_template(), spec, rootfs)
        # one cgroup per container, as containerd names them (the template has only /<ns>)
        oci["linux"]["cgroupsPath"] = f"/{self.describe()['namespace'] or 'default'}/{spec.container_id}"
        config = spec.workdir / "config.json"
        config.write_text(json.dumps(oci, indent=1))
        pid_file = spec.workdir / "pid"
        pid_file.unlink(missing_ok=True)
        runtime = ["--runc-binary", str(self._runtime)] if self._runtime else []
        with _open_log(spec.workdir) as out:
            process = await asyncio.create_subprocess_exec(
                *owned([*self._ctr, "run", *self._run_flags, "--rm", "--config", str(config),
                        "--pid-file", str(pid_file), *runtime, spec.container_id]),
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            )  # fmt: skip
        self._procs[spec.container_id] = _Proc(process, spec)
        await self._await_started(spec, process, pid_file)
        return _started(spec)

    async def _await_started(self, spec: ContainerSpec, process: asyncio.subprocess.Process, pid_file: Path) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT
        while not _exists(pid_file) and process.returncode is None:
            if loop.time() > deadline:
                await self.kill(spec.container_id)
                raise RunnerError(spec.container_id, "task did not start in time")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.wait()), 0.05)
        if process.returncode is not None and not _exists(pid_file):
            log_text = _log_tail(spec.workdir)
            raise RunnerError(spec.container_id, f"failed to start: {log_text.strip()}")

    async def wait(self, container_id: str) -> int:
        proc = self._procs.get(container_id)
        if proc is None:
            raise RunnerError(container_id, "unknown container")
        return _exit_code(await proc.process.wait())

    async def kill(self, container_id: str) -> None:
        rc, out = await self._ctr_run("task", "kill", "-a", "-s", "SIGKILL", container_id)
        if rc != 0 and "not found" not in out:
            log.warning("ctr task kill failed container=%s: %s", container_id, out)

    async def remove(self, container_id: str) -> None:
        proc = self._procs.pop(container_id, None)
        await self.kill(container_id)
        if proc is not None:
            try:
                await asyncio.wait_for(proc.process.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.process.pid, signal.SIGKILL)
                await proc.process.wait()
        await self._ctr_run("task", "delete", "-f", container_id)
        await self._ctr_run("container", "delete", container_id)
        if proc is not None:
            await asyncio.to_thread(shutil.rmtree, proc.spec.workdir / "rootfs", True)

    async def remove_pod(self, pod_uid: str) -> None:
        return None  # ctr runs no pod sandbox


def oci_spec(template: dict[str, Any], spec: ContainerSpec, rootfs: Path) -> dict[str, Any]:
    """Fill containerd's default OCI spec with one container's settings."""
    oci = template
    oci["root"] = {"path": str(rootfs), "readonly": False}
    process = oci["process"]
    process["args"] = spec.args
    process["terminal"] = False
    process["env"] = ["PATH=/bin:/usr/bin", *(f"{k}={v}" for k, v in spec.env.items())]
    linux = oci.setdefault("linux", {})
    linux["devices"] = [_linux_device(d.container_path, d.host_path) for d in spec.devices]
    allow = linux.setdefault("resources", {}).setdefault("devices", [])
    for device in linux["devices"]:
        rule = {"allow": True, "type": "c", "major": device["major"], "minor": device["minor"]}
        allow.append({**rule, "access": "rwm"})
    oci["mounts"] = [*oci.get("mounts", []), *map(_bind, spec.mounts)]
    oci["annotations"] = dict(spec.annotations)
    return oci


def _linux_device(container_path: str, host_path: str) -> dict[str, Any]:
    st = os.stat(host_path)
    return {
        "path": container_path, "type": "c", "major": os.major(st.st_rdev),
        "minor": os.minor(st.st_rdev), "fileMode": 0o666, "uid": 0, "gid": 0,
    }  # fmt: skip


def _bind(mount: Any) -> dict[str, Any]:
    options = ["rbind", "ro" if mount.read_only else "rw"]
    return {
        "destination": mount.container_path, "type": "bind",
        "source": mount.host_path, "options": options,
    }  # fmt: skip

"""A private containerd for tests and the local cluster.

Everything lives under one temporary directory (root, state, socket, config,
log), so several instances run side by side with the host's containerd and
with each other::

    with Containerd() as ctrd:                 # start() waits for the socket
        ctrd.run(rootfs_dir, "box1", "/bin/sleep", "60", detach=True)
        ctrd.ctr("task", "ls")                 # namespace "default" unless given
        ctrd.ctr("task", "ls", namespace="k8s.io")
        ctrd.bundle_dir("default", "box1")     # the OCI bundle the runtime saw
    # stop(): kills and deletes every task and container in every namespace,
    # stops containerd, unmounts what is left under the directory, removes it.

API:

- ``Containerd(base_dir=None, *, containerd_bin="containerd", ctr_bin="ctr", env=None, cri=None)``:
  ``env`` is containerd's environment (and so its shims' and runtimes'),
  the current one when None. ``cri``: containerd's CRI plugin on (off
  otherwise), with the shipped drop-in (:mod:`gpushare_sim.containerd_cri`);
  its state stays under this instance's root and state directories.
- ``start(timeout=20.0)``: write the config, start containerd, wait until
  ``ctr version`` answers on the socket; :class:`ContainerdError` if it exits
  or does not answer in time (the error carries the log's tail).
- ``ctr(*args, namespace="default", check=True, timeout=60.0)``: run
  ``ctr --address SOCKET -n NAMESPACE ARGS...``; a
  :class:`subprocess.CompletedProcess` with text output;
  :class:`ContainerdError` on a non-zero exit when ``check``.
- ``run(rootfs, container_id, *command, runc_binary=None, annotations=None,
  labels=None, devices=(), detach=False, namespace="default")``: ``ctr run --rootfs`` with
  this instance's own runc state root and FIFO directory (so container IDs
  never collide with another containerd's; a plain ``ctr("run", ...)`` uses
  runc's default root, shared by every containerd on the machine).
- ``bundle_dir(namespace, container_id)``: where the runc v2 shim keeps that
  container's bundle; ``runc_root(namespace)``: runc's ``--root`` for it.
- ``stop()``: idempotent clean-up described above.
- ``missing_binaries()``: the system binaries this needs that are not on PATH.

The runc v2 shim keeps its socket under ``/run/containerd/s`` whatever the
state directory; its name hashes this instance's socket address, so
instances never collide, and the shim removes it when its task is deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

from gpushare_sim.containerd_cri import CRI_PLUGIN, CriConfig, DropInError, render_drop_in
from gpushare_sim.run.lifeline import owned
from gpushare_sim.shorttmp import short_mkdtemp

REQUIRED_BINARIES = ("containerd", "ctr", "containerd-shim-runc-v2", "runc")
_DISABLED_PLUGINS = (
    "io.containerd.internal.v1.opt",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.tracing.processor.v1.otlp",
)


class ContainerdError(RuntimeError):
    """containerd did not start, or a ``ctr`` command failed."""

    def __init__(self, what: str, detail: str) -> None:
        self.what = what
        self.detail = detail
        super().__init__(f"{what}: {detail.strip()[-5000:]}")


def missing_binaries() -> list[str]:
    return [name for name in REQUIRED_BINARIES if shutil.which(name) is None]


def _config_text(root: Path, state: Path, socket: Path, drop_in: Path | None = None) -> str:
    disabled = ", ".join(f'"{name}"' for name in (*((CRI_PLUGIN,) if drop_in is None else ()), *_DISABLED_PLUGINS))
    imports = f'imports = ["{drop_in}"]\n' if drop_in is not None else ""
    return (
        "version = 2\n"
        f'root = "{root}"\n'
        f'state = "{state}"\n'
        f"disabled_plugins = [{disabled}]\n"
        f"{imports}"
        "[grpc]\n"
        f'  address = "{socket}"\n'
        "[ttrpc]\n"
        f'  address = "{socket}.ttrpc"\n'
        "[debug]\n"
        '  address = ""\n'
        '  level = "info"\n'
        "[metrics]\n"
        '  address = ""\n'
    )


class Containerd:
    """One containerd on a temporary root, state directory and socket."""

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        containerd_bin: str = "containerd",
        ctr_bin: str = "ctr",
        env: dict[str, str] | None = None,
        cri: CriConfig | None = None,
    ) -> None:
        self._owns_base = base_dir is None
        # unix socket paths are limited to 108 bytes: keep the base short
        self.base_dir = Path(base_dir or short_mkdtemp("ctrd-"))
        self.root = self.base_dir / "root"
        self.state = self.base_dir / "state"
        self.address = self.base_dir / "containerd.sock"
        self.config_path = self.base_dir / "config.toml"
        self.log_path = self.base_dir / "containerd.log"
        self.fifo_dir = self.base_dir / "fifo"
        self.cri = cri
        self._containerd_bin = containerd_bin
        self._ctr_bin = ctr_bin
        self._env = env
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Containerd:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def bundle_dir(self, namespace: str, container_id: str) -> Path:
        return self.state / "io.containerd.runtime.v2.task" / namespace / container_id

    def runc_root(self, namespace: str = "default") -> Path:
        """runc's ``--root`` for containers of ``namespace`` (ctr appends the namespace)."""
        return self.base_dir / "runc" / namespace

    def run(
        self,
        rootfs: Path,
        container_id: str,
        *command: str,
        runc_binary: str | None = None,
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        devices: tuple[str, ...] | list[str] = (),
        detach: bool = False,
        namespace: str = "default",
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """``ctr run --rootfs ROOTFS ID COMMAND...`` with this instance's runc root and FIFOs."""
        args = ["run", "--rootfs", "--runc-root", str(self.base_dir / "runc")]
        args += ["--fifo-dir", str(self.fifo_dir)]
        if runc_binary:
            args += ["--runc-binary", runc_binary]
        for key, value in (annotations or {}).items():
            args += ["--annotation", f"{key}={value}"]  # into the OCI spec
        for key, value in (labels or {}).items():
            args += ["--label", f"{key}={value}"]  # on the container's metadata
        for device in devices:
            args += ["--device", device]
        if detach:
            args.append("-d")
        args += [str(rootfs), container_id, *command]
        return self.ctr(*args, namespace=namespace, check=check, timeout=timeout)

    def start(self, timeout: float = 20.0) -> None:
        if self._process is not None:
            raise ContainerdError("start", "already started")
        for path in (self.root, self.state, self.fifo_dir):
            path.mkdir(parents=True, exist_ok=True)
        drop_in = None
        if self.cri is not None:
            drop_in = self.base_dir / "gpushare.toml"
            try:
                drop_in.write_text(render_drop_in(self.cri.drop_in.read_text(), self.cri, self.base_dir))
            except (OSError, DropInError) as err:
                raise ContainerdError(f"drop-in {self.cri.drop_in}", str(err)) from err
        self.config_path.write_text(_config_text(self.root, self.state, self.address, drop_in))
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                owned([self._containerd_bin, "--config", str(self.config_path)]),  # ends with the node
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
                start_new_session=True,
            )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise ContainerdError("containerd exited during start", self._log_tail())
            if self.address.exists():
                probe = self._run_ctr(["version"], "default", timeout=5.0)
                if probe.returncode == 0:
                    return
            time.sleep(0.05)
        raise ContainerdError(f"containerd did not answer within {timeout}s", self._log_tail())

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def _run_ctr(
        self, args: list[str], namespace: str, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        command = [self._ctr_bin, "--address", str(self.address), "-n", namespace, *args]
        try:
            return subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as err:
            raise ContainerdError(f"timed out after {timeout}s: {' '.join(command)}", "") from err

    def ctr(
        self,
        *args: str,
        namespace: str = "default",
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``ctr --address SOCKET -n NAMESPACE ARGS...``."""
        result = self._run_ctr(list(args), namespace, timeout)
        if check and result.returncode != 0:
            said = (result.stderr or result.stdout).strip()[-1500:]
            raise ContainerdError(f"ctr {' '.join(args)} exited {result.returncode}", said + self._last_log_lines())
        return result

    def _last_log_lines(self, lines: int = 12) -> str:
        """containerd's last log lines (its shims' and runc's errors), for an error to show."""
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\n--- containerd log, last lines ---\n" + "\n".join(line[-300:] for line in tail)

    def stop(self) -> None:
        """Remove every task and container, stop containerd, clean the directory. Idempotent."""
        if self.running:
            for namespace in self._namespaces():
                self._remove_all(namespace)
        self._terminate()
        self._kill_leftover_shims()
        self._kill_leftover_inits()
        self._unmount_below(self.base_dir)
        if self._owns_base:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _namespaces(self) -> list[str]:
        listed = self._run_ctr(["namespaces", "ls", "-q"], "default", timeout=10.0)
        return listed.stdout.split() if listed.returncode == 0 else []

    def _remove_all(self, namespace: str) -> None:
        tasks = self._run_ctr(["task", "ls", "-q"], namespace, timeout=10.0).stdout.split()
        for task in tasks:
            self._run_ctr(["task", "kill", "-s", "SIGKILL", task], namespace, timeout=10.0)
        for task in tasks:
            self._run_ctr(["task", "delete", "-f", task], namespace, timeout=20.0)
        containers = self._run_ctr(["containers", "ls", "-q"], namespace, timeout=10.0)
        for container in containers.stdout.split():
            self._run_ctr(["containers", "delete", container], namespace, timeout=10.0)

    def _terminate(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10.0)

    def _kill_leftover_shims(self) -> None:
        """Shims outlive containerd by design; kill those started for this instance."""
        marker = str(self.address).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if b"containerd-shim" in cmdline and marker in cmdline:
                    os.kill(int(entry.name), signal.SIGKILL)

    def _kill_leftover_inits(self) -> None:
        """A container left created (its ``runc init`` waiting to be started) outlives its shim:
        kill the init that runc's state names, if it is still that process."""
        for state in (self.base_dir / "runc").glob("*/*/state.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
                doc = json.loads(state.read_text())
                pid, started = int(doc["init_process_pid"]), int(doc["init_process_start"])
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[19]) == started:  # field 22, starttime: the same process
                    os.kill(pid, signal.SIGKILL)

    @staticmethod
    def _unmount_below(base: Path) -> None:
        prefix = str(base.resolve()) + "/"
        try:
            lines = Path("/proc/self/mountinfo").read_text().splitlines()
        except OSError:
            return
        points = [line.split()[4] for line in lines if line.split()[4].startswith(prefix)]
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)

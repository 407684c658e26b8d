"""Boot Debian's kernel in qemu with a small initramfs and run a guest script.

The base initramfs (busybox, ``kmod/vm/init``, the virtio and 9p modules of the
guest kernel) is built once into a cache folder outside the repository
(``$GPUSHARE_VM_CACHE``, default ``~/.cache/gpushare/vm``). Each run appends a
second cpio archive with ``/guest.sh`` and any extra files, boots the kernel
under qemu (with KVM when ``/dev/kvm`` is usable, software emulation otherwise or with
``-icount``; ``GPUSHARE_VM_ACCEL=tcg|kvm`` forces one), and returns
what the guest printed on its serial console. Optionally the host's root is
mounted read-only at ``/host`` (with /proc, /sys, /dev bound and tmpfs on
/tmp and /run, so ``chroot /host ...`` runs the host's programs, e.g. the
project's virtual environment) and a host folder is mounted writable at
``/out`` and, inside the chroot, at its own host path. qemu is always killed,
also on timeout.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VM_DIR = REPO / "kmod" / "vm"
START = "GPUSHARE-VM-START"
EXIT_RE = re.compile(r"^GPUSHARE-VM-EXIT (\d+)\s*$", re.M)
RESULT_RE = re.compile(r"^RESULT (\S+)((?: \S+=\S*)*)\s*$", re.M)
NEEDED = ("qemu-system-x86_64", "busybox", "cpio", "gzip")


class VMError(Exception):
    """The VM could not be built or booted, or the guest did not finish."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message if not output else f"{message}\n--- console ---\n{output}")
        self.output = output


class VMTimeout(VMError):
    """The guest did not power off within the timeout."""


@dataclass(frozen=True)
class GuestKernel:
    version: str
    vmlinuz: Path
    modules: Path

    @property
    def headers(self) -> Path:
        return self.modules / "build"


@dataclass(frozen=True)
class VMRun:
    output: str
    exit_code: int
    seconds: float

    def results(self) -> dict[str, dict[str, str]]:
        """``RESULT <name> k=v ...`` lines of the console, by name."""
        return parse_results(self.output)


def parse_results(text: str) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for match in RESULT_RE.finditer(text.replace("\r", "")):
        pairs = (item.split("=", 1) for item in match.group(2).split())
        found[match.group(1)] = {key: value for key, value in pairs}
    return found


def missing_tools() -> list[str]:
    """System binaries the VM needs and this machine lacks."""
    return [tool for tool in NEEDED if shutil.which(tool) is None]


def _version_key(version: str) -> list[int]:
    return [int(part) for part in re.findall(r"\d+", version)]


def find_guest_kernel(boot: Path = Path("/boot"), modroot: Path = Path("/lib/modules")) -> GuestKernel:
    """The newest Debian ``vmlinuz-*-amd64`` that has its modules installed."""
    kernels = []
    for image in boot.glob("vmlinuz-*-amd64"):
        version = image.name.removeprefix("vmlinuz-")
        if (modroot / version / "modules.dep").is_file():
            kernels.append(GuestKernel(version, image, modroot / version))
    if not kernels:
        raise VMError(f"no {boot}/vmlinuz-*-amd64 with modules in {modroot} (install linux-image-amd64)")
    return max(kernels, key=lambda k: _version_key(k.version))


def build_kmod(kernel: GuestKernel) -> tuple[Path, Path]:
    """``make -C kmod`` against the guest kernel's headers: (module, tool).

    Also builds ``kmod/tools/gpushare-ioctl32`` (32-bit, for the compat hook).
    """
    kmod = REPO / "kmod"
    proc = subprocess.run(
        ["make", "-C", str(kmod), f"KDIR={kernel.headers}", "all"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise VMError(f"make -C kmod failed:\n{proc.stdout}\n{proc.stderr}")
    return kmod / "gpushare.ko", kmod / "tools" / "gpushare-kmodctl"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "gpushare" / "vm"
    path = Path(os.environ.get("GPUSHARE_VM_CACHE", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def base_initramfs(kernel: GuestKernel) -> Path:
    """Build (once per kernel and harness version) the base initramfs."""
    digest = hashlib.sha256()
    for name in ("init", "build-initramfs.sh"):
        digest.update((VM_DIR / name).read_bytes())
    digest.update(kernel.version.encode())
    target = cache_dir() / f"base-{kernel.version}-{digest.hexdigest()[:12]}.cpio.gz"
    if not target.exists():
        cmd = [str(VM_DIR / "build-initramfs.sh"), str(target), kernel.version, str(kernel.modules.parent)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise VMError(f"building the initramfs failed: {proc.stderr.strip()}")
    return target


def _extra_archive(stage: Path, script: str, files: Mapping[str, Path], out: Path) -> None:
    root = stage / "root"
    root.mkdir()
    (root / "guest.sh").write_text(script)
    for dest, src in files.items():
        target = root / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    with out.open("wb") as sink:
        proc = subprocess.run(
            ["cpio", "-o", "-H", "newc", "--quiet"],
            input="\n".join(names).encode(), cwd=root, stdout=sink, stderr=subprocess.PIPE, check=False,
        )
    if proc.returncode != 0:
        raise VMError(f"cpio failed: {proc.stderr.decode().strip()}")


# the host's CPU, less IA32_ARCH_CAPABILITIES: a nested hypervisor may refuse qemu's write of that
# MSR ("failed to set MSR 0x10a"), and the guest tests need none of what it reports
KVM_CPU = "host,-arch-capabilities"


def kvm_usable(device: str = "/dev/kvm") -> bool:
    """Whether this process may run guests with KVM (the device exists and opens read-write)."""
    try:
        os.close(os.open(device, os.O_RDWR | os.O_CLOEXEC))
    except OSError:
        return False
    return True


def accelerator(opts: VMOptions) -> str:
    """``opts.accel``, else ``GPUSHARE_VM_ACCEL``, else ``kvm`` when a guest boots with it here
    (:func:`kvm_boots`), else ``tcg``; guest time counted in instructions (``icount``) needs ``tcg``."""
    if opts.icount:
        return "tcg"
    return opts.accel or os.environ.get("GPUSHARE_VM_ACCEL", "") or ("kvm" if kvm_boots() else "tcg")


@functools.cache
def kvm_boots() -> bool:
    """Whether a guest boots with KVM on this machine: ``/dev/kvm`` opens and a guest that does
    nothing powers off within 20 s (under some nested hypervisors the device opens but the guest
    kernel never starts). Probed once per guest kernel and qemu, the answer kept in the cache."""
    if not kvm_usable():
        return False
    kernel = find_guest_kernel()
    qemu = shutil.which("qemu-system-x86_64") or ""
    stamp = hashlib.sha256(f"{kernel.version} {qemu} {os.stat(qemu).st_mtime_ns if qemu else 0}".encode())
    answer = cache_dir() / f"kvm-boots-{stamp.hexdigest()[:12]}"
    if not answer.exists():
        try:
            ok = run_guest("true\n", opts=VMOptions(timeout_s=20, memory_mb=256, accel="kvm")).exit_code == 0
        except VMError:
            ok = False
        answer.write_text("yes\n" if ok else "no\n")
    return answer.read_text().strip() == "yes"


def _qemu_command(kernel: GuestKernel, initrd: Path, opts: VMOptions) -> list[str]:
    accel = accelerator(opts)
    append = ["console=ttyS0", "panic=-1", "rdinit=/init", "loglevel=4", "vm9p=1"]
    cmd = [
        "qemu-system-x86_64", "-accel", accel, "-cpu", KVM_CPU if accel == "kvm" else "max", "-m", str(opts.memory_mb),
        "-smp", str(opts.cpus), "-kernel", str(kernel.vmlinuz), "-initrd", str(initrd),
        "-nographic", "-monitor", "none", "-serial", "stdio", "-no-reboot", "-nodefaults",
    ]
    if opts.icount:
        cmd += ["-icount", "shift=0"]
    if opts.share_host_root:
        append += ["vmhost=1", f"vmrepo={REPO.resolve()}"]
        cmd += ["-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"]
    if opts.out_dir is not None:
        if re.search(r"\s", str(opts.out_dir)):
            raise VMError(f"out_dir must not contain white space: {opts.out_dir!r}")
        append += ["vmout=1", f"vmoutpath={opts.out_dir.resolve()}"]
        cmd += ["-virtfs", f"local,path={opts.out_dir},mount_tag=out,security_model=none,multidevs=remap"]
    return [*cmd, "-append", " ".join(append)]


@dataclass(frozen=True)
class VMOptions:
    share_host_root: bool = False
    out_dir: Path | None = None
    timeout_s: float = 240.0
    memory_mb: int = 1024
    cpus: int = 1
    # Guest time = instructions executed (qemu -icount): timings that do not
    # depend on the host's load. Software emulation only.
    icount: bool = False
    accel: str = ""  # kvm | tcg; "": the best this machine runs (accelerator())


@contextlib.contextmanager
def _qemu(cmd: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def run_guest(script: str, files: Mapping[str, Path] | None = None, opts: VMOptions | None = None) -> VMRun:
    """Boot, run ``script`` as /guest.sh (busybox sh), return the console."""
    opts = opts or VMOptions()
    kernel = find_guest_kernel()
    base = base_initramfs(kernel)
    with tempfile.TemporaryDirectory(prefix="gpushare-vm-") as tmp:
        stage = Path(tmp)
        extra = stage / "extra.cpio"
        _extra_archive(stage, script, files or {}, extra)
        initrd = stage / "initrd"
        with initrd.open("wb") as sink:
            data = base.read_bytes()
            sink.write(data + bytes(-len(data) % 512))  # archives start aligned
            sink.write(extra.read_bytes())
        started = time.monotonic()
        with _qemu(_qemu_command(kernel, initrd, opts)) as proc:
            try:
                raw, _ = proc.communicate(timeout=opts.timeout_s)
            except subprocess.TimeoutExpired as err:
                os.killpg(proc.pid, 9)
                raw, _ = proc.communicate()
                text = raw.decode(errors="replace")
                raise VMTimeout(f"guest did not finish within {opts.timeout_s:.0f} s", text) from err
    output = raw.decode(errors="replace").replace("\r", "")
    match = EXIT_RE.search(output)
    if START not in output or match is None:
        raise VMError("guest script did not run to its end", output)
    return VMRun(output=output, exit_code=int(match.group(1)), seconds=time.monotonic() - started)

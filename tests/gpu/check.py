"""The real-GPU check behind tests/gpu/run.sh: python check.py OUT.json GPU_INDEX.

Steps, each recorded in OUT.json as ``{"status": "passed" | "failed" | "skipped", ...}``:

- ``strace``: a CUDA process on the host issues ioctls of type 0x46 on /dev/nvidiactl and
  /dev/nvidia<N> (what the kernel module watches by default);
- ``containers``: runc containers through gpushare-runtime on one card: ``shadow`` gets the
  card through a signed ``container-devices-ids`` annotation (vendor table), ``share-a``
  receives shadow's devices through a signed ``container-devices-from``; both run GPU work;
- ``mps`` (when nvidia-cuda-mps-control exists): shadow runs the ShadowPod's MPS daemon
  script; share-a (1 of 4) holds memory under its cap while share-b (1 of 4) allocating past
  the cap is refused; share-k2 (2 of 4) shows whether a client may exceed the daemon's default;
- ``kill_frees_memory``: a share holding memory is killed and its memory is gone from
  ``nvidia-smi --query-compute-apps``;
- ``dra_mps`` (when nvidia-cuda-mps-control exists): the DRA path, with the DRA driver's own
  code (:mod:`tests.gpu.dra_check`): two claims of a quarter prepared as CDI specs, the node's MPS
  control daemon started as the driver starts it, a share under its cap holding while the other
  past its cap is refused, the daemon stopped after both are unprepared;
- ``nvcc`` (when nvcc exists): a tiny CUDA program runs in a share.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for path in ("", "libs/common", "runtime", "services/shadow-controller", "services/dra-driver"):
    sys.path.insert(0, str(REPO / path))

from gpushare_common import ids, isolation  # noqa: E402
from gpushare_dra_driver.cards import Card  # noqa: E402

from tests.gpu import dra_check  # noqa: E402
from tests.gpu.strace import ioctl_types  # noqa: E402
from tests.support.kubelet import Kubelet, serve_kubelet  # noqa: E402

NODE, SYSTEM, SPEC_N = "gpu-check", "gpushare-system", 4
HOST_DIRS = ("usr", "etc", "opt", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
BUDGET_S = 270  # the whole check, from the moment its node is set up
DEADLINE = time.monotonic() + BUDGET_S  # set again when a Node is made: an importer may use one much later


def run(args: list[str], timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    left = max(1.0, min(timeout, DEADLINE - time.monotonic()))
    return subprocess.run(args, capture_output=True, text=True, timeout=left, check=False, **kwargs)


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]
    return None


class Node:
    """gpushare-runtime installed in a work directory, its configuration, key and rootfs, and a
    stand-in for the kubelet's pod-resources API that allocates each container its devices."""

    def __init__(self, work: Path, index: int, memory_mib: int) -> None:
        global DEADLINE
        DEADLINE = time.monotonic() + BUDGET_S
        self.work, self.index, self.memory_mib = work, index, memory_mib
        self.state, self.bundles = work / "state", work / "bundles"
        self.isolation = work / "isolation"
        self.started: list[str] = []
        self.key = os.urandom(32).hex().encode()
        self._kubelet = serve_kubelet()
        self.kubelet: Kubelet = self._kubelet.__enter__()
        (work / "signing.key").write_bytes(self.key)
        (work / "signing.key").chmod(0o600)
        (work / "runtime.json").write_text(json.dumps({
            "key_file": str(work / "signing.key"), "node_name": NODE, "index_dir": "",
            "cdi_dirs": [str(work / "cdi")], "isolation_dir": str(self.isolation),
            "pod_resources_socket": str(self.kubelet.socket)}))
        subprocess.run([str(REPO / "runtime/install/install.sh"), str(work / "bin"), sys.executable],
                       check=True, capture_output=True)
        self.runtime = str(work / "bin" / "gpushare-runtime")
        self.env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                    "GPUSHARE_RUNTIME_CONFIG": str(work / "runtime.json")}
        self.rootfs, self.binds = self._rootfs()
        spec_dir = work / "spec"
        spec_dir.mkdir()
        run(["runc", "spec", "--bundle", str(spec_dir)])
        self.base = json.loads((spec_dir / "config.json").read_text())

    def _rootfs(self) -> tuple[Path, list[dict[str, Any]]]:
        """An empty root with the host's system directories bound read-only (driver, python)."""
        rootfs, binds = self.work / "rootfs", []
        for name in ("proc", "sys", "dev", "tmp", "var", "run"):
            (rootfs / name).mkdir(parents=True, exist_ok=True)
        for name in HOST_DIRS:
            host = Path("/") / name
            if host.is_symlink():
                (rootfs / name).symlink_to(host.readlink())
            elif host.is_dir():
                (rootfs / name).mkdir()
                binds.append({"destination": f"/{name}", "type": "bind", "source": str(host),
                              "options": ["rbind", "ro"]})
        binds += [{"destination": "/gpu-check", "type": "bind", "source": str(HERE), "options": ["rbind", "ro"]},
                  {"destination": "/work", "type": "bind", "source": str(self.work), "options": ["rbind", "ro"]},
                  {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]}]
        return rootfs, binds

    def sign(self, kind: str, value: str) -> dict[str, str]:
        return {ids.ANNOTATION_PREFIXES[kind] + "*": value,
                ids.signature_annotation(kind, "*"): ids.sign(self.key, kind, NODE, "*", value)}

    def bundle(self, name: str, pod: tuple[str, str], command: str, annotations: dict[str, str],
               extra: tuple[list[dict[str, Any]], list[str]] = ([], [])) -> Path:
        spec = json.loads(json.dumps(self.base))
        spec["process"].update(terminal=False, args=["/bin/sh", "-c", command])
        spec["process"]["env"] += ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", *extra[1]]
        spec["root"] = {"path": str(self.rootfs), "readonly": False}
        spec["mounts"] += self.binds + extra[0]
        spec["annotations"] = {"io.kubernetes.cri.sandbox-namespace": pod[0],
                               "io.kubernetes.cri.sandbox-name": pod[1],
                               "io.kubernetes.cri.container-name": "main", **annotations}
        (self.bundles / name).mkdir(parents=True)
        (self.bundles / name / "config.json").write_text(json.dumps(spec))
        return self.bundles / name

    def start(self, name: str, bundle: Path) -> str:
        cid = f"gpushare-check-{name}-{time.time_ns() % 10**8}"
        with open(self.work / f"{name}.log", "w") as log:
            created = subprocess.run([self.runtime, "--root", str(self.state), "create", "--bundle",
                                      str(bundle), cid], stdout=log, stderr=log, env=self.env,
                                     timeout=60, check=False)
        if created.returncode != 0:
            raise RuntimeError(f"create {name}: {(self.work / f'{name}.log').read_text()[-400:]}")
        self.started.append(cid)
        run(["runc", "--root", str(self.state), "start", cid])
        return cid

    def foreground(self, name: str, bundle: Path, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        cid = f"gpushare-check-{name}-{time.time_ns() % 10**8}"
        self.started.append(cid)
        return run([self.runtime, "--root", str(self.state), "run", "--bundle", str(bundle), cid],
                   timeout=timeout, env=self.env)

    def wait_json(self, name: str, timeout: float = 90) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while time.monotonic() < min(end, DEADLINE):
            found = last_json((self.work / f"{name}.log").read_text())
            if found is not None:
                return found
            time.sleep(0.5)
        raise RuntimeError(f"{name}: no result: {(self.work / f'{name}.log').read_text()[-400:]}")

    def state_of(self, cid: str) -> dict[str, Any]:
        done = run(["runc", "--root", str(self.state), "state", cid])
        return json.loads(done.stdout) if done.returncode == 0 else {"status": "gone"}

    def stop(self, cid: str) -> None:
        run(["runc", "--root", str(self.state), "kill", cid, "KILL"])
        run(["runc", "--root", str(self.state), "delete", "-f", cid])

    def close(self) -> None:
        for cid in self.started:
            self.stop(cid)
        self._kubelet.__exit__(None, None, None)

    # --- the two kinds of container -----------------------------------------------------

    def shadow(self, command: str) -> tuple[str, Path]:
        """The ShadowPod: the card through a signed container-devices-ids, the isolation dirs."""
        host = Path(isolation.shadow_dir(str(self.isolation), f"{SYSTEM}/shadow"))
        mounts = [{"destination": dst, "type": "bind", "source": str(host / sub), "options": ["rbind", "rw"]}
                  for sub, dst in (("pipe", isolation.MPS_PIPE_DIR), ("log", isolation.MPS_LOG_DIR),
                                   ("shm", isolation.SHM_DIR))]
        for mount in mounts:
            Path(mount["source"]).mkdir(parents=True, exist_ok=True)
        env = [f"CUDA_MPS_PIPE_DIRECTORY={isolation.MPS_PIPE_DIR}", f"GPUSHARE_SHARES={SPEC_N}",
               f"CUDA_MPS_LOG_DIRECTORY={isolation.MPS_LOG_DIR}"]
        devices = self.sign(ids.KIND_IDS, ids.format_devices_ids({"nvidia.com/gpu": [str(self.index)]}))
        self.kubelet.allocate(f"{SYSTEM}/shadow", "main", "nvidia.com/gpu", [str(self.index)])
        bundle = self.bundle("shadow", (SYSTEM, "shadow"), command, devices, (mounts, env))
        return self.start("shadow", bundle), host

    def share(self, name: str, command: str, held: int = 1, capped: bool = False) -> Path:
        """A SharePod: the shadow's devices (signed devices-from), and its caps when capped."""
        listed = [f"{SYSTEM}/shadow-{i}" for i in range(held)]
        self.kubelet.allocate(f"team/{name}", "main", f"gpushare/share-gpu-{SPEC_N}", listed)
        annotations = self.sign(ids.KIND_FROM, ids.format_devices_from({f"{SYSTEM}/shadow/main": {"*": listed}}))
        if capped:
            caps = isolation.ShareCaps("mps", "nvidia.com/gpu", f"{SYSTEM}/shadow", SPEC_N, held, self.memory_mib)
            annotations.update(self.sign(ids.KIND_ISOLATION, isolation.format_share_caps(caps)))
        return self.bundle(name, ("team", name), command, annotations)

    def dra_share(self, name: str, prepared: Any, command: str) -> Path:
        """A pod of a DRA claim: the claim's CDI devices through a signed container-devices-ids (the
        kubelet lists them as the container's claim)."""
        self.kubelet.claim(f"team/{name}", "main", [c for device in prepared.devices for c in device.cdi_ids])
        return self.bundle(name, ("team", name), command, dra_check.devices_annotation(self.sign, prepared))


def alloc(target: int, hold: float) -> str:
    return f"exec python3 /gpu-check/cuda_alloc.py {target} 256 {hold}"


def step_strace(node: Node) -> dict[str, Any]:
    if shutil.which("strace") is None:
        return {"status": "skipped", "reason": "strace not found"}
    out = node.work / "strace.txt"
    done = run(["strace", "-f", "-y", "-e", "trace=ioctl", "-o", str(out), sys.executable,
                str(HERE / "cuda_alloc.py"), "64"], timeout=90,
               env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": str(node.index)})
    types = ioctl_types(out.read_text() if out.exists() else "")
    card = f"/dev/nvidia{node.index}"
    result = {"nvidiactl_0x46": types.get("/dev/nvidiactl", {}).get(0x46, 0),
              "card_0x46": types.get(card, {}).get(0x46, 0), "card": card,
              "types_seen": {p: sorted(hex(t) for t in v) for p, v in types.items()},
              "workload": last_json(done.stdout)}
    ok = result["nvidiactl_0x46"] > 0 and result["card_0x46"] > 0
    return {"status": "passed" if ok else "failed", **result}


def step_containers(node: Node, mps: bool) -> dict[str, Any]:
    daemon = isolation_script() if mps else "exec sleep 600"
    shadow, _ = node.shadow(f"nvidia-smi -L; python3 /gpu-check/cuda_alloc.py 256; {daemon}")
    share = node.foreground("share-a0", node.share("share-a0", f"nvidia-smi -L && {alloc(512, 0)}"))
    shadow_log = (node.work / "shadow.log").read_text()
    work = {"shadow_nvidia_smi": shadow_log.splitlines()[:1], "shadow_alloc": last_json(shadow_log),
            "share_nvidia_smi": share.stdout.splitlines()[:1], "share_alloc": last_json(share.stdout),
            "share_stderr": share.stderr[-400:], "shadow_id": shadow}
    ok = all(isinstance(work[k], dict) and work[k]["error"] is None for k in ("shadow_alloc", "share_alloc"))
    return {"status": "passed" if ok else "failed", **work}


def isolation_script() -> str:
    from gpushare_shadow_controller.template import MPS_SCRIPT

    return MPS_SCRIPT


def step_mps(node: Node, shadow_id: str) -> dict[str, Any]:
    probe = ["runc", "--root", str(node.state), "exec", shadow_id, "/bin/sh", "-c",
             "echo get_default_active_thread_percentage | nvidia-cuda-mps-control"]
    end = time.monotonic() + 60
    while run(probe, timeout=10).returncode != 0:
        if time.monotonic() > end:
            return {"status": "failed", "reason": "the MPS daemon never answered",
                    "shadow_log": (node.work / "shadow.log").read_text()[-600:]}
        time.sleep(1)
    cap = node.memory_mib // SPEC_N
    holder = node.start("share-a", node.share("share-a", alloc(cap - 1024, 60), capped=True))
    held = node.wait_json("share-a")
    over = last_json(node.foreground("share-b", node.share("share-b", alloc(cap + 2048, 0), capped=True)).stdout)
    double = last_json(node.foreground("share-k2", node.share("share-k2", alloc(2 * cap - 1024, 0), 2, True)).stdout)
    running = node.state_of(holder).get("status") == "running"
    node.stop(holder)
    result = {"cap_mib": cap, "within_cap": held, "past_cap": over, "other_running_meanwhile": running,
              "two_shares": double,
              "client_may_exceed_daemon_default": bool(double and double["allocated_mib"] > cap)}
    ok = (held["error"] is None and over is not None and over["error"] is not None
          and over["allocated_mib"] <= cap and running)
    return {"status": "passed" if ok else "failed", **result}


def step_dra(node: Node, card_id: str, mps: bool, shadow: str | None) -> dict[str, Any]:
    if not mps:
        return {"status": "skipped", "reason": "nvidia-cuda-mps-control not found"}
    if shadow:
        node.stop(shadow)  # the ShadowPod's MPS daemon goes: the DRA node's daemon serves the card now
    os.environ.update(dra_check.mps_environment())
    card = Card(card_id, "nvidia.com/gpu", node.index, True, memory_mib=node.memory_mib)
    return asyncio.run(_dra(node, card, dra_check.PRIVATE_SHM))


async def _dra(node: Node, card: Card, daemon: str) -> dict[str, Any]:
    shares, refs, prepared, mps = await dra_check.prepare_two(node.work, card, NODE, daemon)
    cap = node.memory_mib * dra_check.K // dra_check.SHARES
    try:
        holder = node.start("dra-a", node.dra_share("dra-a", prepared[refs[0].uid], alloc(cap - 1024, 60)))
        held = node.wait_json("dra-a")
        over = last_json(node.foreground("dra-b", node.dra_share("dra-b", prepared[refs[1].uid],
                                                                  alloc(cap + 2048, 0))).stdout)
        running = node.state_of(holder).get("status") == "running"
        node.stop(holder)
    finally:
        stopped = await dra_check.release(shares, refs, mps)
    result = {"cap_mib": cap, "within_cap": held, "past_cap": over, "other_running_meanwhile": running,
              "daemon_stopped_after_the_last": stopped}
    ok = (held["error"] is None and over is not None and over["error"] is not None
          and over["allocated_mib"] <= cap and running and stopped)
    return {"status": "passed" if ok else "failed", **result}


def compute_apps() -> dict[int, int]:
    done = run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    apps = {}
    for line in done.stdout.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip().isdigit() and used.strip().isdigit():
            apps[int(pid)] = int(used)
    return apps


def step_kill(node: Node) -> dict[str, Any]:
    cid = node.start("share-c", node.share("share-c", alloc(2048, 120)))
    node.wait_json("share-c")
    pid = int(node.state_of(cid).get("pid", 0))
    before = compute_apps().get(pid)
    node.stop(cid)
    end, after = time.monotonic() + 30, before
    while time.monotonic() < end and after is not None:
        time.sleep(0.5)
        after = compute_apps().get(pid)
    ok = before is not None and before >= 2048 and after is None
    return {"status": "passed" if ok else "failed", "pid": pid, "used_mib_before": before,
            "used_mib_after": after}


VECTOR_ADD = """#include <cstdio>
__global__ void add(int n, float *x, float *y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += x[i]; }
int main() { int n = 1 << 20; float *x, *y; cudaMallocManaged(&x, n * 4); cudaMallocManaged(&y, n * 4);
  for (int i = 0; i < n; i++) { x[i] = 1; y[i] = 2; }
  add<<<(n + 255) / 256, 256>>>(n, x, y); cudaError_t e = cudaDeviceSynchronize();
  printf("{\\"error\\": %s, \\"y0\\": %f}\\n", e ? "\\"failed\\"" : "null", y[0]); return e != 0; }
"""


def step_nvcc(node: Node) -> dict[str, Any]:
    if shutil.which("nvcc") is None:
        return {"status": "skipped", "reason": "nvcc not found"}
    (node.work / "vadd.cu").write_text(VECTOR_ADD)
    built = run(["nvcc", "-o", str(node.work / "vadd"), str(node.work / "vadd.cu")], timeout=120)
    if built.returncode != 0:
        return {"status": "failed", "reason": built.stderr[-400:]}
    done = node.foreground("share-d", node.share("share-d", "exec /work/vadd"))
    found = last_json(done.stdout)
    ok = found is not None and found["error"] is None and found["y0"] == 3.0
    return {"status": "passed" if ok else "failed", "output": found, "stderr": done.stderr[-400:]}


def gpu_info(index: int) -> dict[str, Any]:
    done = run(["nvidia-smi", f"--id={index}", "--query-gpu=name,uuid,memory.total,driver_version",
                "--format=csv,noheader,nounits"])
    name, uuid, memory, driver = (p.strip() for p in done.stdout.strip().split(","))
    return {"index": index, "name": name, "uuid": uuid, "memory_mib": int(memory), "driver": driver}


def step_mps_or_skip(node: Node, steps: dict[str, Any], mps: bool) -> dict[str, Any]:
    if not mps:
        return {"status": "skipped", "reason": "nvidia-cuda-mps-control not found"}
    if steps["containers"]["status"] != "passed":
        return {"status": "skipped", "reason": "the containers step failed"}
    return step_mps(node, steps["containers"]["shadow_id"])


def run_steps(results: dict[str, Any], index: int) -> None:
    steps = results["steps"]
    results["gpu"] = gpu_info(index)
    work = Path(run(["mktemp", "-d", "/tmp/gpushare-gpu-check.XXXXXX"]).stdout.strip())
    results["work_dir"] = str(work)
    node = Node(work, index, results["gpu"]["memory_mib"])
    mps = shutil.which("nvidia-cuda-mps-control") is not None
    try:
        for name, step in (("strace", lambda: step_strace(node)),
                           ("containers", lambda: step_containers(node, mps)),
                           ("mps", lambda: step_mps_or_skip(node, steps, mps)),
                           ("kill_frees_memory", lambda: step_kill(node)),
                           ("dra_mps", lambda: step_dra(node, results["gpu"]["uuid"], mps,
                                                        steps.get("containers", {}).get("shadow_id"))),
                           ("nvcc", lambda: step_nvcc(node))):
            try:
                steps[name] = step()
            except (OSError, RuntimeError, ValueError, KeyError, subprocess.SubprocessError) as err:
                steps[name] = {"status": "failed", "reason": f"{type(err).__name__}: {err}"}
    finally:
        node.close()


def main(out: Path, index: int) -> int:
    results: dict[str, Any] = {"version": 1, "skipped": None, "ok": None, "gpu": None, "steps": {}}
    try:
        run_steps(results, index)
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        results["error"] = f"{type(err).__name__}: {err}"
    steps = results["steps"]
    results["ok"] = "error" not in results and all(s["status"] != "failed" for s in steps.values())
    out.write_text(json.dumps(results, indent=1) + "\n")
    summary = ", ".join(f"{name} {step['status']}" for name, step in steps.items())
    print(f"gpu check {'passed' if results['ok'] else 'failed'}: {summary or results.get('error')} ({out})")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))

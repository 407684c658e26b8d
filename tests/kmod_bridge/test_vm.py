"""The real path in the kmod VM: the bridge and a nats-server in the guest against the real module.

The guest loads the module, mounts cgroup2 and makes the owner's cgroup, then
runs ``vm_guest.py`` with the project's environment (the host's root shared
over 9p, ``chroot /host``). See that script for the rounds it drives.
"""

from __future__ import annotations

import shutil

import pytest

from tests.kmod import vm

pytestmark = [pytest.mark.vm, pytest.mark.slow, pytest.mark.timeout(900)]

ROUNDS = 3
CGROUP = "/sys/fs/cgroup/gpushare-vm/team-a_dev-1_main_c0ffee"


def guest_script(rounds: int) -> str:
    repo = vm.REPO
    return f"""
insmod /gpushare.ko timeout_ms=20000
echo "RESULT load rc=$?"
ip link set lo up || ifconfig lo 127.0.0.1 up
mount -t cgroup2 none /host/sys/fs/cgroup && mkdir -p /host{CGROUP}
echo "RESULT cgroup rc=$?"
chroot /host /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp PYTHONDONTWRITEBYTECODE=1 \\
    {repo}/.venv/bin/python {repo}/tests/kmod_bridge/vm_guest.py --rounds {rounds} \\
    --ko {repo}/kmod/gpushare.ko --cgroup {CGROUP}
echo "RESULT guest rc=$?"
rmmod gpushare
echo "RESULT dmesg problems=$(dmesg | grep -cE 'WARNING|BUG:|Oops|Call Trace|general protection')"
"""


def run_bridge_vm(rounds: int, timeout_s: float = 540) -> vm.VMRun:
    missing = [*vm.missing_tools(), *(t for t in ("make", "gcc") if shutil.which(t) is None)]
    if missing:
        pytest.skip(f"missing system binaries: {', '.join(missing)}")
    try:
        kernel = vm.find_guest_kernel()
    except vm.VMError as err:
        pytest.skip(str(err))
    if not (kernel.headers / "Makefile").exists():
        pytest.skip(f"no kernel headers at {kernel.headers} (install linux-headers-amd64)")
    module, _tool = vm.build_kmod(kernel)
    options = vm.VMOptions(share_host_root=True, timeout_s=timeout_s, memory_mb=1536)
    return vm.run_guest(guest_script(rounds), {"/gpushare.ko": module}, options)


@pytest.fixture(scope="module")
def guest() -> vm.VMRun:
    return run_bridge_vm(ROUNDS)


def test_bridge_registers_with_the_real_module(guest: vm.VMRun) -> None:
    results = guest.results()
    assert results["load"]["rc"] == "0" and results["cgroup"]["rc"] == "0", guest.output
    assert results["bridge"]["registered"] == "1", guest.output
    assert int(results["bridge"]["port"]) > 0 and results["bridge"]["restored"] == "0"


def test_ioctl_in_a_detected_namespace_reaches_nats_with_the_pod(guest: vm.VMRun) -> None:
    owner_back = guest.results().get("ownerback")
    assert owner_back is not None, guest.output
    assert owner_back["rounds"] == str(ROUNDS)
    assert owner_back["pod_ok"] == owner_back["pidns_ok"] == str(ROUNDS)
    assert owner_back["woken"] == str(ROUNDS)  # each release woke the blocked owner
    assert int(owner_back["held_max_ms"]) < 20000  # released, not timed out


def test_the_guest_runs_the_same_nats_server_as_the_host_tests(guest: vm.VMRun) -> None:
    nats = guest.results()["nats"]
    assert nats["beside_python"] == "1" and nats["version"].startswith("v2."), guest.output


def test_a_hit_while_no_bridge_runs_reaches_nats_once(guest: vm.VMRun) -> None:
    results = guest.results()
    resend = results.get("resend")
    assert resend is not None, guest.output
    assert all(results[name]["registered"] == "1" for name in ("bridge_detect", "bridge_resend1", "bridge_resend2"))
    assert resend["detect"] == "0" and resend["pod_ok"] == "1"
    assert resend["same_id"] == resend["same_ts"] == "1"  # the notice sent again is the same owner-back
    assert resend["stored"] == "1"  # the stream kept one
    assert resend["woken"] == "1" and int(resend["held_ms"]) < 20000  # released, not timed out


def test_watch_set_restored_after_bridge_restart_and_module_reload(guest: vm.VMRun) -> None:
    results = guest.results()
    assert results.get("reload") == {"rmmod": "0", "insmod": "0"}, guest.output
    assert results["bridge_again"]["registered"] == "1"
    assert results["bridge_again"]["restored"] == "1"  # read back from the key-value bucket
    assert results["resent"]["entries"] == "1"  # the owner's namespace is back, with its live pid
    assert results["resent"]["detected"] == "0"  # its notice was spent, so it came back watched


def test_guest_clean(guest: vm.VMRun) -> None:
    results = guest.results()
    assert results["guest"]["rc"] == "0", guest.output
    assert results["dmesg"]["problems"] == "0", guest.output


def test_the_bridge_reads_the_modules_hold_parameters_and_follows_a_change(guest: vm.VMRun) -> None:
    """timeout_ms (given at insmod) and max_hold_ms (the default) come from the real module's STATS;
    max_hold_ms written through /sys/module at run time is followed, and every reply hands it on."""
    params = guest.results().get("params")
    assert params is not None, guest.output
    assert (params["timeout_ms"], params["max_hold_ms"]) == ("20000", "30000")
    assert params["followed"] == "1"
    assert (params["reply_timeout_ms"], params["reply_max_hold_ms"]) == ("20000", "25000")

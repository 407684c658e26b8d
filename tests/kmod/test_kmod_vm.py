"""The gpushare module in a qemu VM: one boot runs every check.

The guest loads the module, runs ``gpushare-kmodctl checks`` (owners in new
pid namespaces issuing ioctls on /dev/null), unloads it while an owner is
blocked, and exercises install.sh. Each check prints one RESULT line of raw
measurements; the assertions live here.
"""

from __future__ import annotations

import errno

import pytest

from tests.kmod import vm
from tests.kmod.conftest import KMOD, Built

pytestmark = pytest.mark.vm

GUEST = """
insmod /gpushare.ko
echo "RESULT load rc=$? version=$(cat /sys/module/gpushare/version)"
/kmodctl checks 31 /ioctl32
/kmodctl unload
test -d /sys/module/gpushare; echo "RESULT unloaded present=$((1 - $?))"
/kmod/install.sh --ko /gpushare.ko timeout_ms=2500 > /tmp/i1 2>&1
echo "RESULT install1 rc=$? timeout_ms=$(cat /sys/module/gpushare/parameters/timeout_ms)"
/kmod/install.sh --ko /gpushare.ko > /tmp/i2 2>&1
echo "RESULT install2 rc=$? already=$(grep -c 'already loaded' /tmp/i2)"
/kmod/install.sh > /tmp/i3 2>&1
echo "RESULT install3 rc=$? already=$(grep -c 'already loaded' /tmp/i3)"
cat /tmp/i1 /tmp/i2 /tmp/i3
rmmod gpushare
echo "RESULT dmesg problems=$(dmesg | grep -cE 'WARNING|BUG:|Oops|Call Trace|general protection')"
"""

SLACK_MS = 1500  # software emulation on a shared machine: generous bounds


@pytest.fixture(scope="module")
def results(built: Built) -> dict[str, dict[str, int]]:
    files = {
        "/gpushare.ko": built.module,
        "/kmodctl": built.tool,
        "/ioctl32": built.ioctl32,
        "/kmod/install.sh": KMOD / "install.sh",
        "/kmod/gpushare_internal.h": KMOD / "gpushare_internal.h",
    }
    run = vm.run_guest(GUEST, files, vm.VMOptions(timeout_s=240))
    parsed = {name: {k: int(v) for k, v in kv.items() if v.lstrip("-").isdigit()}
              for name, kv in run.results().items()}
    assert "unload" in parsed, run.output
    return parsed


def test_module_loads_with_version(results: dict[str, dict[str, int]]) -> None:
    assert results["load"]["rc"] == 0
    assert results["register"]["status"] == 0


def test_a_no_notice_and_no_delay_without_detect(results: dict[str, dict[str, int]]) -> None:
    r = results["nodetect"]
    assert r["add"] == 0 and r["got"] == 1
    assert r["err"] == errno.ENOTTY
    assert r["elapsed_us"] < SLACK_MS * 1000 // 10
    assert r["notice_pending"] == 0 and r["notices"] == 0
    assert r["hits"] == 1


def test_b_one_notice_with_pidns_and_pid(results: dict[str, dict[str, int]]) -> None:
    r = results["detect"]
    assert r["detect"] == 0 and r["notice"] == 1
    assert r["notice_pidns"] == r["want_pidns"]
    assert r["notice_pid"] == r["want_pid"]
    assert r["notice_cmd"] == r["want_cmd"]
    assert r["t0"] <= r["notice_ts"] <= r["now"]
    assert r["extra_notice"] == 0 and r["notices"] == 1


def test_c_blocked_until_release_then_prompt(results: dict[str, dict[str, int]]) -> None:
    r = results["detect"]
    assert r["held"] == 1, "the ioctl returned before release"
    assert r["release"] == 1, "release should report one woken task"
    assert r["got"] == 1 and r["err"] == errno.ENOTTY
    assert 0 <= r["unblock_us"] < SLACK_MS * 1000 // 3
    # need_notice was cleared: the next call is not blocked
    assert r["again_got"] == 1 and r["again_us"] < SLACK_MS * 1000 // 10


def test_d_timeout(results: dict[str, dict[str, int]]) -> None:
    r = results["timeout"]
    assert r["set"] == 0 and r["notice"] == 1 and r["got"] == 1
    assert r["timeout_ms"] - 50 <= r["blocked_ms"] <= r["timeout_ms"] + SLACK_MS
    assert r["timeouts"] == 1 and r["releases"] == 0


def test_dead_receiver_drops_notice_and_owner_resumes_at_timeout(
    results: dict[str, dict[str, int]],
) -> None:
    r = results["deadrcv"]
    assert r["register"] == 0 and r["got"] == 1
    assert r["dropped"] == 1 and r["sent"] == 0
    assert r["timeout_ms"] - 50 <= r["blocked_ms"] <= r["timeout_ms"] + SLACK_MS


def test_e_initial_namespace_and_other_types_pass(results: dict[str, dict[str, int]]) -> None:
    init = results["initns"]
    assert init["detect"] == 0 and init["notice_pending"] == 0
    assert init["elapsed_us"] < SLACK_MS * 1000 // 10
    other = results["othertype"]
    assert other["got"] == 1 and other["err"] == errno.ENOTTY
    assert other["notice_pending"] == 0 and other["hits"] == 0
    assert other["elapsed_us"] < SLACK_MS * 1000 // 10
    assert other["flags"] == 3  # still watched and in detect mode
    assert other["flags_after_undetect"] == 1


def test_f_refused_commands(results: dict[str, dict[str, int]]) -> None:
    r = results["refused"]
    for key in ("tiny", "truncated", "short", "long", "oversize", "huge_count", "register_items",
                "config_size", "zero_id", "big_id", "wrong_type", "zero_pid", "pad", "old_items",
                "hold_long"):
        assert r[key] == -errno.EINVAL, key
    assert r["version"] == -errno.EPROTO
    assert r["unknown"] == r["notice_cmd"] == -errno.EOPNOTSUPP
    assert r["unprivileged"] == -errno.EPERM
    assert r["entries_after"] == 0


def test_g_unload_while_blocked(results: dict[str, dict[str, int]]) -> None:
    r = results["unload"]
    assert r["notice"] == 1 and r["rc"] == 0
    assert r["got"] == 1 and r["err"] == errno.ENOTTY
    assert r["resumed_after_ms"] < SLACK_MS
    assert results["unloaded"]["present"] == 0


def test_h_two_threads_one_release(results: dict[str, dict[str, int]]) -> None:
    r = results["threads"]
    assert r["notice"] == 1 and r["extra_notice"] == 0 and r["notices"] == 1
    assert r["blocked"] == 2 and r["release"] == 2 and r["got"] == 2
    assert 0 <= r["unblock0_us"] < SLACK_MS * 1000 // 3
    assert 0 <= r["unblock1_us"] < SLACK_MS * 1000 // 3


def test_i_stats_last_access_and_counts(results: dict[str, dict[str, int]]) -> None:
    r = results["detect"]
    assert r["hits"] == 2 and r["notices"] == 1 and r["releases"] == 1
    assert r["timeouts"] == 0 and r["blocked"] == 0
    assert r["again_start"] <= r["last_access"] <= r["again_end"]
    assert r["flags"] == 1


def test_fatal_signal_ends_the_wait(results: dict[str, dict[str, int]]) -> None:
    r = results["fatal"]
    assert r["notice"] == 1 and r["reaped_ms"] < SLACK_MS and r["blocked_after"] == 0


def test_config_majors_at_run_time(results: dict[str, dict[str, int]]) -> None:
    r = results["config"]
    assert r["get"] == 0 and r["ntypes"] == 1 and r["type0"] == 0x46 and r["nmajors"] == 0
    assert r["set_major1"] == 0 and r["notice_major1"] == 1
    assert r["set_major195"] == 0 and r["notice_major195"] == 0
    assert r["bad"] == -errno.EINVAL


def test_install_script_is_idempotent(results: dict[str, dict[str, int]]) -> None:
    assert results["install1"] == {"rc": 0, "timeout_ms": 2500}
    assert results["install2"] == {"rc": 0, "already": 1}
    assert results["install3"] == {"rc": 0, "already": 1}


def test_no_kernel_warnings(results: dict[str, dict[str, int]]) -> None:
    assert results["dmesg"]["problems"] == 0


def test_detect_during_reclaim_and_delete_wakes(results: dict[str, dict[str, int]]) -> None:
    r = results["redetect"]
    assert r["notice1"] == 1 and r["redetect"] == 0
    assert r["flags"] == 7  # watched, need_notice again, still reclaiming
    assert r["release"] == 1 and r["got1"] == 1 and r["pending"] == 0
    assert r["notice2"] == 1
    assert r["delete"] == 1 and r["got2"] == 1 and r["err"] == errno.ENOTTY
    assert r["delete_wake_ms"] < SLACK_MS


def test_compat_32bit_ioctl_is_hooked(results: dict[str, dict[str, int]]) -> None:
    r = results["compat"]
    assert r["notice"] == 1 and r["pid_ok"] == 1 and r["cmd"] == 0x4601
    assert r["held"] == 1 and r["release"] == 1 and r["done"] == 1
    assert r["exit"] == errno.ENOTTY
    assert r["unblock_ms"] < SLACK_MS


def test_churn_of_commands_during_ioctls(results: dict[str, dict[str, int]]) -> None:
    r = results["churn"]
    assert r["done"] == 1 and r["exit"] == 0, r
    assert r["cycles"] >= 1


def test_targets_name_a_live_process_of_their_namespace(results: dict[str, dict[str, int]]) -> None:
    r = results["targets"]
    assert r["esrch"] == -errno.ESRCH  # no such process
    assert r["estale"] == -errno.ESTALE  # the process lives in another pid namespace
    assert (r["mixed"], r["count"], r["status0"], r["status1"]) == (-errno.ESTALE, 2, 0, -errno.ESTALE)
    assert (r["a_in"], r["b_in"]) == (1, 0)  # only the good target got an entry


def test_a_watched_namespace_id_is_not_reused_until_deleted(results: dict[str, dict[str, int]]) -> None:
    r = results["pin"]
    assert r["add"] == 0 and r["a_below_z"] == 1
    # Z died after A, yet the kernel handed out Z's id and not A's (lower, pinned by the entry)
    assert r["z_reused"] == 1 and r["a_reused_while_pinned"] == 0, r
    assert r["delete"] == 0 and r["a_reused_after_delete"] == 1, r


def test_hold_keeps_the_owner_blocked_past_the_timeout(results: dict[str, dict[str, int]]) -> None:
    r = results["hold"]  # timeout 1000 ms, a HOLD every 250 ms for 2.5 s
    assert r["notice"] == 1 and r["moved"] == 10 and r["holds"] == 10
    assert r["held"] == 1 and r["held_ms"] >= 2400, "the owner resumed before the release"
    assert r["flags"] & 4 and 0 < r["deadline_ahead_ms"] <= 1000
    assert r["release"] == 1 and r["got"] == 1 and r["unblock_ms"] < SLACK_MS
    assert r["timeouts"] == 0


def test_hold_is_bounded_by_max_hold_from_the_hit(results: dict[str, dict[str, int]]) -> None:
    r = results["hold"]  # max_hold 3000 ms, a HOLD every 250 ms for as long as the owner waits
    assert r["cap_notice"] == 1 and r["cap_got"] == 1 and r["cap_moved"] >= 6
    assert 3000 - 50 <= r["cap_blocked_ms"] <= 3000 + SLACK_MS
    assert r["cap_after"] == 0 and r["idle"] == 0  # nothing to hold once the reclaim ended
    assert (r["cap_timeouts"], r["cap_releases"], r["cap_flags"]) == (1, 0, 1)


def test_register_sends_the_notice_of_a_reclaim_again(results: dict[str, dict[str, int]]) -> None:
    r = results["resend"]
    assert r["dropped"] == 1  # nobody was registered at the hit
    assert r["register"] == 0 and r["notice"] == 1
    assert r["pidns_ok"] == r["pid_ok"] == r["ts_ok"] == 1 and r["flags"] == 1
    assert r["again"] == 1 and r["same_ts"] == 1 and r["again_flags"] == 1
    assert r["held"] == 1 and r["release"] == 1 and r["got"] == 1
    assert r["after_release"] == 0


def test_parameters_are_checked_when_written(results: dict[str, dict[str, int]]) -> None:
    r = results["params"]
    assert (r["timeout_before"], r["timeout_refused"], r["timeout_after"]) == (3000, 5, 3000)
    assert (r["hold_before"], r["hold_refused"], r["hold_after"]) == (30000, 5, 30000)
    assert (r["timeout_good"], r["timeout_set"], r["hold_good"], r["hold_set"]) == (0, 2500, 0, 2500)

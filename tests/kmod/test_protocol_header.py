"""kmod/include/gpushare_kmod.h: constants and the layout user space mirrors."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from gpushare_common.hold import MODULE_MAX_HOLD_MS, MODULE_TIMEOUT_MS, HoldTiming
from gpushare_sim.kernel_map import KernelState

from tests.kmod.vm import REPO

HEADER = REPO / "kmod" / "include" / "gpushare_kmod.h"
DEFINE_RE = re.compile(r"^#define\s+(GPUSHARE_KMOD_\w+)\s+(0x[0-9a-fA-F]+|\d+)\b", re.M)

# struct -> (size, [(field, offset), ...]) as documented in the header
LAYOUT = {
    "gpushare_kmod_hdr": (16, [("version", 0), ("cmd", 2), ("seq", 4), ("status", 8), ("count", 12)]),
    "gpushare_kmod_target": (16, [("pidns", 0), ("pid", 8), ("pad", 12)]),
    "gpushare_kmod_stats_head": (48, [("now_ns", 0), ("notices_sent", 8), ("notices_dropped", 16),
                                      ("entries", 24), ("max_entries", 28), ("receiver_portid", 32),
                                      ("timeout_ms", 36), ("max_hold_ms", 40), ("pad", 44)]),
    "gpushare_kmod_stats": (72, [("pidns", 0), ("last_access_ns", 8), ("hits", 16), ("notices", 24),
                                 ("releases", 32), ("timeouts", 40), ("holds", 48), ("deadline_ns", 56),
                                 ("blocked", 64), ("flags", 68)]),
    "gpushare_kmod_config": (88, [("ntypes", 0), ("nmajors", 4), ("types", 8), ("majors", 24)]),
    "gpushare_kmod_notice": (32, [("pidns", 0), ("ts_ns", 8), ("pid", 16), ("tid", 20),
                                  ("ioctl_cmd", 24), ("flags", 28)]),
}


def defines() -> dict[str, int]:
    return {name: int(value, 0) for name, value in DEFINE_RE.findall(HEADER.read_text())}


def test_protocol_constants() -> None:
    d = defines()
    assert d["GPUSHARE_KMOD_VERSION"] == 2
    assert d["GPUSHARE_KMOD_NETLINK_UNIT"] == 31
    types = [v for k, v in d.items() if k.startswith("GPUSHARE_KMOD_MSG_")]
    assert sorted(types) == [0x10, 0x11, 0x12]  # all >= NLMSG_MIN_TYPE
    cmds = [v for k, v in d.items() if k.startswith("GPUSHARE_KMOD_CMD_")]
    assert sorted(cmds) == list(range(1, 11))
    assert d["GPUSHARE_KMOD_MAX_IDS"] == 1024


def _layout_program() -> str:
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "gpushare_kmod.h"', "int main(void) {"]
    for struct, (_, fields) in LAYOUT.items():
        lines.append(f'printf("{struct} %zu\\n", sizeof(struct {struct}));')
        lines += [f'printf("{struct}.{f} %zu\\n", offsetof(struct {struct}, {f}));' for f, _ in fields]
    return "\n".join([*lines, "return 0; }"])


def test_struct_layout_matches_documentation(tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    (tmp_path / "layout.c").write_text(_layout_program())
    subprocess.run(["gcc", "-Wall", "-Werror", f"-I{HEADER.parent}", "-o", str(tmp_path / "layout"),
                    str(tmp_path / "layout.c")], check=True)
    out = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout
    got = dict(line.split() for line in out.splitlines())
    for struct, (size, fields) in LAYOUT.items():
        assert int(got[struct]) == size, struct
        for field, offset in fields:
            assert int(got[f"{struct}.{field}"]) == offset, f"{struct}.{field}"


MAIN = REPO / "kmod" / "gpushare_main.c"
PARAM_RE = re.compile(r"^unsigned int gpushare_(timeout_ms|max_hold_ms) = (\d+);", re.M)


def test_user_space_starts_from_the_modules_own_hold_defaults() -> None:
    """The module's parameters are the one source of every owner-back timer; user space (and the
    kernel stand-in) assume its defaults only until a kernel has reported its values."""
    found = {name: int(value) for name, value in PARAM_RE.findall(MAIN.read_text())}
    assert found == {"timeout_ms": MODULE_TIMEOUT_MS, "max_hold_ms": MODULE_MAX_HOLD_MS}
    assert (HoldTiming().timeout_ms, HoldTiming().max_hold_ms) == (MODULE_TIMEOUT_MS, MODULE_MAX_HOLD_MS)
    stand_in = KernelState()
    assert (stand_in.timeout_ms, stand_in.max_hold_ms) == (MODULE_TIMEOUT_MS, MODULE_MAX_HOLD_MS)

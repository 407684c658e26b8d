"""The VM harness: console RESULT parsing, timeouts, qemu always reaped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.kmod import vm

token = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="="),
                min_size=1, max_size=12)
value = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=12)


@given(name=token, pairs=st.dictionaries(token, value, max_size=8))
def test_result_lines_round_trip(name: str, pairs: dict[str, str]) -> None:
    line = " ".join([f"RESULT {name}", *(f"{k}={v}" for k, v in pairs.items())])
    noise = "[    1.23] kernel says hi\r\n"
    assert vm.parse_results(noise + line + "\r\n" + noise) == {name: pairs}


@given(st.text(max_size=300))
def test_parse_results_never_raises(text: str) -> None:
    for name, pairs in vm.parse_results(text).items():
        assert " " not in name and all("=" not in k for k in pairs)


def test_find_guest_kernel_error_is_clear(tmp_path: Path) -> None:
    with pytest.raises(vm.VMError, match="linux-image-amd64"):
        vm.find_guest_kernel(boot=tmp_path, modroot=tmp_path)


def _qemu_children() -> list[int]:
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me and b"qemu-system" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.vm
def test_timeout_kills_qemu_and_keeps_the_console() -> None:
    if vm.missing_tools():
        pytest.skip(f"missing system binaries: {', '.join(vm.missing_tools())}")
    with pytest.raises(vm.VMTimeout) as err:
        vm.run_guest("sleep 600\n", opts=vm.VMOptions(timeout_s=4))
    assert "SeaBIOS" in err.value.output  # what the console showed so far
    assert _qemu_children() == []


@pytest.mark.vm
def test_host_root_runs_the_project_python_and_shares_a_folder(tmp_path: Path) -> None:
    python = vm.REPO / ".venv" / "bin" / "python"
    if vm.missing_tools() or not python.exists():
        pytest.skip("missing system binaries or the project's virtual environment")
    code = f"import msgspec, sys; open('{tmp_path}/hello', 'w').write(sys.version)"
    script = f'chroot /host {python} -c "{code}"\necho "RESULT python rc=$?"\n'
    run = vm.run_guest(script, opts=vm.VMOptions(timeout_s=180, share_host_root=True, out_dir=tmp_path))
    assert run.results()["python"] == {"rc": "0"}, run.output
    assert (tmp_path / "hello").read_text().startswith("3.")


def test_the_accelerator_is_kvm_when_a_guest_boots_with_it_and_tcg_for_counted_time(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # fmt: skip
    if vm.missing_tools():
        pytest.skip(f"missing system binaries: {', '.join(vm.missing_tools())}")
    monkeypatch.delenv("GPUSHARE_VM_ACCEL", raising=False)
    assert vm.kvm_usable(str(tmp_path / "no-such-device")) is False
    assert vm.accelerator(vm.VMOptions()) == ("kvm" if vm.kvm_boots() else "tcg")
    assert vm.accelerator(vm.VMOptions(icount=True)) == "tcg"
    assert vm.accelerator(vm.VMOptions(accel="tcg")) == "tcg"
    monkeypatch.setenv("GPUSHARE_VM_ACCEL", "tcg")
    assert vm.accelerator(vm.VMOptions()) == "tcg"

"""Bundle read/write, identities and the runtime log's formats."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
from gpushare_runtime.bundle import parse_spec, read_raw, write_spec
from gpushare_runtime.errors import BundleError
from gpushare_runtime.lookup import identity_of
from gpushare_runtime.runtimelog import RuntimeLog, format_line

from .builders import spec, write_bundle


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another owner needs root")
def test_write_keeps_mode_and_owner_and_leaves_nothing(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b", spec(), mode=0o604)
    os.chown(bundle / "config.json", 1234, 5678)
    content = spec(annotations={"k": "v"})
    write_spec(str(bundle), content)
    info = os.stat(bundle / "config.json")
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o604, 1234, 5678)
    assert json.loads((bundle / "config.json").read_text()) == content
    assert sorted(p.name for p in bundle.iterdir()) == ["config.json"]


def test_unreadable_and_malformed_bundles(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"cannot read config\.json"):
        read_raw(str(tmp_path / "missing"))
    with pytest.raises(BundleError, match="not JSON"):
        parse_spec("b", b"{")
    with pytest.raises(BundleError, match="not a JSON object"):
        parse_spec("b", b"[]")


@pytest.mark.parametrize(("annotations", "expected"), [
    ({"io.kubernetes.cri.sandbox-namespace": "a", "io.kubernetes.cri.sandbox-name": "b",
      "io.kubernetes.cri.container-name": "c"}, "a/b/c"),
    ({"io.kubernetes.pod.namespace": "a", "io.kubernetes.pod.name": "b",
      "io.kubernetes.container.name": "c"}, "a/b/c"),
    ({"io.kubernetes.cri.sandbox-namespace": "a", "io.kubernetes.cri.sandbox-name": "b"}, None),
    ({"io.kubernetes.pod.namespace": "a", "io.kubernetes.pod.name": 3,
      "io.kubernetes.container.name": "c"}, None),
])
def test_identity_from_containerd_and_crio(annotations: dict[str, object],
                                           expected: str | None) -> None:
    found = identity_of({"annotations": annotations})
    assert (str(found) if found else None) == expected


def test_json_log_line_is_runc_shaped() -> None:
    record = json.loads(format_line("info", 'copied "x"', "json"))
    assert list(record) == ["level", "msg", "time"]
    assert record["msg"] == 'copied "x"'
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}(Z|[+-]\d\d:\d\d)", record["time"])


def test_text_log_line_is_logrus_shaped() -> None:
    line = format_line("error", 'bad "thing"', "text")
    assert re.fullmatch(r'time="[^"]+" level=error msg="bad \\"thing\\""\n', line)


def test_log_appends_and_errors_go_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log.json"
    path.write_text('{"level":"info","msg":"from runc","time":"t"}\n')
    log = RuntimeLog(str(path), "json")
    log.info("one")
    log.error("two")
    assert [json.loads(line)["msg"] for line in path.read_text().splitlines()] == [
        "from runc", "one", "two"]
    assert capsys.readouterr().err == "gpushare-runtime: two\n"
    RuntimeLog(str(tmp_path / "no" / "dir.log"), "json").info("ignored")


def test_an_error_reaches_the_log_when_stderr_is_broken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stderr", Broken())
    path = tmp_path / "log.json"
    RuntimeLog(str(path), "json").error("cannot copy devices")
    assert [json.loads(line)["msg"] for line in path.read_text().splitlines()] == ["cannot copy devices"]

"""Property tests: every parser of the runtime answers with a value or its typed error."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from gpushare_common import ids
from gpushare_runtime import fastjson, miniyaml
from gpushare_runtime.cdi import CdiRegistry
from gpushare_runtime.cli import parse_invocation
from gpushare_runtime.config import RuntimeConfig, parse_config
from gpushare_runtime.errors import AnnotationError, CdiError, ConfigError, RuntimeFailure
from gpushare_runtime.inject import Injector
from gpushare_runtime.lookup import IDENTITY_KEYS, IdentityConflict, identity_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .builders import NODE, identity, signed

PROPERTY = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
keys = st.sampled_from([ids.ANN_DEVICES_FROM, ids.ANN_DEVICES_IDS, ids.ANN_DEVICES_ISOLATION,
                        ids.ANN_SIGNATURE, ids.signature_annotation("from", ""),
                        ids.signature_annotation("isolation", ""), "other/"])
targets = st.sampled_from(["*", "dind", "main", "", "Bad_Name", "a" * 70])
values = st.one_of(
    st.text(max_size=40),
    json_values.map(json.dumps),
    st.sampled_from(["_/_/main", "ns/pod/main", "_/pod/main", "ns//main", '{"_/_/main": {"*": []}}',
                     "v2:" + "ab" * 32, '{"profile":"mps","resource":"nvidia.com/gpu","shadow":"ns/s",'
                     '"n":4,"k":1}']),
)


@PROPERTY
@given(st.dictionaries(st.builds(lambda k, t: k + t, keys, targets), values, max_size=4))
def test_annotations_give_requests_or_annotation_error(annotations: dict[str, str]) -> None:
    content = {"annotations": {**identity("ns", "pod", "dind"), **annotations}}
    try:
        requests = Injector(RuntimeConfig(), "/nonexistent", content).requests()
    except AnnotationError as err:
        assert err.annotation.startswith(ids.DOMAIN)
        return
    assert all(r.target in ("*", "dind") for r in requests)


@PROPERTY
@given(st.dictionaries(st.builds(lambda k, t: k + t, keys, targets), values, max_size=4))
def test_any_annotations_edit_or_fail_with_a_runtime_failure(annotations: dict[str, str]) -> None:
    content = {"annotations": {**identity("ns", "pod", "dind"), **annotations}}
    config = RuntimeConfig(node_name="node-test", key_file="/nonexistent/key", cdi_dirs=())
    try:
        Injector(config, "/nonexistent/bundle", content).edits()
    except RuntimeFailure as err:
        assert str(err)


@PROPERTY
@given(st.lists(st.sampled_from(["--root", "-root=x", "--log", "--log-format=json", "create", "run",
                                 "-b", "--bundle", "x", "--", "-", "state", "--systemd-cgroup"]),
                max_size=8))
def test_command_line_never_crashes(args: list[str]) -> None:
    invocation = parse_invocation(args)
    assert invocation.command is None or invocation.command in args
    if invocation.edits_spec:
        assert invocation.bundle is not None and invocation.bundle.startswith("/")


@pytest.mark.parametrize(("args", "command", "bundle", "log"), [
    (["--root", "/r", "--log", "/l", "--log-format", "json", "create", "--bundle", "/b", "id"],
     "create", "/b", "/l"),
    (["--systemd-cgroup", "--log=/l", "run", "-d", "-b", "/b", "--pid-file", "/p", "id"],
     "run", "/b", "/l"),
    (["-root", "/r", "create", "--console-socket", "/s", "id"], "create", None, None),
    (["--root", "/r", "delete", "--force", "id"], "delete", None, None),
])
def test_command_line_table(args: list[str], command: str, bundle: str | None, log: str | None) -> None:
    invocation = parse_invocation(args)
    assert invocation.command == command
    assert invocation.log_path == log
    if invocation.edits_spec:
        assert invocation.container_id == "id"
        assert invocation.bundle == (bundle or str(Path.cwd()))


@PROPERTY
@given(st.one_of(st.text(max_size=60), json_values.map(json.dumps),
                 st.dictionaries(st.sampled_from(["lower_runtime", "key_file", "cdi_dirs", "vendors"]),
                                 json_values, max_size=4).map(json.dumps)))
def test_config_gives_config_or_config_error(text: str) -> None:
    try:
        config = parse_config("runtime.json", text)
    except ConfigError as err:
        assert err.path == "runtime.json"
        return
    assert config.lower_runtime and config.vendors


yaml_scalars = st.one_of(
    st.integers(-1000, 1000), st.booleans(), st.none(),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12),
)
yaml_docs = st.recursive(
    yaml_scalars,
    lambda inner: st.lists(inner, min_size=1, max_size=3)
    | st.dictionaries(st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,8}", fullmatch=True), inner,
                      min_size=1, max_size=3),
    max_leaves=12,
)


def dump_yaml(value: Any, indent: int = 0) -> str:
    """A block-style emitter for the round trip (quoted strings, JSON escapes)."""
    pad = " " * indent
    if isinstance(value, dict):
        lines = []
        for key, item in value.items():
            if isinstance(item, dict | list):
                lines.append(f"{pad}{key}:\n{dump_yaml(item, indent + 2)}")
            else:
                lines.append(f"{pad}{key}: {json.dumps(item)}")
        return "\n".join(lines)
    if isinstance(value, list):
        lines = []
        for item in value:
            if isinstance(item, dict | list):
                lines.append(f"{pad}-\n{dump_yaml(item, indent + 2)}")
            else:
                lines.append(f"{pad}- {json.dumps(item)}")
        return "\n".join(lines)
    return json.dumps(value)


@PROPERTY
@given(yaml_docs)
def test_yaml_round_trip(doc: Any) -> None:
    assert miniyaml.loads(dump_yaml(doc) + "\n") == doc


@PROPERTY
@given(st.text(st.sampled_from(list(" -:#'\"[]{},\nabc0&|")), max_size=60))
def test_yaml_gives_value_or_yaml_error(text: str) -> None:
    try:
        miniyaml.loads(text)
    except miniyaml.YamlError as err:
        assert err.line >= 0


cdi_docs = st.fixed_dictionaries({
    "kind": st.sampled_from(["example.com/gpu", 3]),
    "devices": st.lists(st.fixed_dictionaries(
        {"name": st.sampled_from(["0", "1"]), "containerEdits": json_values
         | st.dictionaries(st.sampled_from(["deviceNodes", "env", "mounts"]), json_values)}),
        max_size=2)
    | json_values,
}).map(json.dumps)


@PROPERTY
@given(st.text(max_size=80) | cdi_docs, st.sampled_from(["x.json", "x.yaml"]))
def test_cdi_gives_registry_or_cdi_error(text: str, name: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, name).write_text(text)
        try:
            CdiRegistry((directory,)).resolve("example.com/gpu", "0")
        except CdiError as err:
            assert err.path.endswith(name)


@PROPERTY
@given(json_values | st.floats(allow_nan=False) | st.text())
def test_fastjson_matches_json(value: Any) -> None:
    text = json.dumps(value, separators=(",", ":"))
    assert fastjson.dumps(value) == text
    assert fastjson.loads(text) == value
    assert fastjson.loads(f" \n{text}\t".encode()) == value


@PROPERTY
@given(st.text(st.sampled_from(list('{}[]",:0123456789.eE+- \ntrufalsn\\')), max_size=30))
def test_fastjson_errors_are_value_errors(text: str) -> None:
    try:
        expected = json.loads(text)
    except ValueError:
        with pytest.raises(ValueError):
            fastjson.loads(text)
        return
    assert fastjson.loads(text) == expected


caps_docs = st.fixed_dictionaries({}, optional={
    "profile": st.sampled_from(["mps", "none", "x y", 3]), "resource": st.sampled_from(["nvidia.com/gpu", "bad name"]),
    "shadow": st.sampled_from(["ns/sh", "ns/other", "a/../b", ""]), "n": st.integers(-1, 20) | st.booleans(),
    "k": st.integers(-1, 20), "card_memory_mib": st.none() | st.integers(-5, 1 << 20) | st.text(max_size=3),
    "opt_out": st.booleans() | st.none(), "extra": st.integers()})


@PROPERTY
@given(caps_docs.map(json.dumps) | st.text(max_size=30), st.sampled_from([None, "none", "10", "x"]))
def test_signed_caps_of_any_shape_apply_or_fail_with_an_annotation_error(
        value: str, pod_choice: str | None) -> None:
    with tempfile.TemporaryDirectory() as directory:
        key = Path(directory, "key")
        key.write_bytes(b"k" * 32)
        key.chmod(0o600)
        devices = '{"ns/sh/main":{"*":["ns/sh-0"]}}'
        annotations = {**signed(b"k" * 32, "*", "from", devices), **signed(b"k" * 32, "*", "isolation", value)}
        if pod_choice is not None:
            annotations[ids.ANN_ISOLATION if pod_choice == "none" else ids.ANN_COMPUTE_PERCENTAGE] = pod_choice
        content = {"annotations": {**identity("ns", "pod", "dind"), **annotations}}
        config = RuntimeConfig(node_name=NODE, key_file=str(key), cdi_dirs=(), isolation_dir=directory)
        injector = Injector(config, directory, content)
        try:
            injector._share_caps(injector.requests()[-1], injector.requests())
        except AnnotationError as err:
            assert err.annotation.startswith(ids.DOMAIN)


identity_values = st.none() | st.sampled_from(["", "ns", "pod", "main", "other"]) | st.integers(0, 2)


@PROPERTY
@given(st.fixed_dictionaries({}, optional={k: identity_values for keys in IDENTITY_KEYS for k in keys}))
def test_identity_keys_give_one_identity_none_or_a_conflict(keys: dict[str, Any]) -> None:
    """Any mix of containerd's and CRI-O's keys: an identity both agree with, none, or a conflict."""
    try:
        found = identity_of({"annotations": keys})
    except IdentityConflict as err:
        first, second = err.keys
        assert keys[first] != keys[second]
        return
    pairs = zip(*IDENTITY_KEYS, strict=True)
    assert all(keys.get(a) is None or keys.get(b) is None or keys[a] == keys[b] for a, b in pairs)
    if found is not None:
        assert any(found.key == tuple(keys.get(k) for k in family) for family in IDENTITY_KEYS)

"""Device-ID codecs, source references, annotations and signatures."""

from __future__ import annotations

import json

import pytest
from gpushare_common import ids
from hypothesis import given
from hypothesis import strategies as st

dns_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
pod_name = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?){0,2}",
                         fullmatch=True)
real_id = st.from_regex(r"[A-Za-z0-9][-A-Za-z0-9_.:]{0,40}", fullmatch=True)


@given(dns_label, pod_name, st.integers(0, 999))
def test_share_device_id_round_trip(namespace: str, pod: str, index: int) -> None:
    text = str(ids.ShareDeviceId(namespace, pod, index))
    assert ids.parse_share_device_id(text) == ids.ShareDeviceId(namespace, pod, index)


@given(real_id)
def test_spot_id_round_trip(real: str) -> None:
    assert ids.parse_spot_device_id(ids.spot_device_id(real)) == real


@given(st.one_of(st.text(max_size=80), st.integers(), st.none(), st.binary(max_size=20)))
def test_every_parser_returns_value_or_id_error(value: object) -> None:
    for parse in (ids.parse_share_device_id, ids.parse_spot_device_id, ids.parse_source_ref,
                  ids.parse_pod_key):
        try:
            parse(value)
        except ids.IdError:
            pass


@given(st.text(max_size=200), st.sampled_from(["*", "main", "dind", "Bad_Target"]))
def test_annotation_parsers_only_raise_id_error(value: str, target: str) -> None:
    for parse in (ids.parse_devices_from, ids.parse_devices_ids):
        try:
            parse(target, value)
        except ids.IdError:
            pass


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=3), max_leaves=10))
def test_json_shaped_garbage_only_raises_id_error(doc: object) -> None:
    for parse in (ids.parse_devices_from, ids.parse_devices_ids):
        try:
            parse("main", json.dumps(doc))
        except ids.IdError:
            pass


@pytest.mark.parametrize(("text", "reason"), [
    ("default/shadow", "expected <namespace>/<shadowpod>-<index>"),
    ("default/shadow-x", "index must be a non-negative integer"),
    ("default/shadow-01", "index must be a non-negative integer"),
    ("Default/shadow-1", "not a valid namespace"),
    ("/shadow-1", "not a valid namespace"),
])
def test_bad_share_ids_say_why(text: str, reason: str) -> None:
    with pytest.raises(ids.IdError, match=reason):
        ids.parse_share_device_id(text)


def test_share_id_parses_by_last_dash() -> None:
    parsed = ids.parse_share_device_id("ml/shadow-abc-12-3")
    assert (parsed.shadow_pod, parsed.index, parsed.shadow_key) == ("shadow-abc-12", 3, "ml/shadow-abc-12")
    assert ids.share_device_ids("ml", "s", 2) == ["ml/s-0", "ml/s-1"]


def test_source_ref_same_pod_and_resolution() -> None:
    ref = ids.parse_source_ref("_/_/main")
    assert ref.same_pod and not ref.leaves_pod("ns", "p")
    assert ref.resolve("ns", "p") == ids.SourceRef("ns", "p", "main")
    other = ids.parse_source_ref("gpushare/shadow-1/main")
    assert other.leaves_pod("ns", "p") and not other.same_pod
    with pytest.raises(ids.IdError, match="'_' namespace needs '_' pod"):
        ids.parse_source_ref("_/pod/main")


def test_devices_from_plain_and_json_forms() -> None:
    plain = ids.parse_devices_from("dind", "_/_/main")
    assert plain.sources[0].copies_all and plain.sources[0].source.container == "main"
    value = ids.format_devices_from({"gs/shadow-a/main": {"*": ["gs/shadow-a-0"]},
                                     "gs/shadow-b/main": {"nvidia.com/gpu": []}})
    parsed = ids.parse_devices_from("*", value)
    assert [s.copies_all for s in parsed.sources] == [True, False]
    assert parsed.sources[1].resource_names == {"nvidia.com/gpu"}
    assert parsed.leaves_pod("ns", "p")


@pytest.mark.parametrize("value", ["{", "[]", "{}", '{"a/b/c": []}', '{"a/b": {"*": []}}',
                                   '{"a/b/c": {"*": [1]}}', "   ", "a/b"])
def test_bad_devices_from_values(value: str) -> None:
    with pytest.raises(ids.IdError) as err:
        ids.parse_devices_from("main", value)
    assert ids.ANN_DEVICES_FROM + "main" in str(err.value)


def test_devices_ids_form() -> None:
    parsed = ids.parse_devices_ids("*", ids.format_devices_ids({"nvidia.com/gpu": ["GPU-1", "GPU-2"]}))
    assert parsed.devices == (("nvidia.com/gpu", ("GPU-1", "GPU-2")),)
    with pytest.raises(ids.IdError, match="no device ids"):
        ids.parse_devices_ids("*", '{"nvidia.com/gpu": []}')


def test_device_requests_collects_signatures() -> None:
    value = "ns/shadow/main"
    signature = ids.sign(KEY, ids.KIND_FROM, NODE, "*", value)
    annotations = {
        ids.ANN_DEVICES_FROM + "*": value,
        ids.signature_annotation(ids.KIND_FROM, "*"): signature,
        ids.ANN_DEVICES_ISOLATION + "*": "{}",
        ids.ANN_SIGNATURE + "*": "ab" * 32,
        "unrelated": "x",
    }
    request, caps = ids.device_requests(annotations)
    assert (request.kind, request.target, request.signature) == (ids.KIND_FROM, "*", signature)
    assert request.legacy_signature == "ab" * 32
    assert ids.verify(KEY, request.kind, NODE, "*", value, request.signature)
    assert caps.kind == ids.KIND_ISOLATION and caps.request == ids.IsolationRequest("*", "{}")
    assert caps.signature is None


KEY = b"k" * 32
NODE = "gpu-node-1"
node_names = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?(\.[a-z0-9]{1,5}){0,2}", fullmatch=True)
kinds = st.sampled_from(sorted(ids.SIGNED_KINDS))
targets = st.sampled_from(["*", "main", "dind"])


@given(st.binary(min_size=16, max_size=64), kinds, node_names, targets, st.text(max_size=200))
def test_signature_binds_key_kind_node_target_and_value(key: bytes, kind: str, node: str,
                                                        target: str, value: str) -> None:
    signature = ids.sign(key, kind, node, target, value)
    assert signature.startswith("v2:") and ids.verify(key, kind, node, target, value, signature)
    other_kind = sorted(ids.SIGNED_KINDS - {kind})[0]
    other_target = "other" if target != "other" else "*"
    for changed in ((key + b"x", kind, node, target, value), (key, other_kind, node, target, value),
                    (key, kind, node + "x", target, value), (key, kind, node, other_target, value),
                    (key, kind, node, target, value + "x")):
        assert not ids.verify(*changed, signature)
    assert not ids.verify(key, kind, node, target, value, None)


@given(st.binary(max_size=80), kinds, node_names, targets, st.text(max_size=100))
def test_signature_is_hmac_sha256_over_the_documented_message(key: bytes, kind: str, node: str,
                                                               target: str, value: str) -> None:
    import hashlib
    import hmac

    message = f"gpushare.k8s.io/signature/v2\n{kind}\n{node}\n{target}\n{value}"
    digest = hmac.new(key, message.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
    assert ids.sign(key, kind, node, target, value) == "v2:" + digest
    assert ids.verify(key, kind, node, target, value, "v2:" + digest.upper() + "\n")


@given(st.text(min_size=1, max_size=80))
def test_verify_any_signature_text_is_a_bool(signature: str) -> None:
    assert ids.verify(KEY, "from", NODE, "*", "v", signature) in (True, False)


def test_unversioned_and_unknown_versions_say_what_to_do() -> None:
    old = ids._hmac_sha256(KEY, b"*\nvalue")  # what a device plugin before v2 wrote
    with pytest.raises(ids.SignatureError, match="upgrade the device plugin"):
        ids.check_signature(KEY, "from", NODE, "*", "value", old)
    with pytest.raises(ids.SignatureError, match="version 'v3' is not supported"):
        ids.check_signature(KEY, "from", NODE, "*", "value", "v3:" + old)
    with pytest.raises(ids.SignatureError, match="missing"):
        ids.check_signature(KEY, "from", NODE, "*", "value", "  ")
    with pytest.raises(ids.IdError, match="node name"):
        ids.sign(KEY, "from", "", "*", "value")
    with pytest.raises(ids.IdError, match="signature kind"):
        ids.sign(KEY, "owner", NODE, "*", "value")


def test_load_key_errors_say_what_to_do(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ids.IdError, match="create it with"):
        ids.load_key(str(tmp_path / "missing"))
    short = tmp_path / "short"
    short.write_text("abc")
    with pytest.raises(ids.IdError, match="shorter than 16"):
        ids.load_key(str(short))
    good = tmp_path / "good"
    good.write_text("a" * 64 + "\n")
    assert ids.load_key(str(good)) == b"a" * 64


# --- no path tricks in any ID (issue 16: `a/../../dev/sda` passed as a device ID) -------

segment = st.from_regex(r"[A-Za-z0-9][-A-Za-z0-9_.:]{0,12}", fullmatch=True)
real_ids = st.lists(segment, min_size=1, max_size=4).map("/".join)
bad_segments = st.sampled_from([".", "..", ""])
controls = st.sampled_from([chr(c) for c in (*range(32), 127)])


def with_segment(parts: list[str], bad: str, where: int) -> str:
    return "/".join([*parts[:where], bad, *parts[where:]])


def inserted(text: str, char: str, where: int) -> str:
    """``char`` inside ``text`` (an annotation value's surrounding blanks are not part of it)."""
    where = 1 + where % (len(text) - 1) if len(text) > 1 else 0
    return text[:where] + char + text[where:]


def parsers_of_ids() -> list[object]:
    return [ids.check_real_device_id, ids.parse_spot_device_id, ids.parse_share_device_id,
            ids.parse_source_ref, ids.parse_pod_key,
            lambda v: ids.parse_devices_ids("*", json.dumps({"nvidia.com/gpu": [v]})),
            lambda v: ids.parse_devices_from("*", json.dumps({"ns/pod/main": {"*": [v]}})),
            lambda v: ids.parse_devices_from("*", v)]


@given(real_ids)
def test_real_ids_with_ordinary_segments_are_accepted(real: str) -> None:
    assert ids.check_real_device_id(real) == real
    assert ids.parse_spot_device_id(ids.spot_device_id(real)) == real
    assert ids.parse_devices_ids("*", json.dumps({"nvidia.com/gpu": [real]})).devices


@given(st.lists(segment, min_size=1, max_size=3), bad_segments, st.integers(0, 3))
def test_dot_and_empty_segments_are_refused_everywhere(parts: list[str], bad: str, where: int) -> None:
    value = with_segment(parts, bad, where)
    for parse in parsers_of_ids():
        with pytest.raises(ids.IdError):
            parse(value)  # type: ignore[operator]
    with pytest.raises(ids.IdError):
        ids.parse_spot_device_id(ids.SPOT_PREFIX + value)


@given(st.one_of(real_ids, dns_label.map(lambda n: f"ns/{n}-3"), dns_label.map(lambda n: f"ns/{n}/main")),
       controls, st.integers(0, 60))
def test_control_characters_are_refused_everywhere(value: str, char: str, where: int) -> None:
    text = inserted(value, char, where)
    for parse in parsers_of_ids():
        with pytest.raises(ids.IdError):
            parse(text)  # type: ignore[operator]


@pytest.mark.parametrize("value", ["a/../../dev/sda", "GPU-0/..", "./GPU-0", "GPU-0//1", "GPU-0/",
                                   "GPU-0\0", "GPU-\n0"])
def test_traversal_examples_are_refused(value: str) -> None:
    with pytest.raises(ids.IdError, match="not a valid device id"):
        ids.check_real_device_id(value)


@pytest.mark.parametrize("value", ["ns/a..b-0", "ns/a.-b-0", "ns/.a-0", "ns/a./b-0"])
def test_pod_names_are_rfc1123_subdomains(value: str) -> None:
    with pytest.raises(ids.IdError):
        ids.parse_share_device_id(value)

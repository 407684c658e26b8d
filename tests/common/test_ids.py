"""Device-ID codecs, source references, annotations and signatures."""

from __future__ import annotations

import json

import pytest
from gpushare_common import ids
from hypothesis import given
from hypothesis import strategies as st

dns_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
pod_name = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,30}[a-z0-9])?", fullmatch=True)
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
    annotations = {
        ids.ANN_DEVICES_FROM + "*": value,
        ids.ANN_SIGNATURE + "*": ids.sign(b"k" * 32, "*", value),
        "unrelated": "x",
    }
    (request,) = ids.device_requests(annotations)
    assert request.target == "*" and ids.verify(b"k" * 32, "*", value, request.signature)


@given(st.binary(min_size=16, max_size=64), st.text(max_size=50), st.text(max_size=200))
def test_signature_verifies_only_same_key_target_value(key: bytes, target: str, value: str) -> None:
    signature = ids.sign(key, target, value)
    assert ids.verify(key, target, value, signature)
    assert not ids.verify(key, target + "x", value, signature)
    assert not ids.verify(key, target, value + "x", signature)
    assert not ids.verify(key + b"x", target, value, signature)
    assert not ids.verify(key, target, value, None)


@given(st.text(min_size=1, max_size=80))
def test_verify_any_signature_text_is_a_bool(signature: str) -> None:
    assert ids.verify(b"k" * 32, "*", "v", signature) in (True, False)


@given(st.binary(max_size=200), st.text(max_size=50), st.text(max_size=200))
def test_signature_is_the_standard_hmac_sha256(key: bytes, target: str, value: str) -> None:
    import hashlib
    import hmac

    expected = hmac.new(key, f"{target}\n{value}".encode(), hashlib.sha256).hexdigest()
    assert ids.sign(key, target, value) == expected
    assert ids.verify(key, target, value, expected.upper() + "\n")


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

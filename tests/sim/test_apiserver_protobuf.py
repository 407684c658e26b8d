"""Protobuf request bodies: the decoder against messages built with the protobuf
runtime from the published field numbers (property tests), kubectl's own bodies
(see test_kubectl), and malformed ones answered with a Status."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from gpushare_sim.apiserver import protobuf
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.kubeapi import KubeApi

_F = descriptor_pb2.FieldDescriptorProto
_MESSAGES: dict[str, list[tuple[str, int, int, str]]] = {  # name -> (field, number, type, message type)
    "Unknown": [("typeMeta", 1, _F.TYPE_MESSAGE, "TypeMeta"), ("raw", 2, _F.TYPE_BYTES, "")],
    "TypeMeta": [("apiVersion", 1, _F.TYPE_STRING, ""), ("kind", 2, _F.TYPE_STRING, "")],
    "Entry": [("key", 1, _F.TYPE_STRING, ""), ("value", 2, _F.TYPE_STRING, "")],
    "ObjectMeta": [("name", 1, _F.TYPE_STRING, ""), ("namespace", 3, _F.TYPE_STRING, ""),
                   ("generation", 7, _F.TYPE_INT64, ""), ("labels", 11, _F.TYPE_MESSAGE, "Entry"),
                   ("finalizers", 14, _F.TYPE_STRING, "")],
    "BoundObjectReference": [("kind", 1, _F.TYPE_STRING, ""), ("name", 3, _F.TYPE_STRING, ""),
                             ("uid", 4, _F.TYPE_STRING, "")],
    "TokenRequestSpec": [("audiences", 1, _F.TYPE_STRING, ""),
                         ("boundObjectRef", 3, _F.TYPE_MESSAGE, "BoundObjectReference"),
                         ("expirationSeconds", 4, _F.TYPE_INT64, "")],
    "TokenRequest": [("metadata", 1, _F.TYPE_MESSAGE, "ObjectMeta"), ("spec", 2, _F.TYPE_MESSAGE, "TokenRequestSpec")],
}  # fmt: skip
_REPEATED = {("ObjectMeta", "labels"), ("ObjectMeta", "finalizers"), ("TokenRequestSpec", "audiences")}


def _classes() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(name="k8s_test.proto", package="k8stest", syntax="proto2")
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field, number, kind, type_name in fields:
            label = _F.LABEL_REPEATED if (name, field) in _REPEATED else _F.LABEL_OPTIONAL
            added = message.field.add(name=field, number=number, type=kind, label=label)
            if type_name:
                added.type_name = f".k8stest.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"k8stest.{name}")) for name in _MESSAGES}


CLASSES = _classes()
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    unknown = CLASSES["Unknown"](typeMeta=CLASSES["TypeMeta"](apiVersion=api_version, kind=kind), raw=raw)
    return protobuf.MAGIC + unknown.SerializeToString()


@settings(max_examples=200, deadline=None)
@given(name=_text, namespace=_text, generation=st.integers(-(2**63), 2**63 - 1),
       labels=st.dictionaries(_text, _text, max_size=4), finalizers=st.lists(_text, max_size=3),
       audiences=st.lists(_text, max_size=3), seconds=st.integers(0, 2**40), bound=st.booleans())  # fmt: skip
def test_token_request_round_trip(
    name: str, namespace: str, generation: int, labels: dict[str, str], finalizers: list[str],
    audiences: list[str], seconds: int, bound: bool,
) -> None:
    meta = CLASSES["ObjectMeta"](name=name, namespace=namespace, generation=generation, finalizers=finalizers,
                                 labels=[CLASSES["Entry"](key=k, value=v) for k, v in labels.items()])  # fmt: skip
    spec = CLASSES["TokenRequestSpec"](audiences=audiences, expirationSeconds=seconds)
    if bound:
        spec.boundObjectRef.CopyFrom(CLASSES["BoundObjectReference"](kind="Node", name=name, uid="u"))
    raw = CLASSES["TokenRequest"](metadata=meta, spec=spec).SerializeToString()
    decoded = protobuf.decode(envelope("authentication.k8s.io/v1", "TokenRequest", raw))
    assert decoded["apiVersion"] == "authentication.k8s.io/v1" and decoded["kind"] == "TokenRequest"
    expected_meta = {"name": name, "namespace": namespace, "generation": generation, "labels": labels,
                     "finalizers": finalizers}  # fmt: skip
    assert {k: decoded["metadata"].get(k, [] if k == "finalizers" else {} if k == "labels" else None)
            for k in expected_meta} == expected_meta  # fmt: skip
    assert decoded["spec"].get("audiences", []) == audiences
    assert decoded["spec"]["expirationSeconds"] == seconds
    assert decoded["spec"].get("boundObjectRef") == ({"kind": "Node", "name": name, "uid": "u"} if bound else None)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_never_escapes_as_anything_but_protobuf_error(junk: bytes) -> None:
    for body in (junk, protobuf.MAGIC + junk, envelope("v1", "Namespace", junk)):
        try:
            protobuf.decode(body)
        except protobuf.ProtobufError:
            pass


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"{}", "prefix"),
        (protobuf.MAGIC + b"\x0a\x05ab", "runs past the end"),
        (protobuf.MAGIC + b"\x08", "truncated varint"),
        (protobuf.MAGIC + b"\x0f", "invalid field key"),
        (envelope("v1", "Namespace", b"\x0a\x02\x0a\xff"), "truncated varint"),
        (envelope("v1", "Namespace", b"\x0a\x03\x0a\x05a"), "runs past the end"),
        (envelope("v1", "Namespace", b"\x0a\x03\x0a\x01\xff"), "not valid UTF-8"),
        (envelope("v1", "Namespace", b"\x0a\x02\x38\x01" + b"\x0a\x02\x0a\x00"), ""),
    ],
)
def test_malformed_bodies_name_the_problem(body: bytes, why: str) -> None:
    if not why:
        assert protobuf.decode(body)["metadata"] == {"generation": 1, "name": ""}
        return
    with pytest.raises(protobuf.ProtobufError, match=why):
        protobuf.decode(body)


def post(kube_api: KubeApi, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{kube_api.url}{path}", data=body, method="POST",
                                     headers={"Content-Type": protobuf.CONTENT_TYPE})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_over_http(kube_api: KubeApi) -> None:
    meta = CLASSES["ObjectMeta"](name="from-protobuf").SerializeToString()
    namespace = b"\x0a" + bytes([len(meta)]) + meta  # Namespace{metadata}
    code, created = post(kube_api, "/api/v1/namespaces", envelope("v1", "Namespace", namespace))
    assert code == 201 and created["metadata"]["name"] == "from-protobuf"
    code, status = post(kube_api, "/api/v1/namespaces/default/pods", envelope("v1", "Pod", b""))
    assert code == 415 and status["reason"] == "UnsupportedMediaType" and "send JSON" in status["message"]
    code, status = post(kube_api, "/api/v1/namespaces", protobuf.MAGIC + b"\x08")
    assert code == 400 and "not a valid protobuf message" in status["message"]
    assert post(kube_api, "/api/v1/namespaces", b"")[0] == 400

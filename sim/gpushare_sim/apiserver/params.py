"""Reading requests: query parameters, JSON bodies, selectors, delete options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
import yaml

from . import protobuf
from .errors import ApiError, bad_request
from .kinds import Kind
from .objects import DeleteOptions
from .schema import SchemaError, check
from .selectors import SelectorError, parse_field_selector, parse_label_selector
from .store import Selection

_decode = msgspec.json.Decoder().decode
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MAX_GRACE = 10**9  # seconds; keeps deletionTimestamp a representable time
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}


def flag(query: Mapping[str, str], name: str) -> bool:
    text = query.get(name)
    if text is None or text == "":
        return False
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise bad_request(f"invalid boolean for query parameter {name}: {text!r}")


def integer(query: Mapping[str, str], name: str) -> int | None:
    text = query.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise bad_request(f"invalid integer for query parameter {name}: {text!r}") from None


def resource_version(query: Mapping[str, str]) -> int | None:
    """The watch start: None for "" and "0" (start from the current state)."""
    value = integer(query, "resourceVersion")
    if value is not None and value < 0:
        raise bad_request(f"invalid resourceVersion {value}")
    return value or None


def selection(kind: Kind, namespace: str | None, query: Mapping[str, str]) -> Selection:
    try:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""))
    except SelectorError as error:
        raise bad_request(str(error)) from None
    for term in fields:
        if term.field not in kind.field_labels:
            raise bad_request(f'field label not supported: "{term.field}"')
    return Selection(kind, namespace, labels, fields)


def decode_body(body: bytes, content_type: str | None) -> Any:
    """A request body as JSON data: JSON, or Kubernetes protobuf for the kinds kubectl sends so."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != protobuf.CONTENT_TYPE:
        return decode_json(body)
    if not body:
        raise bad_request("the request body is empty")
    try:
        return protobuf.decode(body)
    except protobuf.UnsupportedKind as error:
        raise ApiError(415, str(error)) from None
    except protobuf.ProtobufError as error:
        raise bad_request(f"the request body is not a valid protobuf message: {error}") from None


def decode_yaml(body: bytes) -> Any:
    """An apply configuration: YAML (JSON is YAML too)."""
    if not body.strip():
        raise bad_request("the request body is empty")
    try:
        return yaml.load(body, Loader=_YAML_LOADER)
    except yaml.YAMLError as error:
        raise bad_request(f"the request body is not valid YAML: {error}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None


def decode_json(body: bytes) -> Any:
    if not body.strip():
        raise bad_request("the request body is empty")
    try:
        return _decode(body)
    except msgspec.DecodeError as error:
        raise bad_request(f"the request body is not valid JSON: {error}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None


def check_object(
    kind: Kind, obj: Any, query: Mapping[str, str], model: str | None = None
) -> list[str]:
    """Validate a body against the kind's schema; returns warnings for unknown fields."""
    if not isinstance(obj, dict):
        raise bad_request(f"the request body must be a JSON object, not {type(obj).__name__}")
    mode = query.get("fieldValidation", "Strict")
    if mode not in ("Strict", "Warn", "Ignore"):
        raise bad_request(f"fieldValidation must be Strict, Warn or Ignore, not {mode!r}")
    try:
        unknown = check(model or kind.model, obj, prune=mode != "Strict")
    except SchemaError as error:
        raise bad_request(str(error)) from None
    if unknown and mode == "Strict":
        names = ", ".join(f'unknown field "{path}"' for path in unknown)
        raise bad_request(f"strict decoding error: {names}")
    return [] if mode == "Ignore" else [f'unknown field "{path}"' for path in unknown]


def check_type(kind: Kind, obj: dict[str, Any], expected_kind: str | None = None) -> None:
    api_version, kind_name = obj.get("apiVersion"), obj.get("kind")
    wanted_kind = expected_kind or kind.kind
    if api_version not in (None, "", kind.api_version) and expected_kind is None:
        raise bad_request(
            f"the API version in the data ({api_version}) does not match the expected "
            f"API version ({kind.api_version})"
        )
    if kind_name not in (None, "", wanted_kind):
        raise bad_request(f"the kind in the data ({kind_name}) does not match {wanted_kind}")


def check_identity(kind: Kind, obj: dict[str, Any], namespace: str, name: str | None) -> None:
    meta = obj.get("metadata") or {}
    given_ns = meta.get("namespace")
    if kind.namespaced and given_ns not in (None, "", namespace):
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on "
            "the request"
        )
    if name is not None and meta.get("name") not in (None, name):
        raise bad_request(f"the name of the object ({meta.get('name')}) does not match {name!r}")


def delete_options(query: Mapping[str, str], body: bytes, content_type: str | None = None) -> DeleteOptions:
    options: dict[str, Any] = {}
    if body.strip():
        decoded = decode_body(body, content_type)
        if not isinstance(decoded, dict):
            raise bad_request("DeleteOptions must be a JSON object")
        options = decoded
    grace = integer(query, "gracePeriodSeconds")
    if grace is None:
        grace = _int_field(options, "gracePeriodSeconds")
    preconditions = options.get("preconditions") or {}
    if not isinstance(preconditions, dict):
        raise bad_request("DeleteOptions.preconditions must be an object")
    if grace is not None and grace < 0:
        grace = 1  # as the API server does for negative values
    if grace is not None:
        grace = min(grace, _MAX_GRACE)
    return DeleteOptions(grace, preconditions.get("uid"), preconditions.get("resourceVersion"))


def _int_field(options: dict[str, Any], name: str) -> int | None:
    value = options.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ApiError(400, f"DeleteOptions.{name} must be an integer")
    return value

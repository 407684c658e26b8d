"""Device IDs, source references, runtime annotations and their signatures.

Standard library only: the OCI runtime imports this module on every container
create, so it must stay cheap to import.  Every parser returns a value or
raises :class:`IdError` (a ``ValueError``); no other exception escapes.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs the runtime ~20 ms
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

DOMAIN = "gpushare.k8s.io"
ANN_DEVICES_FROM = f"{DOMAIN}/container-devices-from."
ANN_DEVICES_IDS = f"{DOMAIN}/container-devices-ids."
ANN_DEVICES_ISOLATION = f"{DOMAIN}/container-devices-isolation."
ANN_SIGNATURE = f"{DOMAIN}/signature."  # unversioned signatures of older device plugins: refused
ANN_ISOLATION = f"{DOMAIN}/isolation"  # ShadowPod: its isolation profile; SharePod: "none" opts out
ANN_COMPUTE_PERCENTAGE = f"{DOMAIN}/compute-percentage"  # SharePod: a lower compute share
ANN_DEVICE_OWNER = f"{DOMAIN}/device-owner"
ANN_SHARE_SPEC = f"{DOMAIN}/share-spec"
ANN_SHARE_KIND = f"{DOMAIN}/share-kind"
ANN_PARTITION = f"{DOMAIN}/partition"
ANN_USER_ID = f"{DOMAIN}/user-id"
ANN_PLACEMENT = f"{DOMAIN}/placement"  # ShadowPod: the SharePods' node constraints it was made for
LABEL_POD_DESCRIPTION = f"{DOMAIN}/pod-description"
SHADOW_POD_LABEL_VALUE = "shadow-pod"
CONDITION_USING = f"{DOMAIN}/Using"
CONDITION_CAPS_ENFORCED = f"{DOMAIN}/CapsEnforced"  # SharePod: whether its hard caps hold now
SHADOW_CONTAINER = "main"

ANY_TARGET = "*"
SAME_AS_TARGET = "_"
ALL_RESOURCES = "*"
SPOT_PREFIX = "spot-"

MAX_ANNOTATION_BYTES = 64 * 1024

# Validators are plain character-set checks: no ``re`` import on the runtime's create path.
_LOWER_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_ALNUM = _LOWER_ALNUM | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_DIGITS = frozenset("0123456789")


def _shaped(value: str, edge: frozenset[str], inner: frozenset[str], max_len: int) -> bool:
    """Non-empty, at most ``max_len``, ends in ``edge`` characters, the rest in ``inner``."""
    return (0 < len(value) <= max_len and value[0] in edge and value[-1] in edge
            and all(c in inner for c in value))


def _is_dns_label(value: str) -> bool:
    return _shaped(value, _LOWER_ALNUM, _LOWER_ALNUM | {"-"}, 63)


def _is_dns_subdomain(value: str) -> bool:
    """RFC 1123 subdomain as Kubernetes checks it: dot-separated labels, 253 characters."""
    return 0 < len(value) <= 253 and all(
        _shaped(label, _LOWER_ALNUM, _LOWER_ALNUM | {"-"}, 253) for label in value.split(".")
    )


def _is_resource(value: str) -> bool:
    domain, slash, name = value.rpartition("/")
    if slash and not _is_dns_subdomain(domain):
        return False
    return _shaped(name, _ALNUM, _ALNUM | {"-", "_", "."}, 253)


_REAL_ID_CHARS = _ALNUM | frozenset("-_.:/")


def _is_real_id(value: str) -> bool:
    """Vendor IDs (``GPU-<uuid>``, ``0``, ``0000:3b:00.0``, ``MIG-<uuid>/1/0``): printable
    ASCII of a small set, and as a path no empty, ``.`` or ``..`` segment, because the
    runtime puts IDs into device paths."""
    return (0 < len(value) <= 252 and value[0] in _ALNUM
            and all(c in _REAL_ID_CHARS for c in value)
            and all(part not in ("", ".", "..") for part in value.split("/")))


def _is_index(value: str) -> bool:
    return (0 < len(value) <= 6 and all(c in _DIGITS for c in value)
            and (value == "0" or value[0] != "0"))


class _Record:
    """A small immutable value type (what a frozen, slotted dataclass gives, without importing
    ``dataclasses``): positional or keyword construction, equality, hashing, repr."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = self.__slots__
        defaults = getattr(type(self), "_defaults", {})
        values = dict(zip(names, args, strict=False))
        values.update(kwargs)
        for name in names:
            object.__setattr__(self, name, values[name] if name in values else defaults[name])

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"


class IdError(ValueError):
    """A malformed device ID, reference or annotation: says what, which value and why."""

    def __init__(self, what: str, value: object, reason: str) -> None:
        self.what = what
        self.value = value
        self.reason = reason
        shown = value if isinstance(value, str) and len(value) <= 120 else repr(value)[:120]
        super().__init__(f"invalid {what} {shown!r}: {reason}")


def _check(valid: Any, what: str, value: object) -> str:
    if not isinstance(value, str):
        raise IdError(what, value, f"expected a string, got {type(value).__name__}")
    if not valid(value):
        raise IdError(what, value, f"not a valid {what}")
    return value


def check_namespace(value: object) -> str:
    return _check(_is_dns_label, "namespace", value)


def check_pod_name(value: object) -> str:
    return _check(_is_dns_subdomain, "pod name", value)


def check_container_name(value: object) -> str:
    return _check(_is_dns_label, "container name", value)


def check_resource_name(value: object) -> str:
    return _check(_is_resource, "resource name", value)


def check_real_device_id(value: object) -> str:
    return _check(_is_real_id, "device id", value)


def check_node_name(value: object) -> str:
    return _check(_is_dns_subdomain, "node name", value)


# --- pod and container keys -------------------------------------------------


def pod_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def parse_pod_key(key: object) -> tuple[str, str]:
    if not isinstance(key, str) or key.count("/") != 1:
        raise IdError("pod key", key, "expected <namespace>/<pod>")
    namespace, name = key.split("/")
    return check_namespace(namespace), check_pod_name(name)


# --- share virtual devices --------------------------------------------------


class ShareDeviceId(_Record):
    """``<namespace>/<shadowpod-name>-<index>``: one of the N virtual devices of a ShadowPod."""

    __slots__ = ("namespace", "shadow_pod", "index")
    namespace: str
    shadow_pod: str
    index: int

    def __str__(self) -> str:
        return f"{self.namespace}/{self.shadow_pod}-{self.index}"

    @property
    def shadow_key(self) -> str:
        return pod_key(self.namespace, self.shadow_pod)


def share_device_ids(namespace: str, shadow_pod: str, count: int) -> list[str]:
    return [str(ShareDeviceId(namespace, shadow_pod, i)) for i in range(count)]


def parse_share_device_id(value: object) -> ShareDeviceId:
    if not isinstance(value, str):
        raise IdError("share device id", value, "expected a string")
    namespace, slash, rest = value.partition("/")
    name, dash, index = rest.rpartition("-")
    if not slash or not dash:
        raise IdError("share device id", value, "expected <namespace>/<shadowpod>-<index>")
    if not _is_index(index):
        raise IdError("share device id", value, "index must be a non-negative integer")
    try:
        return ShareDeviceId(check_namespace(namespace), check_pod_name(name), int(index))
    except IdError as err:
        raise IdError("share device id", value, err.reason) from None


# --- spot devices -----------------------------------------------------------


def spot_device_id(real_id: str) -> str:
    return SPOT_PREFIX + check_real_device_id(real_id)


def parse_spot_device_id(value: object) -> str:
    """Return the real device ID behind ``spot-<id>``."""
    if not isinstance(value, str) or not value.startswith(SPOT_PREFIX):
        raise IdError("spot device id", value, f"expected {SPOT_PREFIX}<real device id>")
    try:
        return check_real_device_id(value[len(SPOT_PREFIX) :])
    except IdError as err:
        raise IdError("spot device id", value, err.reason) from None


# --- source references ------------------------------------------------------


class SourceRef(_Record):
    """``ns/pod/container``; ``_`` in namespace or pod means "same as the target"."""

    __slots__ = ("namespace", "pod", "container")
    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"

    @property
    def same_pod(self) -> bool:
        return self.namespace == SAME_AS_TARGET and self.pod == SAME_AS_TARGET

    def resolve(self, namespace: str, pod: str) -> SourceRef:
        """Replace ``_`` by the target's namespace and pod."""
        return SourceRef(
            namespace if self.namespace == SAME_AS_TARGET else self.namespace,
            pod if self.pod == SAME_AS_TARGET else self.pod,
            self.container,
        )

    def leaves_pod(self, namespace: str, pod: str) -> bool:
        resolved = self.resolve(namespace, pod)
        return (resolved.namespace, resolved.pod) != (namespace, pod)


def parse_source_ref(value: object) -> SourceRef:
    if not isinstance(value, str) or value.count("/") != 2:
        raise IdError("source reference", value, "expected <namespace>/<pod>/<container>")
    namespace, pod, container = value.split("/")
    try:
        if namespace != SAME_AS_TARGET:
            check_namespace(namespace)
        if pod != SAME_AS_TARGET:
            check_pod_name(pod)
        check_container_name(container)
    except IdError as err:
        raise IdError("source reference", value, err.reason) from None
    if namespace == SAME_AS_TARGET and pod != SAME_AS_TARGET:
        raise IdError("source reference", value, "'_' namespace needs '_' pod")
    return SourceRef(namespace, pod, container)


# --- runtime annotations ----------------------------------------------------


class SourceSelection(_Record):
    """Which devices to copy from one source: ``{"*": [...]}`` or per resource name."""

    __slots__ = ("source", "resources")
    _defaults = {"resources": ((ALL_RESOURCES, ()),)}
    source: SourceRef
    resources: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def copies_all(self) -> bool:
        return any(name == ALL_RESOURCES for name, _ in self.resources)

    @property
    def resource_names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.resources if name != ALL_RESOURCES)


class DevicesFrom(_Record):
    """``container-devices-from.<target>``."""

    __slots__ = ("target", "sources")
    target: str
    sources: tuple[SourceSelection, ...]

    def leaves_pod(self, namespace: str, pod: str) -> bool:
        return any(s.source.leaves_pod(namespace, pod) for s in self.sources)


class DevicesIds(_Record):
    """``container-devices-ids.<target>``: real devices per vendor resource."""

    __slots__ = ("target", "devices")
    target: str
    devices: tuple[tuple[str, tuple[str, ...]], ...]


def _check_target(target: str, annotation: str) -> str:
    if target == ANY_TARGET:
        return target
    try:
        return check_container_name(target)
    except IdError as err:
        raise IdError("annotation target", annotation, err.reason) from None


class _JsonContext:
    """The attributes the C scanner reads from a ``json.JSONDecoder``."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict[str, str] = {}

    @staticmethod
    def parse_constant(name: str) -> float:
        return float(name.replace("Infinity", "inf"))


def _json_scanner() -> Any:
    try:
        import _json
    except ImportError:  # pragma: no cover - every CPython build has it
        return None
    return _json.make_scanner(_JsonContext())  # type: ignore[arg-type]


_JSON_SCAN = _json_scanner()
_JSON_SPACE = " \t\n\r"


def json_loads(text: str | bytes) -> object:
    """``json.loads`` through the C accelerator alone (``import json`` pulls in ``re``,
    ``enum`` and ``functools``: more than the rest of a container create).  Same results;
    every error is a ``ValueError``."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"not UTF-8: {err}") from None
    if _JSON_SCAN is None:  # pragma: no cover
        import json

        return json.loads(text)
    start = len(text) - len(text.lstrip(_JSON_SPACE))
    try:
        value, end = _JSON_SCAN(text, start)
    except StopIteration as stop:
        raise ValueError(f"expecting a JSON value at character {stop.value}") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if text[end:].strip(_JSON_SPACE):
        raise ValueError(f"extra data at character {end}")
    return value


def _load_json(annotation: str, value: str) -> object:
    if len(value) > MAX_ANNOTATION_BYTES:
        raise IdError("annotation", annotation, f"value longer than {MAX_ANNOTATION_BYTES} bytes")
    try:
        return json_loads(value)
    except ValueError as err:
        raise IdError("annotation", annotation, f"malformed JSON: {err}") from None


def _id_list(annotation: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise IdError("annotation", annotation, "device lists must be JSON arrays of strings")
    return tuple(value)


def parse_devices_from(target: str, value: str) -> DevicesFrom:
    annotation = ANN_DEVICES_FROM + str(target)
    _check_target(target, annotation)
    if not isinstance(value, str) or not value.strip():
        raise IdError("annotation", annotation, "empty value")
    if not value.lstrip().startswith("{"):
        try:
            return DevicesFrom(target, (SourceSelection(parse_source_ref(value.strip())),))
        except IdError as err:
            raise IdError("annotation", annotation, err.reason) from None
    doc = _load_json(annotation, value)
    if not isinstance(doc, dict) or not doc:
        raise IdError("annotation", annotation, "expected a non-empty JSON object of sources")
    sources = []
    for ref, selection in doc.items():
        try:
            source = parse_source_ref(ref)
        except IdError as err:
            raise IdError("annotation", annotation, err.reason) from None
        if not isinstance(selection, dict) or not selection:
            raise IdError("annotation", annotation, f"source {ref!r}: expected an object")
        resources = []
        for name, ids in selection.items():
            try:
                if name != ALL_RESOURCES:
                    check_resource_name(name)
                listed = tuple(check_real_device_id(i) for i in _id_list(annotation, ids))
            except IdError as err:
                raise IdError("annotation", annotation, err.reason) from None
            resources.append((name, listed))
        sources.append(SourceSelection(source, tuple(resources)))
    return DevicesFrom(target, tuple(sources))


def parse_devices_ids(target: str, value: str) -> DevicesIds:
    annotation = ANN_DEVICES_IDS + str(target)
    _check_target(target, annotation)
    doc = _load_json(annotation, value) if isinstance(value, str) else None
    if not isinstance(doc, dict) or not doc:
        raise IdError("annotation", annotation, "expected a JSON object {resource: [ids]}")
    devices = []
    for resource, ids in doc.items():
        try:
            check_resource_name(resource)
            checked = tuple(check_real_device_id(i) for i in _id_list(annotation, ids))
        except IdError as err:
            raise IdError("annotation", annotation, err.reason) from None
        if not checked:
            raise IdError("annotation", annotation, f"resource {resource!r}: no device ids")
        devices.append((resource, checked))
    return DevicesIds(target, tuple(devices))


def format_devices_from(sources: Mapping[str, Mapping[str, list[str]]]) -> str:
    """JSON multi-source form, keys sorted so that signatures are stable."""
    import json

    return json.dumps(sources, sort_keys=True, separators=(",", ":"))


def format_devices_ids(devices: Mapping[str, list[str]]) -> str:
    import json

    return json.dumps(devices, sort_keys=True, separators=(",", ":"))


class IsolationRequest(_Record):
    """``container-devices-isolation.<target>``: the caps of a share, as Allocate signed them
    (their value is read by :mod:`gpushare_common.isolation`)."""

    __slots__ = ("target", "value")
    target: str
    value: str


KIND_FROM = "from"
KIND_IDS = "ids"
KIND_ISOLATION = "isolation"
ANNOTATION_PREFIXES = {KIND_FROM: ANN_DEVICES_FROM, KIND_IDS: ANN_DEVICES_IDS,
                       KIND_ISOLATION: ANN_DEVICES_ISOLATION}
_KINDS = tuple((prefix, kind) for kind, prefix in ANNOTATION_PREFIXES.items())


def signature_annotation(kind: str, target: str) -> str:
    """``gpushare.k8s.io/signature-<kind>.<target>``: one signature per annotation kind, so
    that Allocate's ``from`` and ``isolation`` annotations, both for ``*``, each have theirs."""
    return f"{DOMAIN}/signature-{kind}.{target}"


class DeviceRequest(_Record):
    """One runtime annotation found on a container, with its signature if any.

    ``legacy_signature`` is an unversioned ``signature.<target>`` of an older device plugin,
    kept only to say so when it is all there is."""

    __slots__ = ("kind", "target", "annotation", "value", "request", "signature",
                 "legacy_signature")
    kind: str
    target: str
    annotation: str
    value: str
    request: DevicesFrom | DevicesIds | IsolationRequest
    signature: str | None
    legacy_signature: str | None


def _parse_request(kind: str, target: str, value: str) -> DevicesFrom | DevicesIds | IsolationRequest:
    if kind == KIND_FROM:
        return parse_devices_from(target, value)
    if kind == KIND_IDS:
        return parse_devices_ids(target, value)
    annotation = ANN_DEVICES_ISOLATION + str(target)
    _check_target(target, annotation)
    if not isinstance(value, str) or len(value) > MAX_ANNOTATION_BYTES:
        raise IdError("annotation", annotation, f"expected a string of at most {MAX_ANNOTATION_BYTES} bytes")
    return IsolationRequest(target, value)


def device_requests(annotations: Mapping[str, str]) -> list[DeviceRequest]:
    """Every gpushare device annotation of a container, parsed; the first bad one raises."""
    found = []
    for key, value in sorted(annotations.items()):
        for prefix, kind in _KINDS:
            if key.startswith(prefix):
                target = key[len(prefix) :]
                request = _parse_request(kind, target, value)
                found.append(DeviceRequest(
                    kind, target, key, value, request,
                    annotations.get(signature_annotation(kind, target)),
                    annotations.get(ANN_SIGNATURE + target)))
                break
    return found


# --- signatures -------------------------------------------------------------


_SHA256_BLOCK = 64


def _sha256_accelerator() -> Any:
    """CPython's own SHA-256 (``_sha256``, ``_sha2`` from 3.12), None where absent."""
    for name in ("_sha256", "_sha2"):
        try:
            return __import__(name).sha256
        except ImportError:  # pragma: no cover - depends on the interpreter
            continue
    return None  # pragma: no cover


def _hmac_sha256(key: bytes, message: bytes) -> str:
    """Hex HMAC-SHA256 (RFC 2104) without ``hmac`` and ``hashlib``: they load OpenSSL,
    which costs a signed create more than the rest of it."""
    sha256 = _sha256_accelerator()
    if sha256 is None:  # pragma: no cover
        import hashlib
        import hmac

        return hmac.new(key, message, hashlib.sha256).hexdigest()
    if len(key) > _SHA256_BLOCK:
        key = sha256(key).digest()
    key = key.ljust(_SHA256_BLOCK, b"\0")
    inner = sha256(bytes(b ^ 0x36 for b in key) + message).digest()
    return str(sha256(bytes(b ^ 0x5C for b in key) + inner).hexdigest())


SIGNATURE_VERSION = "v2"
SIGNATURE_TAG = f"{DOMAIN}/signature/{SIGNATURE_VERSION}"
SIGNED_KINDS = frozenset({KIND_FROM, KIND_IDS, KIND_ISOLATION})


class SignatureError(ValueError):
    """A signature that does not verify; ``reason`` says why, in words an operator can act on."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def signature_message(kind: str, node: str, target: str, value: str) -> bytes:
    """What a v2 signature covers: the tag (domain and version), the annotation kind, the
    node's name, the target as written in the annotation key, and the value, one per line
    (only the value, last, may hold a newline, so the fields cannot run into each other)."""
    if kind not in SIGNED_KINDS:
        raise IdError("signature kind", kind, f"expected one of {sorted(SIGNED_KINDS)}")
    check_node_name(node)
    if target != ANY_TARGET:
        check_container_name(target)
    return "\n".join((SIGNATURE_TAG, kind, node, target, value)).encode("utf-8", "surrogatepass")


def sign(key: bytes, kind: str, node: str, target: str, value: str) -> str:
    """``v2:<hex HMAC-SHA256 of signature_message(...) with the node key>``."""
    return f"{SIGNATURE_VERSION}:{_hmac_sha256(key, signature_message(kind, node, target, value))}"


UPGRADE_DEVICE_PLUGIN = ("unversioned signature, written by a device plugin older than this runtime: "
            f"upgrade the device plugin on this node (only {SIGNATURE_VERSION} signatures are accepted)")


def check_signature(key: bytes, kind: str, node: str, target: str, value: str,
                    signature: object) -> None:
    """Raise :class:`SignatureError` unless ``signature`` is this node's v2 signature of it."""
    if not isinstance(signature, str) or not signature.strip():
        raise SignatureError("missing")
    version, colon, digest = signature.strip().partition(":")
    if not colon:
        raise SignatureError(UPGRADE_DEVICE_PLUGIN)
    if version != SIGNATURE_VERSION:
        raise SignatureError(f"signature version {version[:20]!r} is not supported (this side "
                             f"knows {SIGNATURE_VERSION}): run matching device plugin and runtime")
    expected = sign(key, kind, node, target, value)[len(SIGNATURE_VERSION) + 1 :]
    from _operator import _compare_digest  # hmac.compare_digest without importing hmac

    # a hex digest is ASCII; compare_digest refuses other text with TypeError
    if not digest.isascii() or not _compare_digest(expected, digest.lower()):
        raise SignatureError("does not match (another key or node, another annotation kind or "
                             "target, or an altered value)")


def verify(key: bytes, kind: str, node: str, target: str, value: str, signature: object) -> bool:
    try:
        check_signature(key, kind, node, target, value, signature)
    except SignatureError:
        return False
    return True


def load_key(path: str) -> bytes:
    """Read the node signing key; raise IdError with what to do if unusable."""
    try:
        with open(path, "rb") as handle:
            key = handle.read().strip()
    except OSError as err:
        raise IdError("signing key file", path, f"cannot read ({err.strerror}); "
                      "create it with: head -c 32 /dev/urandom | xxd -p -c 64 > FILE; "
                      "chmod 600 FILE") from None
    if len(key) < 16:
        raise IdError("signing key file", path, "key shorter than 16 bytes")
    return key

"""Settings: one frozen struct per topic, read from the environment once in ``main()``.

``load(NatsSettings, "GPUSHARE_NATS_")`` maps each field to an environment
variable (``url`` -> ``GPUSHARE_NATS_URL``) and converts it to the field's
type.  A bad value raises :class:`SettingsError` naming the variable, the value
and what was expected; unknown variables are ignored.  Handlers never read
``os.environ``: services pass these structs explicitly.

A service's settings are one struct of topics (:func:`topic`: a struct and its prefix), the
common ones included (:class:`CommonSettings`), and its ``DEFAULT_PORT``; :func:`load_service`
reads them all, one way for every service, and :func:`variables` lists every variable they
read, with its type, default and meaning (the docstring under each field): a service's
``--help`` is made from it, so it cannot drift from what is read.

``env_of(NatsSettings, NATS_PREFIX, url=...)`` is the reverse: the variables
that ``load`` reads back as those field values (whoever starts a service, such
as the local cluster, writes its settings with it, so a renamed field is a type
error there, not a silently ignored variable).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import textwrap
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from .subjects import DEFAULT_PREFIX

T = TypeVar("T")
P = ParamSpec("P")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingsError(ValueError):
    def __init__(self, variable: str, value: str, expected: str) -> None:
        self.variable = variable
        self.value = value
        self.expected = expected
        super().__init__(f"{variable}={value!r}: expected {expected}")


def _convert(variable: str, raw: str, kind: Any) -> Any:
    origin = typing.get_origin(kind)
    if kind is str:
        return raw
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in _TRUE or lowered in _FALSE:
            return lowered in _TRUE
        raise SettingsError(variable, raw, "a boolean (true/false)")
    if kind in (int, float):
        try:
            return kind(raw.strip())
        except ValueError:
            raise SettingsError(variable, raw, f"a number ({kind.__name__})") from None
    if origin is tuple:
        (item,) = {a for a in typing.get_args(kind) if a is not Ellipsis}
        parts = [p.strip() for p in raw.split(",") if p.strip()]
        return tuple(_convert(variable, p, item) for p in parts)
    if origin is dict:
        pairs = [p.strip() for p in raw.split(",") if p.strip()]
        result = {}
        for pair in pairs:
            key, eq, value = pair.partition("=")
            if not eq or not key.strip():
                raise SettingsError(variable, raw, "a comma-separated list of key=value")
            result[key.strip()] = value.strip()
        return result
    raise SettingsError(variable, raw, f"a supported type, not {kind!r}")


def load(cls: type[T], prefix: str, environ: Mapping[str, str] | None = None) -> T:
    """Build ``cls`` (a frozen dataclass) from ``<prefix><FIELD>`` variables."""
    env = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        variable = prefix + field.name.upper()
        if variable in env:
            values[field.name] = _convert(variable, env[variable], hints[field.name])
    return cls(**values)


def _render(variable: str, value: Any, kind: Any) -> str:
    origin = typing.get_origin(kind)
    if kind is bool:
        return "true" if value else "false"
    if kind in (str, int, float):
        return str(value)
    if origin is tuple:
        (item,) = {a for a in typing.get_args(kind) if a is not Ellipsis}
        return ",".join(_render(variable, v, item) for v in value)
    if origin is dict:
        return ",".join(f"{k}={v}" for k, v in value.items())
    raise SettingsError(variable, repr(value), f"a supported type, not {kind!r}")


def env_of(cls: Callable[P, T], prefix: str, *args: P.args, **values: P.kwargs) -> dict[str, str]:
    """The ``<prefix><FIELD>`` variables from which :func:`load` builds ``cls(**values)``: one for
    each field given, in the text ``load`` parses. The field names are ``cls``'s own parameters
    (checked by the type checker, and at run time by building ``cls``, whose checks run too); a
    value the variable's text cannot carry (a list item holding a comma) raises ``ValueError``."""
    if args:
        raise TypeError("env_of takes the field values by name")
    built = cls(*args, **values)
    hints = typing.get_type_hints(cls)
    env: dict[str, str] = {}
    for name in values:
        variable = prefix + name.upper()
        value = getattr(built, name)
        text = _render(variable, value, hints[name])
        if _convert(variable, text, hints[name]) != value:
            raise ValueError(f"{variable}: {value!r} does not survive the round trip through {text!r}")
        env[variable] = text
    return env


@dataclass(frozen=True, slots=True)
class NatsSettings:
    url: str = "nats://127.0.0.1:4222"
    """One NATS server, or a comma-separated list of a cluster's servers."""
    name: str = "gpushare"
    """The connection's name, as the server's monitoring shows it."""
    user: str = ""
    """A static user's name (with its password)."""
    password: str = ""
    """A static user's password."""
    password_file: str = ""
    """A file holding the static user's password, read when the service connects (a node's leaf users)."""
    token: str = ""
    """A token presented at connect."""
    token_file: str = ""
    """A file holding the token, re-read at every connect (a projected service-account token rotates)."""
    nkey_seed_file: str = ""
    """A file holding the user's NKey seed."""
    creds_file: str = ""
    """A NATS credentials file (user JWT and seed)."""
    tls_ca_file: str = ""
    """The CA bundle that signs the servers' certificates (TLS on when set)."""
    tls_cert_file: str = ""
    """The client's certificate, for servers that verify clients."""
    tls_key_file: str = ""
    """The client certificate's key."""
    prefix: str = DEFAULT_PREFIX
    """The prefix of every subject (another prefix is a separate installation, e.g. a sandbox)."""
    stream: str = "GPUSHARE"
    """The JetStream stream holding the events."""
    stream_max_age_s: float = 24 * 3600.0
    """How long the stream keeps an event (when this process creates it)."""
    stream_max_bytes: int = 1 << 30
    """The stream's size limit in bytes (when this process creates it)."""
    stream_replicas: int = 1
    """The stream's and buckets' replicas (when this process creates them)."""
    kv_prefix: str = "gpushare"
    """The prefix of the key-value buckets' names."""
    connect_timeout_s: float = 2.0
    """How long one connection attempt may take."""
    reconnect_wait_s: float = 0.5
    """The pause between reconnection attempts."""
    ensure_layout: bool = False
    """Create the stream and buckets when missing (a single server without auth, tests); with
    least-authority users only the installer may, and services wait for them instead."""

    def servers(self) -> list[str]:
        """``url`` is one server or a comma-separated list of a cluster's servers."""
        return [u.strip() for u in self.url.split(",") if u.strip()]


@dataclass(frozen=True, slots=True)
class HttpSettings:
    host: str = "0.0.0.0"
    """The address /healthz, /readyz, /status and /metrics are served on."""
    port: int = 8080
    """Their port (each service has its own default; 0: any free port, logged and reported in
    the ports file)."""
    ports_dir: str = ""
    """A launcher's directory: the bound port is written there (``gpushare_common.ports``)."""


@dataclass(frozen=True, slots=True)
class LogSettings:
    level: str = "INFO"
    """The lowest level logged: DEBUG, INFO, WARNING or ERROR."""
    json: bool = False
    """One JSON object per line instead of text."""


@dataclass(frozen=True, slots=True)
class NodeSettings:
    name: str = ""
    """The node this process serves (set it from spec.nodeName); node services require it."""

    def require(self) -> str:
        if not self.name:
            raise SettingsError("GPUSHARE_NODE_NAME", "", "the node name (set it from spec.nodeName)")
        return self.name


@dataclass(frozen=True, slots=True)
class KubeSettings:
    kubeconfig: str = ""
    """A kubeconfig file; empty: the in-cluster configuration, then ~/.kube/config."""
    system_namespace: str = "gpushare-system"
    """gpushare's own namespace: ShadowPods live only here."""
    qps_timeout_s: float = 10.0
    """How long one request to the API server may take."""
    watch_timeout_s: int = 300
    """How long the API server keeps one watch open before it is renewed."""
    threads: int = 4
    """API calls in flight at once (each open watch reads in a thread of its own)."""

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise SettingsError(KUBE_PREFIX + "THREADS", str(self.threads), "at least 1 thread")


NATS_PREFIX = "GPUSHARE_NATS_"
HTTP_PREFIX = "GPUSHARE_HTTP_"
LOG_PREFIX = "GPUSHARE_LOG_"
NODE_PREFIX = "GPUSHARE_NODE_"
KUBE_PREFIX = "GPUSHARE_KUBE_"
_PREFIX = "gpushare.prefix"  # a topic field's metadata: its variables' prefix


def topic(cls: Callable[[], T], prefix: str) -> T:
    """A field of a service's settings: one topic's struct, read from ``<prefix><FIELD>`` variables."""
    return dataclasses.field(default_factory=cls, metadata={_PREFIX: prefix})


@dataclass(frozen=True, slots=True)
class CommonSettings:
    """The topics every node service reads."""

    nats: NatsSettings = topic(NatsSettings, NATS_PREFIX)
    http: HttpSettings = topic(HttpSettings, HTTP_PREFIX)
    log: LogSettings = topic(LogSettings, LOG_PREFIX)
    node: NodeSettings = topic(NodeSettings, NODE_PREFIX)
    kube: KubeSettings = topic(KubeSettings, KUBE_PREFIX)


def _topics(cls: type[Any]) -> Iterator[tuple[str, str, type[Any]]]:
    """``(field, prefix or "", type)`` of each field of a service's settings ("": a nested group)."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        yield field.name, field.metadata.get(_PREFIX, ""), hints[field.name]


def _defaults(cls: type[Any], environ: Mapping[str, str]) -> Mapping[str, str]:
    port = getattr(cls, "DEFAULT_PORT", None)
    return environ if port is None else {**env_of(HttpSettings, HTTP_PREFIX, port=port), **environ}


def _load_tree(cls: type[T], environ: Mapping[str, str]) -> T:
    values = {name: load(kind, prefix, environ) if prefix else _load_tree(kind, environ)
              for name, prefix, kind in _topics(cls)}
    return cls(**values)


def load_service(cls: type[T], environ: Mapping[str, str] | None = None) -> T:
    """A service's settings (a struct of :func:`topic` fields and nested groups of them, such as
    :class:`CommonSettings`) from the environment; its ``DEFAULT_PORT``, when it has one, is the
    HTTP port unless ``GPUSHARE_HTTP_PORT`` says otherwise."""
    return _load_tree(cls, _defaults(cls, os.environ if environ is None else environ))


@dataclass(frozen=True, slots=True)
class Variable:
    """One environment variable a service reads."""

    name: str
    kind: str
    default: str
    meaning: str


def variables(cls: type[Any]) -> list[Variable]:
    """Every variable :func:`load_service` reads for ``cls``, in the order of its fields."""
    port = getattr(cls, "DEFAULT_PORT", None)
    return [dataclasses.replace(v, default=str(port)) if v.name == HTTP_PREFIX + "PORT" and port is not None else v
            for v in _variables(cls)]  # fmt: skip


def _variables(cls: type[Any]) -> Iterator[Variable]:
    for _, prefix, kind in _topics(cls):
        if not prefix:
            yield from _variables(kind)
            continue
        meanings, hints, built = field_docs(kind), typing.get_type_hints(kind), kind()
        for field in dataclasses.fields(kind):
            variable = prefix + field.name.upper()
            default = _render(variable, getattr(built, field.name), hints[field.name])
            yield Variable(variable, _kind_name(hints[field.name]), default, meanings.get(field.name, ""))


def part(settings: Any, kind: type[T]) -> T | None:
    """The struct of type ``kind`` in a service's settings (e.g. its :class:`LogSettings`)."""
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if isinstance(value, kind):
            return value
        found = part(value, kind) if dataclasses.is_dataclass(value) else None
        if found is not None:
            return found
    return None


def _kind_name(kind: Any) -> str:
    origin = typing.get_origin(kind)
    if origin is tuple:
        (item,) = {a for a in typing.get_args(kind) if a is not Ellipsis}
        return f"comma-separated {_kind_name(item)}s"
    if origin is dict:
        return "comma-separated key=value pairs"
    return {str: "text", int: "integer", float: "number", bool: "boolean"}.get(kind, str(kind))


def field_docs(cls: type[Any]) -> dict[str, str]:
    """Each field's docstring (the string literal right under it in ``cls``'s source), on one line."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source shipped: the help lists the variables without meanings
        return {}
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef)
    docs: dict[str, str] = {}
    for field, under in zip(node.body, node.body[1:], strict=False):
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name) and isinstance(under, ast.Expr) \
                and isinstance(under.value, ast.Constant) and isinstance(under.value.value, str):
            docs[field.target.id] = " ".join(under.value.value.split())
    return docs


def describe(cls: type[Any]) -> str:
    """The settings part of a service's ``--help``: every variable, its type, default and meaning."""
    lines = ["settings (environment variables, read once at start; a bad value stops the start with one",
             "line naming the variable, exit status 2):", ""]
    for variable in variables(cls):
        default = variable.default if variable.default else '""'
        lines.append(f"  {variable.name}  ({variable.kind}, default {default})")
        lines.extend(textwrap.wrap(variable.meaning, 96, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(lines)

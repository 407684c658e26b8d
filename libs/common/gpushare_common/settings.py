"""Settings: one frozen struct per topic, read from the environment once in ``main()``.

``load(NatsSettings, "GPUSHARE_NATS_")`` maps each field to an environment
variable (``url`` -> ``GPUSHARE_NATS_URL``) and converts it to the field's
type.  A bad value raises :class:`SettingsError` naming the variable, the value
and what was expected; unknown variables are ignored.  Handlers never read
``os.environ``: services pass these structs explicitly.

``env_of(NatsSettings, NATS_PREFIX, url=...)`` is the reverse: the variables
that ``load`` reads back as those field values (whoever starts a service, such
as the local cluster, writes its settings with it, so a renamed field is a type
error there, not a silently ignored variable).
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Callable, Mapping
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
    name: str = "gpushare"
    user: str = ""
    password: str = ""
    token: str = ""
    token_file: str = ""  # re-read at every connect (a projected service-account token rotates)
    nkey_seed_file: str = ""
    creds_file: str = ""
    tls_ca_file: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    prefix: str = DEFAULT_PREFIX
    stream: str = "GPUSHARE"
    stream_max_age_s: float = 24 * 3600.0
    stream_max_bytes: int = 1 << 30
    stream_replicas: int = 1
    kv_prefix: str = "gpushare"
    connect_timeout_s: float = 2.0
    reconnect_wait_s: float = 0.5
    # create the stream and buckets when missing (a single server without auth, tests); with
    # least-authority users only the installer may, and services wait for them instead
    ensure_layout: bool = False

    def servers(self) -> list[str]:
        """``url`` is one server or a comma-separated list of a cluster's servers."""
        return [u.strip() for u in self.url.split(",") if u.strip()]


@dataclass(frozen=True, slots=True)
class HttpSettings:
    host: str = "0.0.0.0"
    port: int = 8080


@dataclass(frozen=True, slots=True)
class LogSettings:
    level: str = "INFO"
    json: bool = False


@dataclass(frozen=True, slots=True)
class NodeSettings:
    name: str = ""

    def require(self) -> str:
        if not self.name:
            raise SettingsError("GPUSHARE_NODE_NAME", "", "the node name (set it from spec.nodeName)")
        return self.name


@dataclass(frozen=True, slots=True)
class KubeSettings:
    kubeconfig: str = ""  # empty: in-cluster config, then ~/.kube/config
    system_namespace: str = "gpushare-system"  # gpushare's own namespace: ShadowPods live only here
    qps_timeout_s: float = 10.0
    watch_timeout_s: int = 300


NATS_PREFIX = "GPUSHARE_NATS_"
HTTP_PREFIX = "GPUSHARE_HTTP_"
LOG_PREFIX = "GPUSHARE_LOG_"
NODE_PREFIX = "GPUSHARE_NODE_"
KUBE_PREFIX = "GPUSHARE_KUBE_"


@dataclass(frozen=True, slots=True)
class CommonSettings:
    nats: NatsSettings
    http: HttpSettings
    log: LogSettings
    node: NodeSettings
    kube: KubeSettings


def load_common(environ: Mapping[str, str] | None = None, default_port: int = 8080) -> CommonSettings:
    env = {**env_of(HttpSettings, HTTP_PREFIX, port=default_port), **(os.environ if environ is None else environ)}
    return CommonSettings(
        nats=load(NatsSettings, NATS_PREFIX, env),
        http=load(HttpSettings, HTTP_PREFIX, env),
        log=load(LogSettings, LOG_PREFIX, env),
        node=load(NodeSettings, NODE_PREFIX, env),
        kube=load(KubeSettings, KUBE_PREFIX, env),
    )

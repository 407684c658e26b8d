"""Settings: one frozen struct per topic, read from the environment once in ``main()``.

``load(NatsSettings, "GPUSHARE_NATS_")`` maps each field to an environment
variable (``url`` -> ``GPUSHARE_NATS_URL``) and converts it to the field's
type.  A bad value raises :class:`SettingsError` naming the variable, the value
and what was expected; unknown variables are ignored.  Handlers never read
``os.environ``: services pass these structs explicitly.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
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
    prefix: str = "gpushare.v1"
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


@dataclass(frozen=True, slots=True)
class CommonSettings:
    nats: NatsSettings
    http: HttpSettings
    log: LogSettings
    node: NodeSettings
    kube: KubeSettings


def load_common(environ: Mapping[str, str] | None = None, default_port: int = 8080) -> CommonSettings:
    env = dict(os.environ if environ is None else environ)
    env.setdefault("GPUSHARE_HTTP_PORT", str(default_port))
    return CommonSettings(
        nats=load(NatsSettings, "GPUSHARE_NATS_", env),
        http=load(HttpSettings, "GPUSHARE_HTTP_", env),
        log=load(LogSettings, "GPUSHARE_LOG_", env),
        node=load(NodeSettings, "GPUSHARE_NODE_", env),
        kube=load(KubeSettings, "GPUSHARE_KUBE_", env),
    )

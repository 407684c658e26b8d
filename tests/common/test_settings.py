"""Settings written as environment variables read back as the same struct."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import pytest
from gpushare_common.settings import (
    HTTP_PREFIX,
    NATS_PREFIX,
    CommonSettings,
    HttpSettings,
    NatsSettings,
    SettingsError,
    describe,
    env_of,
    load,
    load_service,
    topic,
    variables,
)


@dataclass(frozen=True, slots=True)
class Sample:
    name: str = ""
    """What it is called."""
    count: int = 0
    ratio: float = 0.5
    enabled: bool = True
    items: tuple[str, ...] = ()
    sizes: tuple[int, ...] = (1, 2)
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.count < 0:
            raise SettingsError("X_COUNT", str(self.count), "a count")


def test_env_of_names_each_field_given_as_load_reads_it() -> None:
    env = env_of(Sample, "X_", name="a b", count=3, ratio=0.1, enabled=False, items=("p", "q"), sizes=(4,),
                 labels={"k": "v", "l": ""})
    assert env == {"X_NAME": "a b", "X_COUNT": "3", "X_RATIO": "0.1", "X_ENABLED": "false", "X_ITEMS": "p,q",
                   "X_SIZES": "4", "X_LABELS": "k=v,l="}
    assert load(Sample, "X_", env) == Sample("a b", 3, 0.1, False, ("p", "q"), (4,), {"k": "v", "l": ""})
    assert env_of(Sample, "X_") == {}


def test_env_of_refuses_what_the_variable_cannot_carry_and_what_the_struct_refuses() -> None:
    with pytest.raises(ValueError, match="round trip"):
        env_of(Sample, "X_", items=("a,b",))
    with pytest.raises(SettingsError, match="X_COUNT"):
        env_of(Sample, "X_", count=-1)
    with pytest.raises(TypeError):
        env_of(Sample, "X_", colour="red")  # type: ignore[call-arg]


@dataclass(frozen=True, slots=True)
class ServiceSample:
    DEFAULT_PORT: ClassVar[int] = 8082
    common: CommonSettings = field(default_factory=CommonSettings)
    sample: Sample = topic(Sample, "X_")


def test_a_services_settings_load_every_topic_and_its_default_port() -> None:
    env = {**env_of(NatsSettings, NATS_PREFIX, url="nats://a:1,nats://b:2", stream_replicas=3),
           **env_of(HttpSettings, HTTP_PREFIX, host="127.0.0.1"), **env_of(Sample, "X_", count=4)}
    settings = load_service(ServiceSample, env)
    assert (settings.common.nats.url, settings.common.nats.stream_replicas) == ("nats://a:1,nats://b:2", 3)
    assert (settings.common.http.host, settings.common.http.port) == ("127.0.0.1", 8082)
    assert settings.sample == Sample(count=4)
    assert load_service(ServiceSample, {**env, **env_of(HttpSettings, HTTP_PREFIX, port=9)}).common.http.port == 9
    with pytest.raises(SettingsError, match="X_COUNT"):
        load_service(ServiceSample, {"X_COUNT": "-1"})


def test_variables_list_every_field_with_its_type_default_and_meaning() -> None:
    listed = {v.name: v for v in variables(ServiceSample)}
    assert set(listed) == {"X_" + f.upper() for f in Sample.__dataclass_fields__} | {
        prefix + f.upper() for prefix, kind in (("GPUSHARE_NATS_", NatsSettings), ("GPUSHARE_HTTP_", HttpSettings))
        for f in kind.__dataclass_fields__} | {"GPUSHARE_LOG_LEVEL", "GPUSHARE_LOG_JSON", "GPUSHARE_NODE_NAME",
                                                "GPUSHARE_KUBE_KUBECONFIG", "GPUSHARE_KUBE_SYSTEM_NAMESPACE",
                                                "GPUSHARE_KUBE_QPS_TIMEOUT_S", "GPUSHARE_KUBE_WATCH_TIMEOUT_S",
                                                "GPUSHARE_KUBE_THREADS"}
    name = listed["X_NAME"]
    assert (name.kind, name.default, name.meaning) == ("text", "", "What it is called.")
    assert (listed["X_SIZES"].kind, listed["X_SIZES"].default) == ("comma-separated integers", "1,2")
    assert listed["X_LABELS"].kind == "comma-separated key=value pairs" and listed["X_ENABLED"].default == "true"
    assert listed["GPUSHARE_HTTP_PORT"].default == "8082"  # the service's own, not the struct's
    assert listed["X_COUNT"].meaning == ""  # no docstring under it
    text = describe(ServiceSample)
    assert "  GPUSHARE_NATS_URL  (text, default nats://127.0.0.1:4222)" in text
    assert "      What it is called." in text


def test_the_kubernetes_client_needs_a_thread_for_its_calls() -> None:
    assert load_service(ServiceSample, {"GPUSHARE_KUBE_THREADS": "2"}).common.kube.threads == 2
    with pytest.raises(SettingsError, match="GPUSHARE_KUBE_THREADS='0': expected at least 1 thread"):
        load_service(ServiceSample, {"GPUSHARE_KUBE_THREADS": "0"})

"""Settings written as environment variables read back as the same struct."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from gpushare_common.settings import (
    HTTP_PREFIX,
    NATS_PREFIX,
    HttpSettings,
    NatsSettings,
    SettingsError,
    env_of,
    load,
    load_common,
)


@dataclass(frozen=True, slots=True)
class Sample:
    name: str = ""
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


def test_common_settings_round_trip_and_the_default_port() -> None:
    env = {**env_of(NatsSettings, NATS_PREFIX, url="nats://a:1,nats://b:2", stream_replicas=3),
           **env_of(HttpSettings, HTTP_PREFIX, host="127.0.0.1")}
    common = load_common(env, default_port=8082)
    assert (common.nats.url, common.nats.stream_replicas) == ("nats://a:1,nats://b:2", 3)
    assert (common.http.host, common.http.port) == ("127.0.0.1", 8082)
    assert load_common({**env, **env_of(HttpSettings, HTTP_PREFIX, port=9)}, default_port=8082).http.port == 9

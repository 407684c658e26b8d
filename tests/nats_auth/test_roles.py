"""The role table and the settings: good tables parse, every bad one is a clear error naming the setting."""

from __future__ import annotations

import pytest
from gpushare_common.settings import SettingsError, load_service
from gpushare_nats_auth.roles import Account, RoleTable, RoleTableError, account_of_user, default_roles
from gpushare_nats_auth.settings import Settings
from hypothesis import given
from hypothesis import strategies as st


def test_default_table_gives_each_service_its_role() -> None:
    table = RoleTable.parse(default_roles())
    assert table.role_of(Account("gpushare-system", "gpushare-solver")) == "solver"
    assert table.role_of(Account("gpushare-system", "gpushare-console")) == "observer"
    assert table.role_of(Account("default", "gpushare-solver")) is None
    assert table.needs_node("kmod-bridge") and not table.needs_node("observer")


@pytest.mark.parametrize(("pairs", "expected"), [
    ({"gpushare-system/x": "installer"}, "role 'installer' is not one of"),
    ({"gpushare-system/x": "admin"}, "role 'admin' is not one of"),
    ({"gpushare-system": "solver"}, "'gpushare-system' is not namespace/serviceaccount"),
    ({"Bad_NS/x": "solver"}, "'Bad_NS/x' is not namespace/serviceaccount"),
    ({"ns/": "solver"}, "'ns/' is not namespace/serviceaccount"),
    ({}, "no service account is given a role"),
])  # fmt: skip
def test_bad_tables_are_refused(pairs: dict[str, str], expected: str) -> None:
    with pytest.raises(RoleTableError, match=expected) as caught:
        RoleTable.parse(pairs)
    assert caught.value.variable == "GPUSHARE_AUTH_ROLES"


def test_settings_from_the_environment() -> None:
    settings = load_service(Settings, {"GPUSHARE_AUTH_ROLES": "team/a=detector, team/b=observer",
                                        "GPUSHARE_AUTH_MAX_TTL_S": "60"})  # fmt: skip
    assert settings.auth.role_table().role_of(Account("team", "b")) == "observer"
    assert settings.auth.max_ttl_s == 60 and settings.common.http.port == 8086


@pytest.mark.parametrize(("env", "variable"), [
    ({"GPUSHARE_AUTH_ROLES": "team/a"}, "GPUSHARE_AUTH_ROLES"),
    ({"GPUSHARE_AUTH_ROLES": "team/a=root"}, "GPUSHARE_AUTH_ROLES"),
    ({"GPUSHARE_AUTH_MAX_TTL_S": "0"}, "GPUSHARE_AUTH_MAX_TTL_S"),
    ({"GPUSHARE_AUTH_WORKERS": "many"}, "GPUSHARE_AUTH_WORKERS"),
    ({"GPUSHARE_AUTH_AUDIENCE": ""}, "GPUSHARE_AUTH_AUDIENCE"),
])  # fmt: skip
def test_bad_settings_name_their_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_service(Settings, env)
    assert caught.value.variable == variable and variable in str(caught.value)


@given(st.dictionaries(st.text(max_size=30), st.text(max_size=15), max_size=4))
def test_any_table_parses_or_names_the_setting(pairs: dict[str, str]) -> None:
    try:
        table = RoleTable.parse(pairs)
    except RoleTableError as err:
        assert err.variable == "GPUSHARE_AUTH_ROLES"
    else:
        assert all(table.role_of(a) in pairs.values() for a in table.roles)


@given(st.text(max_size=80))
def test_any_username_is_a_service_account_or_none(username: str) -> None:
    account = account_of_user(username)
    if account is not None:
        assert username == f"system:serviceaccount:{account.namespace}:{account.name}"


def test_service_account_usernames() -> None:
    assert account_of_user("system:serviceaccount:ns:name") == Account("ns", "name")
    assert account_of_user("system:node:n1") is None
    assert account_of_user("system:serviceaccount:ns") is None

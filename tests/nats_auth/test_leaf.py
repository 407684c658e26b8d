"""A node's leaf server's configuration (``gpushare-nats-conf leaf-users``, ``gpushare-nats-leaf``):
one user per node role with that role's permissions on that node, passwords made once on the node
and kept (root-only), the node's JetStream domain, its remotes with the token of the moment; and
the ``leaf`` role the cluster grants its connection."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from gpushare_common.layout import SERVICE_ROLES, Layout, LayoutError
from gpushare_nats_auth.leaf import LeafFiles
from gpushare_nats_auth.natsconf import LEAF_ROLES, leaf_users

NODE = "gpu-7.example"


def _users(text: str) -> dict[str, tuple[str, dict[str, object]]]:
    found = re.findall(r'\{user: "([\w-]+)", password: ("[0-9a-f]+"), permissions: (\{.*\})\}', text)
    return {user: (json.loads(password), json.loads(permissions)) for user, password, permissions in found}


def test_leaf_users_are_each_roles_permissions_on_its_node_with_passwords_made_once(tmp_path: Path) -> None:
    first = _users(leaf_users(NODE, tmp_path / "users"))
    assert set(first) == set(LEAF_ROLES) == {*SERVICE_ROLES, "installer"}
    for role, (password, permissions) in first.items():
        node = NODE if role != "installer" else ""
        assert permissions == Layout().permissions(role, node).as_config(), role
        path = tmp_path / "users" / role
        assert path.read_text() == password and len(password) == 32
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "users").stat().st_mode) == 0o700
    again = _users(leaf_users(NODE, tmp_path / "users"))  # a leaf restart: connected services keep working
    assert {r: p for r, (p, _) in again.items()} == {r: p for r, (p, _) in first.items()}
    assert len({p for p, _ in first.values()}) == len(first)  # one password per role


def test_an_empty_password_file_is_refused_not_used(tmp_path: Path) -> None:
    (tmp_path / "users").mkdir()
    (tmp_path / "users" / "solver").write_text("")
    with pytest.raises(ValueError, match="solver is empty"):
        leaf_users(NODE, tmp_path / "users")


def test_the_cli_writes_the_users_root_only_and_refuses_a_bad_node(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "gpushare_nats_auth.natsconf", "leaf-users"]
    done = subprocess.run([*cli, "--node", NODE, "--dir", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE((tmp_path / "users.conf").stat().st_mode) == 0o600
    assert set(_users((tmp_path / "users.conf").read_text())) == set(LEAF_ROLES)
    bad = subprocess.run([*cli, "--node", "a_b", "--dir", str(tmp_path / "x")], capture_output=True, text=True)
    assert bad.returncode == 2 and "gpushare-nats-conf: invalid subject 'a_b'" in bad.stderr


def test_leaf_config_names_the_nodes_domain_and_carries_the_token_of_the_moment(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    files = LeafFiles(NODE, tmp_path / "state", ("nats-leaf://a:7422", "nats-leaf://b:7422"), token, tmp_path / "c")
    files.write(Layout())
    node_conf = (tmp_path / "c" / "node.conf").read_text()
    assert 'domain: "gpushare-gpu-7_example"' in node_conf and f'"{tmp_path / "state" / "data"}"' in node_conf
    assert set(_users(node_conf)) == set(LEAF_ROLES)
    remote = (tmp_path / "c" / "remote.conf").read_text()
    assert '"nats-leaf://first@a:7422", "nats-leaf://first@b:7422"' in remote
    token.write_text("second")  # the kubelet rotated it
    files.write_remote(files.token())
    assert "nats-leaf://second@a:7422" in (tmp_path / "c" / "remote.conf").read_text()
    assert stat.S_IMODE((tmp_path / "c" / "remote.conf").stat().st_mode) == 0o600  # it holds the token


def test_the_leaf_role_is_its_nodes_traffic_only() -> None:
    layout = Layout()
    leaf = layout.permissions("leaf", NODE)
    assert leaf.publish == ("gpushare.v1.gpu-7_example.>", "_INBOX.observer.>")
    assert leaf.subscribe[0] == "$JS.gpushare-gpu-7_example.API.>"
    assert all(s.startswith("$JS.") for s in leaf.subscribe)  # nothing may be sent to a node's subjects
    with pytest.raises(LayoutError, match="a node name is required"):
        layout.permissions("leaf")
    assert layout.stream_subjects(NODE) == [f"gpushare.v1.gpu-7_example.{c}" for c in
                                            ("event.*", "health.*", "capacity.*", "eviction")]  # fmt: skip
    assert layout.stream_subjects()[0] == "gpushare.v1.*.event.*"
    observer = layout.permissions("observer").publish
    assert "$JS.*.API.DIRECT.GET.GPUSHARE.>" in observer and "$JS.*.API.STREAM.INFO.KV_gpushare-solver" in observer

"""A NATS server of the local cluster binds its own ports, the leafnode listener's included (read
from its /varz: nats-server's ports file has none), and takes them back when started again."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from gpushare_common.ports import port_of
from gpushare_sim import natsd
from gpushare_sim.run.procs import wait_ports


def start(member: natsd.Member, config: Path) -> subprocess.Popen[bytes]:
    config.write_text(natsd.server_config(member))
    return subprocess.Popen([natsd.server_binary(), "-c", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(10)


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_server_reports_its_leaf_port_and_takes_every_port_back_on_a_restart(tmp_path: Path) -> None:
    (member,) = natsd.members(["n1"], tmp_path / "store", tmp_path / "ports", leaves=True)
    assert member.leaf_port == member.monitor_port == natsd.ANY_PORT
    (tmp_path / "ports").mkdir()
    proc = start(member, tmp_path / "n1.conf")
    try:
        ports = wait_ports(tmp_path / "ports", proc)
        leaf = natsd.leaf_listener(ports)
        bound = natsd.bound(member, ports, leaf)
        assert bound.leaf_port == leaf > 0 and accepts(leaf)
        assert bound.client_port == port_of(ports["nats"][0]) and bound.monitor_port == port_of(ports["monitoring"][0])
    finally:
        stop(proc)
    proc = start(bound, tmp_path / "n1.conf")  # the configuration a restart reads
    try:
        again = wait_ports(tmp_path / "ports", proc)
        assert natsd.bound(member, again, natsd.leaf_listener(again)) == bound
    finally:
        stop(proc)


def test_a_leaf_port_is_not_read_without_a_monitoring_url() -> None:
    with pytest.raises(ValueError, match="no monitoring URL"):
        natsd.leaf_listener({"nats": ["nats://127.0.0.1:4222"]})

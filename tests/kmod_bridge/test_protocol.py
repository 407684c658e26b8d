"""The Python mirror of kmod/include/gpushare_kmod.h: constants, layouts, codecs, bad input."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from gpushare_kmod_bridge import protocol
from gpushare_kmod_bridge.adapters.netlink import KmodMessage, classify
from gpushare_sim import kernel as standin
from hypothesis import given
from hypothesis import strategies as st

HEADER = Path(__file__).resolve().parents[2] / "kmod" / "include" / "gpushare_kmod.h"
C_TYPES = {"__u8": ("B", 1), "__u16": ("H", 2), "__u32": ("I", 4), "__s32": ("i", 4), "__u64": ("Q", 8)}
STRUCTS = {
    "gpushare_kmod_hdr": protocol.HDR,
    "gpushare_kmod_target": protocol.TARGET,
    "gpushare_kmod_stats_head": protocol.STATS_HEAD,
    "gpushare_kmod_stats": protocol.STATS,
    "gpushare_kmod_config": protocol.CONFIG,
    "gpushare_kmod_notice": protocol.NOTICE,
}


def c_defines() -> dict[str, int]:
    text = HEADER.read_text()
    return {m[1]: int(m[2], 0) for m in re.finditer(r"#define GPUSHARE_KMOD_(\w+)\s+(0x[0-9a-fA-F]+|\d+)", text)}


def c_struct(name: str, defines: dict[str, int]) -> tuple[str, int]:
    """The struct's fields as a little-endian struct format, and its C size (natural alignment)."""
    body = re.search(rf"struct {name} \{{(.*?)\}};", HEADER.read_text(), re.S)
    assert body, f"struct {name} not in the header"
    fmt, offset, widest = "<", 0, 1
    for ctype, _field, count in re.findall(r"(__[us]\d+)\s+(\w+)(?:\[(\w+)\])?;", body[1]):
        code, size = C_TYPES[ctype]
        n = 1 if not count else (int(count) if count.isdigit() else defines[count.removeprefix("GPUSHARE_KMOD_")])
        assert offset % size == 0, f"{name}.{_field} would need padding the header does not declare"
        fmt += (f"{n}s" if code == "B" and n > 1 else f"{n}{code}" if n > 1 else code)
        offset += size * n
        widest = max(widest, size)
    assert offset % widest == 0, f"{name} has tail padding"
    return fmt, offset


def test_every_constant_of_the_header_is_mirrored() -> None:
    defines = c_defines()
    assert len(defines) >= 20
    for name, value in defines.items():
        assert getattr(protocol, name) == value, name
        if hasattr(standin, name):
            assert getattr(standin, name) == value, f"stand-in {name}"
    for name in ("REGISTER", "ADD", "DELETE", "DETECT", "UNDETECT", "RELEASE", "STATS", "CONFIG", "NOTICE",
                 "HOLD"):
        assert getattr(standin, name) == defines[f"CMD_{name}"]
    assert {k.lower(): defines[f"CMD_{k.upper()}"] for k in protocol.COMMANDS} == protocol.COMMANDS


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_struct_layouts_match_the_header(name: str) -> None:
    fmt, size = c_struct(name, c_defines())
    assert STRUCTS[name].format == fmt.replace("<1", "<")
    assert STRUCTS[name].size == size
    stated = re.search(rf"(\d+) bytes\. \*/\nstruct {name} ", HEADER.read_text())
    if stated:
        assert int(stated[1]) == size


def test_stand_in_and_pyroute2_message_use_the_same_layouts() -> None:
    assert standin.HDR.format == protocol.HDR.format
    assert standin.TARGET.format == protocol.TARGET.format
    assert standin.STATS_HEAD.format == protocol.STATS_HEAD.format
    assert standin.RECORD.format == protocol.STATS.format
    assert standin.CONFIG_ITEM.format == protocol.CONFIG.format
    assert standin.NOTICE_ITEM.format == protocol.NOTICE.format
    assert "<" + "".join(code for _, code in KmodMessage.fields) == protocol.HDR.format


ids_strategy = st.lists(st.integers(1, protocol.ID_LIMIT), max_size=40)


@given(st.sampled_from([3, 5, 6, 7, 10]), st.integers(0, 2**32 - 1), ids_strategy)
def test_command_round_trip(cmd: int, seq: int, ids: list[int]) -> None:
    data = protocol.encode_command(cmd, seq, ids)
    (frame,) = protocol.split_frames(data)
    assert frame.nl_type == protocol.MSG_CMD and frame.nl_seq == seq
    header, items = protocol.decode_header(frame)
    assert (header.cmd, header.seq, header.count) == (cmd, seq, len(ids))
    assert [v for (v,) in struct.iter_unpack("<Q", items)] == ids
    assert standin.check(frame.nl_type, frame.payload) == 0
    message = KmodMessage(data)
    message.decode()
    assert (message["cmd"], message["seq"], message["count"]) == (cmd, seq, len(ids))


targets_strategy = st.lists(st.builds(protocol.Target, st.integers(1, protocol.ID_LIMIT),
                                      st.integers(1, protocol.PID_LIMIT)), max_size=40)


@given(st.sampled_from([protocol.CMD_ADD, protocol.CMD_DETECT]), st.integers(0, 2**32 - 1), targets_strategy)
def test_target_command_round_trip(cmd: int, seq: int, targets: list[protocol.Target]) -> None:
    (frame,) = protocol.split_frames(protocol.encode_command(cmd, seq, targets=targets))
    header, items = protocol.decode_header(frame)
    assert (header.cmd, header.count) == (cmd, len(targets))
    assert [protocol.Target(p, pid) for p, pid, pad in protocol.TARGET.iter_unpack(items)] == targets
    assert all(pad == 0 for _, _, pad in protocol.TARGET.iter_unpack(items))
    assert standin.check(frame.nl_type, frame.payload) == 0


@given(st.lists(st.integers(-4095, 0), max_size=30), st.integers(0, 2**32 - 1))
def test_target_statuses_round_trip(statuses: list[int], seq: int) -> None:
    status = next((s for s in statuses if s < 0), 0)
    reply = protocol.Reply(protocol.Header(protocol.CMD_DETECT, seq, status, len(statuses)),
                           statuses=tuple(statuses))
    (frame,) = protocol.split_frames(protocol.encode_reply(reply))
    assert protocol.decode_reply(frame) == reply


def test_targets_are_checked_before_sending() -> None:
    with pytest.raises(protocol.ProtocolError, match="pid 0 of pid namespace 5"):
        protocol.encode_command(protocol.CMD_ADD, 1, targets=[protocol.Target(5, 0)])
    with pytest.raises(protocol.ProtocolError, match="not bare ids"):
        protocol.encode_command(protocol.CMD_DETECT, 1, [5])
    with pytest.raises(protocol.ProtocolError, match="outside"):
        protocol.encode_command(protocol.CMD_ADD, 1, targets=[protocol.Target(0, 1)])


@given(st.integers(1, protocol.ID_LIMIT), st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1),
       st.integers(0, 2**32 - 1), st.integers(1, 2**32 - 1), st.integers(0, 1))
def test_notice_round_trip(pidns: int, ts: int, pid: int, cmd: int, seq: int, flags: int) -> None:
    notice = protocol.Notice(pidns, ts, pid, pid, cmd, seq, flags)
    (frame,) = protocol.split_frames(protocol.encode_notice(notice))
    decoded = protocol.decode_notice(frame)
    assert decoded == notice and decoded.resent == bool(flags)


u64 = st.integers(0, 2**64 - 1)
records = st.builds(protocol.StatsRecord, st.integers(1, protocol.ID_LIMIT), u64, u64, u64, u64, u64, u64, u64,
                    st.integers(0, 2**32 - 1), st.integers(0, 7))


@given(st.lists(records, max_size=20), st.integers(0, 2**32 - 1),
       st.sampled_from([protocol.CMD_STATS, protocol.CMD_HOLD]), st.integers(0, 20))
def test_stats_reply_round_trip(stats: list[protocol.StatsRecord], seq: int, cmd: int, status: int) -> None:
    head = protocol.StatsHead(1, 2, 3, len(stats), 4096, 7, 3000, 30000)
    reply = protocol.Reply(protocol.Header(cmd, seq, status, len(stats)), head, tuple(stats))
    (frame,) = protocol.split_frames(protocol.encode_reply(reply))
    assert protocol.decode_reply(frame) == reply


@given(st.lists(st.integers(0, 255), max_size=16), st.lists(st.integers(0, 4095), max_size=16))
def test_config_round_trip(types: list[int], majors: list[int]) -> None:
    config = protocol.FilterConfig(tuple(types), tuple(majors))
    assert protocol.decode_config(protocol.encode_config(config)) == config


def test_several_messages_in_one_datagram() -> None:
    data = protocol.encode_command(7, 1, [5]) + protocol.encode_command(3, 2, [6, 7])
    assert [f.nl_seq for f in protocol.split_frames(data)] == [1, 2]


@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_protocol_errors(data: bytes) -> None:
    try:
        for frame in protocol.split_frames(data):
            for decode in (protocol.decode_notice, protocol.decode_reply, protocol.decode_error):
                try:
                    decode(frame)
                except protocol.ProtocolError:
                    pass
    except protocol.ProtocolError as err:
        assert err.reason


@pytest.mark.parametrize(("data", "reason"), [
    (b"\x01\x02", "trailing bytes"),
    (struct.pack("<IHHII", 8, 0x11, 0, 0, 0), "nlmsg_len 8"),
    (struct.pack("<IHHII", 64, 0x11, 0, 0, 0), "does not fit"),
])
def test_broken_framing_is_named(data: bytes, reason: str) -> None:
    with pytest.raises(protocol.ProtocolError, match=reason):
        list(protocol.split_frames(data))


def test_bad_payloads_are_named() -> None:
    wrong_version = protocol.encode_frame(0x12, 1, protocol.Header(9, 1, count=1, version=1), bytes(32))
    short_notice = protocol.encode_frame(0x12, 1, protocol.Header(9, 1, count=1), bytes(8))
    (frame,) = protocol.split_frames(wrong_version)
    with pytest.raises(protocol.ProtocolError, match="version 1"):
        protocol.decode_notice(frame)
    (frame,) = protocol.split_frames(short_notice)
    with pytest.raises(protocol.ProtocolError, match="8 item bytes"):
        protocol.decode_notice(frame)


@pytest.mark.parametrize("ids", [[0], [protocol.ID_LIMIT + 1], list(range(1, protocol.MAX_IDS + 2))])
def test_invalid_ids_are_refused_before_sending(ids: list[int]) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.encode_command(protocol.CMD_DELETE, 1, ids)


def test_filter_config_limits() -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.FilterConfig(tuple(range(17)))
    with pytest.raises(protocol.ProtocolError):
        protocol.FilterConfig((0x46,), (4096,))


def test_pyroute2_classifies_kernel_errors() -> None:
    error = struct.pack("<IHHIIi", 20, protocol.NLMSG_ERROR, 0, 0, 0, -111)
    assert classify(error) == (protocol.NLMSG_ERROR, 111)
    assert classify(protocol.encode_command(3, 1, [3]))[0] == protocol.MSG_CMD

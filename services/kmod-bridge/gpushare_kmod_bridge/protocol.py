"""The kernel module's netlink protocol, mirrored from ``kmod/include/gpushare_kmod.h``.

Every message is one netlink message: ``struct nlmsghdr`` (16 bytes), then
``struct gpushare_kmod_hdr`` (16 bytes), then ``hdr.count`` items whose type
depends on the message type and command. Little endian, fixed sizes, explicit
padding (the header's promise), so :mod:`struct` formats with ``<`` describe
each structure exactly; ``tests/kmod_bridge/test_protocol.py`` parses the C
header and checks every constant and size here against it.

Decoding never raises anything but :class:`ProtocolError`, which names what
was wrong; callers count and skip such messages.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

VERSION = 2
NETLINK_UNIT = 31
MAX_IDS = 1024
MAX_TYPES = 16
MAX_MAJORS = 16
MAJOR_LIMIT = 4096
MAX_PARAM_MS = 600000

MSG_CMD = 0x10
MSG_REPLY = 0x11
MSG_NOTICE = 0x12
NLMSG_ERROR = 0x2  # the kernel's own error/ack message (struct nlmsgerr)

CMD_REGISTER = 1
CMD_ADD = 2
CMD_DELETE = 3
CMD_DETECT = 4
CMD_UNDETECT = 5
CMD_RELEASE = 6
CMD_STATS = 7
CMD_CONFIG = 8
CMD_NOTICE = 9
CMD_HOLD = 10

F_WATCHED = 0x1
F_NEED_NOTICE = 0x2
F_RECLAIMING = 0x4

NOTICE_F_RESENT = 0x1

NLM_F_REQUEST = 0x1
ID_LIMIT = 0xFFFFFFFF  # a pid-namespace id is in [1, U32_MAX]
PID_LIMIT = 0xFFFFFFFF  # a target's pid is in [1, U32_MAX]

NLMSGHDR = struct.Struct("<IHHII")  # len, type, flags, seq, pid
HDR = struct.Struct("<HHIiI")  # version, cmd, seq, status, count
TARGET = struct.Struct("<QII")  # pidns, pid, pad
STATS_HEAD = struct.Struct("<QQQIIIIII")
STATS = struct.Struct("<QQQQQQQQII")
CONFIG = struct.Struct(f"<II{MAX_TYPES}s{MAX_MAJORS}I")
NOTICE = struct.Struct("<QQIIII")
ID = struct.Struct("<Q")
STATUS = struct.Struct("<i")
TARGET_COMMANDS = frozenset({CMD_ADD, CMD_DETECT})  # items are targets, replies list statuses
STATS_REPLIES = frozenset({CMD_STATS, CMD_HOLD})  # replies carry the stats head and records

COMMANDS: dict[str, int] = {
    "register": CMD_REGISTER,
    "add": CMD_ADD,
    "delete": CMD_DELETE,
    "detect": CMD_DETECT,
    "undetect": CMD_UNDETECT,
    "release": CMD_RELEASE,
    "stats": CMD_STATS,
    "config": CMD_CONFIG,
    "hold": CMD_HOLD,
}
COMMAND_NAMES: dict[int, str] = {v: k for k, v in COMMANDS.items()} | {CMD_NOTICE: "notice"}


class ProtocolError(ValueError):
    """Bytes that are not a well-formed gpushare netlink message."""

    def __init__(self, reason: str, data: bytes = b"") -> None:
        self.reason = reason
        self.data = data[:64]
        super().__init__(f"malformed kernel message: {reason}")


@dataclass(frozen=True, slots=True)
class Header:
    cmd: int
    seq: int
    status: int = 0
    count: int = 0
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class Target:
    """An ADD/DETECT item: a pid namespace and the host pid of a process living in it."""

    pidns: int
    pid: int


@dataclass(frozen=True, slots=True)
class Notice:
    pidns: int
    ts_ns: int  # the hit: the same in a notice sent again on REGISTER
    pid: int
    tid: int
    ioctl_cmd: int
    seq: int = 0
    flags: int = 0  # NOTICE_F_*

    @property
    def resent(self) -> bool:
        return bool(self.flags & NOTICE_F_RESENT)


@dataclass(frozen=True, slots=True)
class StatsHead:
    now_ns: int
    notices_sent: int
    notices_dropped: int
    entries: int
    max_entries: int
    receiver_portid: int
    timeout_ms: int
    max_hold_ms: int = 0


@dataclass(frozen=True, slots=True)
class StatsRecord:
    pidns: int
    last_access_ns: int = 0
    hits: int = 0
    notices: int = 0
    releases: int = 0
    timeouts: int = 0
    holds: int = 0
    deadline_ns: int = 0  # when the reclaim in progress ends; 0 when none
    blocked: int = 0
    flags: int = 0


@dataclass(frozen=True, slots=True)
class FilterConfig:
    types: tuple[int, ...] = (0x46,)
    majors: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.types) > MAX_TYPES or not all(0 <= t <= 0xFF for t in self.types):
            raise ProtocolError(f"ioctl types must be at most {MAX_TYPES} bytes")
        if len(self.majors) > MAX_MAJORS or not all(0 <= m < MAJOR_LIMIT for m in self.majors):
            raise ProtocolError(f"majors must be at most {MAX_MAJORS} values below {MAJOR_LIMIT}")


@dataclass(frozen=True, slots=True)
class Reply:
    header: Header
    stats_head: StatsHead | None = None
    stats: tuple[StatsRecord, ...] = ()
    config: FilterConfig | None = None
    statuses: tuple[int, ...] = ()  # ADD, DETECT: one per target, 0 or a negative errno


@dataclass(frozen=True, slots=True)
class Frame:
    """One netlink message: its type and sequence, and the payload after nlmsghdr."""

    nl_type: int
    nl_seq: int
    payload: bytes


def align(length: int) -> int:
    return (length + 3) & ~3


def check_ids(ids: Sequence[int]) -> None:
    if len(ids) > MAX_IDS:
        raise ProtocolError(f"{len(ids)} ids in one message, at most {MAX_IDS}")
    for pidns in ids:
        if not 0 < pidns <= ID_LIMIT:
            raise ProtocolError(f"pid-namespace id {pidns} outside [1, {ID_LIMIT}]")


def check_targets(targets: Sequence[Target]) -> None:
    check_ids([t.pidns for t in targets])
    for target in targets:
        if not 0 < target.pid <= PID_LIMIT:
            raise ProtocolError(f"pid {target.pid} of pid namespace {target.pidns} outside [1, {PID_LIMIT}]")


def encode_frame(nl_type: int, nl_seq: int, header: Header, items: bytes = b"") -> bytes:
    body = HDR.pack(header.version, header.cmd, header.seq, header.status, header.count) + items
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), nl_type, NLM_F_REQUEST, nl_seq, 0) + body


def encode_command(cmd: int, seq: int, ids: Sequence[int] = (), config: FilterConfig | None = None,
                   targets: Sequence[Target] = ()) -> bytes:
    """A command message: ``targets`` for ADD/DETECT, ``config`` for CONFIG, else ``ids``."""
    if cmd == CMD_CONFIG:
        items = b"" if config is None else encode_config(config)
        return encode_frame(MSG_CMD, seq, Header(cmd, seq, count=int(config is not None)), items)
    if cmd in TARGET_COMMANDS:
        if ids:
            raise ProtocolError(f"{COMMAND_NAMES[cmd]} names targets (pid namespace and pid), not bare ids")
        check_targets(targets)
        items = b"".join(TARGET.pack(t.pidns, t.pid, 0) for t in targets)
        return encode_frame(MSG_CMD, seq, Header(cmd, seq, count=len(targets)), items)
    check_ids(ids)
    items = b"".join(ID.pack(i) for i in ids)
    return encode_frame(MSG_CMD, seq, Header(cmd, seq, count=len(ids)), items)


def encode_config(config: FilterConfig) -> bytes:
    majors = list(config.majors) + [0] * (MAX_MAJORS - len(config.majors))
    return CONFIG.pack(len(config.types), len(config.majors), bytes(config.types), *majors)


def decode_config(data: bytes) -> FilterConfig:
    ntypes, nmajors, types, *majors = CONFIG.unpack(data)
    if ntypes > MAX_TYPES or nmajors > MAX_MAJORS:
        raise ProtocolError(f"config counts {ntypes}/{nmajors} out of range", data)
    return FilterConfig(tuple(types[:ntypes]), tuple(majors[:nmajors]))


def split_frames(data: bytes) -> Iterator[Frame]:
    """The netlink messages of one datagram (or stream chunk), in order."""
    offset = 0
    while offset < len(data):
        if len(data) - offset < NLMSGHDR.size:
            raise ProtocolError(f"{len(data) - offset} trailing bytes, shorter than nlmsghdr", data)
        length, nl_type, _flags, nl_seq, _pid = NLMSGHDR.unpack_from(data, offset)
        if length < NLMSGHDR.size or offset + length > len(data):
            raise ProtocolError(f"nlmsg_len {length} does not fit in {len(data) - offset} bytes", data)
        yield Frame(nl_type, nl_seq, data[offset + NLMSGHDR.size : offset + length])
        offset += align(length)


def decode_header(frame: Frame) -> tuple[Header, bytes]:
    if len(frame.payload) < HDR.size:
        raise ProtocolError(f"payload of {len(frame.payload)} bytes has no kmod header", frame.payload)
    version, cmd, seq, status, count = HDR.unpack_from(frame.payload)
    if version != VERSION:
        raise ProtocolError(f"protocol version {version}, expected {VERSION}", frame.payload)
    return Header(cmd, seq, status, count, version), frame.payload[HDR.size :]


def _expect(items: bytes, size: int, what: str) -> None:
    if len(items) != size:
        raise ProtocolError(f"{what}: {len(items)} item bytes, expected {size}", items)


def decode_notice(frame: Frame) -> Notice:
    header, items = decode_header(frame)
    if header.cmd != CMD_NOTICE or header.count != 1:
        raise ProtocolError(f"notice with cmd {header.cmd} and count {header.count}", frame.payload)
    _expect(items, NOTICE.size, "notice")
    pidns, ts_ns, pid, tid, ioctl_cmd, flags = NOTICE.unpack(items)
    return Notice(pidns, ts_ns, pid, tid, ioctl_cmd, header.seq, flags)


def decode_reply(frame: Frame) -> Reply:
    header, items = decode_header(frame)
    if header.cmd in STATS_REPLIES and header.status >= 0:
        _expect(items, STATS_HEAD.size + header.count * STATS.size, "stats reply")
        head = StatsHead(*STATS_HEAD.unpack_from(items)[:-1])
        records = tuple(StatsRecord(*STATS.unpack_from(items, STATS_HEAD.size + i * STATS.size))
                        for i in range(header.count))
        return Reply(header, head, records)
    if header.cmd == CMD_CONFIG and header.count == 1:
        _expect(items, CONFIG.size, "config reply")
        return Reply(header, config=decode_config(items))
    if header.cmd in TARGET_COMMANDS:
        _expect(items, header.count * STATUS.size, "target statuses")
        return Reply(header, statuses=tuple(s for (s,) in STATUS.iter_unpack(items)))
    _expect(items, header.count * ID.size, "reply")
    return Reply(header)


def decode_error(frame: Frame) -> int:
    """The errno (negative) of an NLMSG_ERROR message."""
    if len(frame.payload) < 4:
        raise ProtocolError("NLMSG_ERROR without an error code", frame.payload)
    return int(struct.unpack_from("<i", frame.payload)[0])


def encode_notice(notice: Notice) -> bytes:
    items = NOTICE.pack(notice.pidns, notice.ts_ns, notice.pid, notice.tid, notice.ioctl_cmd, notice.flags)
    return encode_frame(MSG_NOTICE, notice.seq, Header(CMD_NOTICE, notice.seq, count=1), items)


def encode_reply(reply: Reply, nl_seq: int = 0) -> bytes:
    """A kernel reply (the module's side; tests and the stand-in's checks use it)."""
    items = b""
    if reply.stats_head is not None:
        head = reply.stats_head
        items = STATS_HEAD.pack(head.now_ns, head.notices_sent, head.notices_dropped, head.entries,
                                head.max_entries, head.receiver_portid, head.timeout_ms, head.max_hold_ms, 0)
        items += b"".join(STATS.pack(r.pidns, r.last_access_ns, r.hits, r.notices, r.releases,
                                     r.timeouts, r.holds, r.deadline_ns, r.blocked, r.flags)
                          for r in reply.stats)
    elif reply.config is not None:
        items = encode_config(reply.config)
    elif reply.statuses:
        items = b"".join(STATUS.pack(s) for s in reply.statuses)
    return encode_frame(MSG_REPLY, nl_seq or reply.header.seq, reply.header, items)

"""The fleet emulator's NATS protocol parser: any split of the server's bytes gives the same messages."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench.fleet.wire import Link, Message

TOKEN = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_$", min_size=1, max_size=12)
SUBJECT = st.lists(TOKEN, min_size=1, max_size=5).map(".".join)
PAYLOAD = st.binary(max_size=300)
HEADERS = st.one_of(st.just(b""), st.sampled_from([b"NATS/1.0\r\n\r\n", b"NATS/1.0 408 Request Timeout\r\n\r\n",
                                                   b"NATS/1.0\r\nNats-Msg-Id: abc\r\n\r\n"]))
MESSAGES = st.lists(st.tuples(SUBJECT, st.one_of(st.just(""), SUBJECT), HEADERS, PAYLOAD), max_size=8)


def encode(subject: str, reply: str, headers: bytes, payload: bytes) -> bytes:
    head = f"{subject} 1" + (f" {reply}" if reply else "")
    if headers:
        return f"HMSG {head} {len(headers)} {len(headers) + len(payload)}\r\n".encode() + headers + payload + b"\r\n"
    return f"MSG {head} {len(payload)}\r\n".encode() + payload + b"\r\n"


def link(found: list[Message]) -> Link:
    return Link([("127.0.0.1", 1)], 0, "test", lambda _link, msg: found.append(msg), lambda _link: None)


@given(MESSAGES, st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=40))
def test_any_split_of_the_stream_gives_the_same_messages(messages: list[tuple[str, str, bytes, bytes]],
                                                         cuts: list[int]) -> None:  # fmt: skip
    stream = b"INFO {}\r\nPING\r\n" + b"".join(encode(*m) for m in messages) + b"PONG\r\n+OK\r\n"
    found: list[Message] = []
    receiver = link(found)
    position, index = 0, 0
    while position < len(stream):
        size = cuts[index % len(cuts)]
        receiver.data_received(stream[position:position + size])
        position, index = position + size, index + 1
    expected = [Message(s.encode(), r.encode(), h, p) for s, r, h, p in messages]
    assert found == expected
    assert receiver.stats.dropped == 1  # the PONG answer to PING, written while not connected


def test_status_and_headers_are_read_from_the_header_block() -> None:
    found: list[Message] = []
    link(found).data_received(encode("_INBOX.x.f1", "", b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 1"
                                     b"\r\n\r\n", b""))  # fmt: skip
    link(found).data_received(encode("a.b", "$JS.ACK.x", b"NATS/1.0\r\nNats-Msg-Id: id-1\r\n\r\n", b"{}"))
    assert [m.status for m in found] == [408, 0]
    assert found[1].header(b"nats-msg-id") == b"id-1"
    assert found[0].header(b"Nats-Msg-Id") == b""


def test_a_server_error_is_counted_with_its_text() -> None:
    receiver = link([])
    receiver.data_received(b"-ERR 'Permissions Violation for Publish to \"x\"'\r\n")
    assert receiver.stats.errors == 1
    assert receiver.stats.last_error == 'Permissions Violation for Publish to "x"'

"""``gpushare-events``: watch, replay and re-publish gpushare events for debugging.

  gpushare-events tail   [--node N] [--type T] [--pod P] [--json]
  gpushare-events replay [--since 10m|ISO] [--until ...] [--from-seq N] [--json]
                         [--republish-to PREFIX] [filters]

``replay`` reads a window of the ``GPUSHARE`` stream (an ordered, short-lived
consumer under the observer's own name, ``observer-<instance>``, the one it may
make: nothing is acknowledged or changed) and prints one line per event,
or feeds the window back under a sandbox prefix (``--republish-to``) so a
service started with that prefix can be debugged against real traffic. Each
node's stream lives on its leaf server: with ``--node`` the stream read is that
node's (its JetStream domain, reached through the cluster, ``--domain`` to name
another), without it the stream of the server connected to. ``tail`` follows
the subjects themselves, which reach the cluster from every node's leaf.
Connection settings come from the usual ``GPUSHARE_NATS_*`` variables or flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import NotFoundError

from ..events import AnyEvent, EventDecodeError, decode, event_tag, pod_of
from ..retry import Stopped
from ..settings import NATS_PREFIX, NatsSettings, load
from ..subjects import DEFAULT_PREFIX, SubjectError, Subjects
from . import Bus, BusError
from .errors import failing

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])\Z")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SKIP = {"node", "id", "ts", "type"}
INSTANCE = "GPUSHARE_CONSOLE_INSTANCE"  # set in the console's pod: its name, which the callout grants


class UsageError(ValueError):
    pass


def parse_time(text: str, now: dt.datetime | None = None) -> dt.datetime:
    """``10m`` (ago), ``2h``, or an ISO-8601 time (UTC when no zone)."""
    now = now or dt.datetime.now(dt.UTC)
    match = _DURATION.match(text.strip())
    if match:
        return now - dt.timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    try:
        parsed = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"bad time {text!r}: use a duration like 10m or an ISO time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


@dataclass(frozen=True, slots=True)
class Filter:
    node: str = ""
    kind: str = ""
    pod: str = ""

    def matches(self, event: AnyEvent) -> bool:
        if self.node and event.node != self.node:
            return False
        if self.kind and event_tag(event) != self.kind:
            return False
        return not self.pod or self.pod in pod_of(event)


def describe(event: AnyEvent, seq: int | None = None) -> str:
    """One readable line per event."""
    stamp = dt.datetime.fromtimestamp(event.ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    fields = []
    for name in event.__struct_fields__:
        value = getattr(event, name)
        if name in _SKIP or value in ("", (), {}, None, 0, 0.0, False):
            continue
        if isinstance(value, tuple):
            value = ",".join(str(v) for v in value)
        fields.append(f"{name}={value}")
    head = f"{stamp} " + (f"seq={seq} " if seq is not None else "")
    return f"{head}{event.node} {event_tag(event)} " + " ".join(fields)


class Printer:
    def __init__(self, as_json: bool, out=sys.stdout) -> None:  # type: ignore[no-untyped-def]
        self.as_json = as_json
        self.out = out
        self.count = 0

    def show(self, msg: Msg, event: AnyEvent, seq: int | None) -> None:
        line = msg.data.decode() if self.as_json else describe(event, seq)
        self.out.write(line + "\n")
        self.out.flush()
        self.count += 1


def _decode(msg: Msg) -> AnyEvent | None:
    try:
        return decode(msg.data)
    except EventDecodeError as err:
        print(f"skipped undecodable message on {msg.subject}: {err.reason}", file=sys.stderr)
        return None


async def tail(bus: Bus, wanted: Filter, printer: Printer, stop: asyncio.Event) -> None:
    subject = bus.subjects.node_all(wanted.node) if wanted.node else bus.subjects.all()

    async def on_message(msg: Msg) -> None:
        event = _decode(msg)
        if event is not None and wanted.matches(event):
            printer.show(msg, event, None)

    await bus.client.subscribe(subject, cb=on_message)
    await stop.wait()


def _consumer_config(since: dt.datetime | None, from_seq: int) -> api.ConsumerConfig:
    if from_seq:
        return api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                                  opt_start_seq=from_seq)
    if since is not None:
        return api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_TIME,
                                  opt_start_time=since)
    return api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL)


async def replay(
    bus: Bus, wanted: Filter, printer: Printer, since: dt.datetime | None, until: dt.datetime | None,
    from_seq: int = 0, republish_to: str = "", domain: str = "",
) -> int:
    """Print (or re-publish) a window of the stream (of JetStream domain ``domain``: a node's leaf
    server); returns how many events matched."""
    last = await bus.last_seq(domain)
    if last == 0 or (from_seq and from_seq > last):
        return 0
    sandbox = Subjects(republish_to) if republish_to else None
    done = asyncio.Event()
    matched = 0

    async def on_message(msg: Msg) -> None:
        nonlocal matched
        meta = msg.metadata
        seq = int(meta.sequence.stream)
        stamp = meta.timestamp
        if until is not None and stamp is not None and stamp > until:
            done.set()
            return
        event = _decode(msg)
        if event is not None and wanted.matches(event):
            matched += 1
            if sandbox is not None:
                await bus.client.publish(bus.subjects.rebase(msg.subject, sandbox), msg.data)
            else:
                printer.show(msg, event, seq)
        if seq >= last or meta.num_pending == 0:
            done.set()

    js, stream = bus.client.jetstream(domain=domain or None), bus.settings.stream
    config = _consumer_config(since, from_seq)
    config.name = bus.layout.observer_consumer(bus.node)  # the one name this observer may create
    with failing(f"replay {stream}"):
        with contextlib.suppress(NotFoundError):  # left by a replay that died: made fresh
            await js._jsm.delete_consumer(stream, config.name)
        # the stream named: no lookup by subject ($JS.API.STREAM.NAMES, which the observer may not ask)
        sub = await js.subscribe(bus.subjects.all(), stream=stream, ordered_consumer=True, config=config,
                                 cb=on_message)  # fmt: skip
    try:
        await asyncio.wait_for(done.wait(), timeout=30)
    except TimeoutError:
        print("replay: nothing more arrived within 30 s, stopping", file=sys.stderr)
    await sub.unsubscribe()
    if sandbox is not None:
        await bus.flush()
    return matched


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpushare-events", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="NATS URL (default: GPUSHARE_NATS_URL)")
    parser.add_argument("--prefix", help=f"subject prefix (default: {DEFAULT_PREFIX})")
    parser.add_argument("--stream", help="JetStream stream (default: GPUSHARE)")
    parser.add_argument("--instance", default="", help="the observer's instance, which names the consumer a "
                        "replay reads through (default: $GPUSHARE_CONSOLE_INSTANCE, else console; in the "
                        "console's pod, with its token, the pod's name)")
    parser.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                        help="give up reaching NATS after S seconds (default: 10)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("tail", "replay"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--node", default="")
        cmd.add_argument("--type", dest="kind", default="", help="event type, e.g. ownerback")
        cmd.add_argument("--pod", default="", help="substring of the pod key")
        cmd.add_argument("--json", action="store_true", help="print raw JSON payloads")
        if name == "replay":
            cmd.add_argument("--since", help="start: duration ago (10m) or ISO time")
            cmd.add_argument("--until", help="end: duration ago or ISO time")
            cmd.add_argument("--from-seq", type=int, default=0, help="start at this stream sequence")
            cmd.add_argument("--republish-to", default="", help="re-publish under this subject prefix")
            cmd.add_argument("--domain", default=None,
                             help="JetStream domain of the stream (default: the --node's leaf server; "
                                  "without --node, or with --domain '', the server connected to)")
    return parser


def settings_from(args: argparse.Namespace) -> NatsSettings:
    settings = load(NatsSettings, NATS_PREFIX)
    overrides = {k: v for k, v in (("url", args.url), ("prefix", args.prefix),
                                   ("stream", args.stream)) if v}
    return replace(settings, name="gpushare-events", **overrides)


async def run(args: argparse.Namespace, stop: asyncio.Event) -> int:
    since = parse_time(args.since) if getattr(args, "since", None) else None
    until = parse_time(args.until) if getattr(args, "until", None) else None
    if getattr(args, "republish_to", ""):
        Subjects(args.republish_to)
    bus = Bus(settings_from(args), "observer", node=args.instance)
    failure = await _connect(bus, args.connect_timeout)
    if failure:
        print(f"error: {failure}", file=sys.stderr)
        await bus.drain()
        return 2
    wanted = Filter(args.node, args.kind, args.pod)
    printer = Printer(args.json)
    try:
        if args.command == "tail":
            await tail(bus, wanted, printer, stop)
        else:
            domain = args.domain if args.domain is not None else \
                bus.layout.node_domain(args.node) if args.node else ""
            count = await replay(bus, wanted, printer, since, until, args.from_seq, args.republish_to, domain)
            print(f"{count} events", file=sys.stderr)
    except BusError as err:
        print(f"error: {explain(bus, err, getattr(args, 'domain', None) or '')}", file=sys.stderr)
        return 1
    finally:
        await bus.drain()
    return 0


def credentials(settings: NatsSettings) -> str:
    """Which credentials a connection presents, without their secret."""
    if settings.creds_file:
        return f"credentials file {settings.creds_file}"
    if settings.user:
        return f"user {settings.user}"
    if settings.token_file:
        return f"token file {settings.token_file}"
    if settings.token:
        return "a token"
    return "no credentials"


_OBSERVER = ("use the observer's: GPUSHARE_NATS_TOKEN_FILE with the console's service-account token in a "
             "cluster, GPUSHARE_NATS_USER=observer and OBSERVER_PASSWORD from compose/.env on compose")


async def _connect(bus: Bus, within_s: float = 10.0) -> str:
    """Connect; "" when connected, else one line saying why not: unreachable, or the server
    refused the credentials (a connect would retry both for ever)."""
    stop = asyncio.Event()
    connecting = asyncio.ensure_future(bus.connect(stop))
    refused = asyncio.ensure_future(bus.credentials_refused.wait())
    await asyncio.wait({connecting, refused}, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    refused.cancel()
    if connecting.done() and connecting.exception() is None:
        return ""
    stop.set()
    connecting.cancel()
    with contextlib.suppress(asyncio.CancelledError, BusError, Stopped):
        await connecting
    url = bus.settings.url
    if bus.refused:
        return f"NATS at {url} refused the connection with {credentials(bus.settings)} ({bus.refused}): {_OBSERVER}"
    return f"cannot reach NATS at {url} within {within_s:g} s; set --url or GPUSHARE_NATS_URL"


def explain(bus: Bus, err: BusError, domain: str) -> str:
    """One line for a failure after the connect: no such stream, a permission refused, or else."""
    where = f"JetStream domain {domain}" if domain else f"the server at {bus.settings.url}"
    text = err.reason.lower()
    if "stream not found" in text:
        return (f"no stream {bus.settings.stream} on {where} (each node's events are on its leaf server: "
                "give --node, or --stream if it is named otherwise)")
    refused = bus.denied()
    if refused:
        return (f"{err.op}: NATS refused {', '.join(refused)} to the connection with {credentials(bus.settings)}; "
                f"{_OBSERVER}")
    return f"{err} (each node's events are on its leaf server: give --node, or connect to it)"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.instance = args.instance or os.environ.get(INSTANCE, "")
    logging.basicConfig(level=logging.CRITICAL)  # its errors are said in one line each, below
    try:
        stop = asyncio.Event()
        return asyncio.run(run(args, stop))
    except (UsageError, SubjectError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())

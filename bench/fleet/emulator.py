"""One emulated GPU node: the NATS side of its four services, each on a connection of its own.

- detector: on start, reads the stream and its bucket, publishes every fact
  (JetStream, ``Nats-Msg-Id`` = the fact's stable id), saves them in its bucket,
  publishes vcpu/vmem and sends the kmod-bridge its watch set; then on its
  periods (:mod:`bench.fleet.model`) republishes every fact (the stream drops
  the duplicates of its window), publishes capacity, asks the bridge for
  statistics, and on a pod change publishes the new fact and saves it.
- solver: creates its durable consumer (3 replicas, from the stream), then
  fetches one message at a time with a 0.5 s expiry, as ``Bus.consume`` does;
  per delivered event it does what ``Solver.on_event`` persists: an id already
  seen is only acknowledged (an inventory is always applied); a new one writes
  the journal, and for a pod's fact the mapping, the plan (put, then delete)
  and the desired health (bucket and core subject). Unlike the real solver it
  does not wait for the writes' acknowledgements before it acks and fetches
  again: the servers do the same work, a little sooner.
- device plugin: its three subscriptions and, on its period, one direct get
  per plugin from the health bucket.
- kmod-bridge: answers the detector's requests and writes its watch entries.

Every request's answer comes back to the role's own inbox and is counted;
errors (status 503, JSON errors) are counted by kind. The solver's fetch loop
has a watchdog (a fetch still unanswered a second after its expiry is sent again), like
nats-py's client-side fetch timeout.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from gpushare_common.events import KmodOp
from gpushare_common.layout import DETECTOR, HEALTH, KMOD, SOLVER, Layout

from bench.fleet.model import CONNECTIONS, NodeScript, Profile
from bench.fleet.wire import Link, Message

ACK = b"+ACK"
SEEN = 2048  # SolverSettings.seen_events
DURABLE_RETRY_S = 5.0  # nats-py's request timeout


@dataclass
class Tally:
    """What a worker's nodes did (summed over its nodes)."""

    sent: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    ready: int = 0  # nodes whose durable consumer exists
    refused: int = 0  # nodes whose consumer's creation was refused (they keep asking)


class FleetNode:
    def __init__(self, index: int, layout: Layout, profile: Profile, servers: list[tuple[str, int]],
                 tally: Tally) -> None:  # fmt: skip
        self.node = f"fleet-{index:05d}"
        self.script = NodeScript(self.node, layout, profile)
        self.layout, self.tally = layout, tally
        self.running = True
        self.consumer_ready = False
        self.pull_sent = 0.0  # monotonic time of the outstanding fetch; 0: none
        self.fetch = 0  # number of the outstanding fetch
        self.durable_sent = 0.0  # when the consumer's creation was last asked for
        self.refused = False  # the last answer to it was a refusal
        # as nats-py asks: one message, expiring 0.1 ms before the client gives up on it
        self.pull_request = b'{"batch":1,"expires":%d}' % (int(profile.fetch_expires_s * 1e9) - 100_000)
        self.seen: OrderedDict[bytes, None] = OrderedDict()
        self.journal_ids: list[str] = []
        self.started: set[str] = set()
        self.pidns = 4026532000 + index * 16
        handlers = {"detector": self._detector, "solver": self._solver, "deviceplugin": self._detector,
                    "kmod-bridge": self._bridge}  # fmt: skip
        self.links = {role: Link(servers, index * len(CONNECTIONS) + i, f"{role}@{self.node}", handlers[role],
                                 self._ready) for i, role in enumerate(CONNECTIONS)}  # fmt: skip
        self.inbox = {role: layout.inbox(role, self.node) for role in CONNECTIONS}
        subjects = self.script.subjects
        for role, link in self.links.items():
            link.subscribe(f"{self.inbox[role]}.*")
        self.links["detector"].subscribe(subjects.event(self.node, "ownerback"))
        self.links["solver"].subscribe(subjects.node_capacity(self.node))
        for subject in (subjects.node_health(self.node), subjects.node_capacity(self.node),
                        subjects.event(self.node, "spot")):  # fmt: skip
            self.links["deviceplugin"].subscribe(subject)
        self.links["kmod-bridge"].subscribe(subjects.node_kmod(self.node))

    async def open(self) -> None:
        for link in self.links.values():
            await link.open()

    def close(self) -> None:
        for link in self.links.values():
            link.close()

    # --- sending helpers -----------------------------------------------------

    def _request(self, role: str, subject: bytes, payload: bytes = b"", kind: str = "request") -> None:
        self.links[role].publish(subject, payload, f"{self.inbox[role]}.{kind}".encode())
        self.tally.sent[kind] += 1

    def _persist(self, role: str, subject: bytes, msg_id: str, payload: bytes) -> None:
        """A JetStream publish (``publish_persistent``): de-duplicated by id, answered with an ack."""
        headers = b"NATS/1.0\r\nNats-Msg-Id: " + msg_id.encode() + b"\r\n\r\n"
        self.links[role].publish(subject, payload, f"{self.inbox[role]}.stored".encode(), headers)
        self.tally.sent["stored"] += 1

    def _put(self, role: str, entry: tuple[bytes, bytes]) -> None:
        self.links[role].publish(entry[0], entry[1], f"{self.inbox[role]}.put".encode())
        self.tally.sent["put"] += 1

    # --- start ---------------------------------------------------------------

    def _ready(self, link: Link) -> None:
        role = link.name.split("@")[0]
        if role not in self.started:
            self.started.add(role)
            getattr(self, f"_start_{role.replace('-', '_')}")()
        elif role == "solver" and self.consumer_ready:
            self.pull()  # the fetch was lost with the connection

    def _start_detector(self) -> None:
        s = self.script
        self._request("detector", s.stream_info(self.layout.stream))
        self._request("detector", s.stream_info(f"KV_{self.layout.bucket(DETECTOR)}"))
        if s.profile.startup_scans:
            self._request("detector", *s.scan(DETECTOR, "fact", f"{self.inbox['detector']}.scan"), kind="scan")
        self.resync()
        for index in range(len(s.facts)):
            self._put("detector", s.facts_kv(index))
        self.capacity()

    def _start_solver(self) -> None:
        s = self.script
        self._request("solver", s.stream_info(self.layout.stream))
        for bucket in (SOLVER, HEALTH):
            self._request("solver", s.stream_info(f"KV_{self.layout.bucket(bucket)}"))
        for kind in ("mapping", "plan") if s.profile.startup_scans else ():
            self._request("solver", *s.scan(SOLVER, kind, f"{self.inbox['solver']}.scan"), kind="scan")
        self._put("solver", s.journal(self.journal_ids))
        self.create_durable()

    def _start_deviceplugin(self) -> None:
        self._request("deviceplugin", self.script.stream_info(f"KV_{self.layout.bucket(HEALTH)}"))
        self.health_gets()

    def _start_kmod_bridge(self) -> None:
        s = self.script
        self._request("kmod-bridge", s.stream_info(f"KV_{self.layout.bucket(KMOD)}"))
        if s.profile.startup_scans:
            self._request("kmod-bridge", *s.scan(KMOD, "watch", f"{self.inbox['kmod-bridge']}.scan"), kind="scan")
        for i in range(s.profile.dev_machines):
            self._put("kmod-bridge", s.watch(self.pidns + i))

    # --- periodic work (the worker's clock calls these) ------------------------

    def resync(self) -> None:
        for subject, msg_id, payload in self.script.facts:
            self._persist("detector", subject, msg_id, payload)
        self.kmod("add")

    def capacity(self) -> None:
        for subject, msg_id, payload in self.script.capacity():
            self._persist("detector", subject, msg_id, payload)

    def kmod(self, op: KmodOp) -> None:
        if self.script.profile.dev_machines:
            self._request("detector", self.script.subjects.kmod_cmd(self.node, op).encode(),
                          self.script.kmod_command(op), kind="kmod")

    def health_gets(self) -> None:
        for subject in self.script.health_gets():
            self._request("deviceplugin", subject, kind="get")

    def churn(self) -> None:
        """A pod started or stopped on the node."""
        subject, msg_id, payload = self.script.churn()
        self._persist("detector", subject, msg_id, payload)
        self._put("detector", self.script.facts_kv(0))
        self.kmod("add")
        self.pidns += 1
        self._put("kmod-bridge", self.script.watch(self.pidns))

    def ping(self, role: str) -> None:
        self.links[role].ping()
        self.tally.sent["ping"] += 1

    # --- the solver ----------------------------------------------------------

    def pull(self) -> None:
        """The next fetch. Each has its own reply subject: the answer to an abandoned one (the
        watchdog gave up on it) is dropped, as nats-py drops the status of an earlier fetch."""
        link = self.links["solver"]
        if not (self.running and self.consumer_ready and link.connected):
            return
        self.fetch += 1
        link.publish(self.script.pull_subject(), self.pull_request, f"{self.inbox['solver']}.f{self.fetch}".encode())
        self.pull_sent = time.monotonic()
        self.tally.sent["pull"] += 1

    def watchdog(self, now: float) -> None:
        """Fetch again when a fetch went unanswered; create the consumer again when its creation was
        refused or not answered within nats-py's 5 s request timeout (the solver retries too)."""
        if not self.running or "solver" not in self.started:
            return
        if not self.consumer_ready:
            if now - self.durable_sent > DURABLE_RETRY_S:
                self.create_durable()
        elif not self.pull_sent or now - self.pull_sent > self.script.profile.fetch_expires_s + 1.0:
            self.pull()

    def _solver(self, link: Link, msg: Message) -> None:
        if msg.reply.startswith(b"$JS.ACK."):  # a delivered event keeps its own subject
            self._apply(link, msg)
            self.pull()
        elif msg.subject.endswith(b".f%d" % self.fetch):
            self.tally.answers[f"fetch {msg.status}"] += 1
            self.pull()
        elif _is_fetch(msg.subject):
            self.tally.answers["fetch answer dropped (abandoned)"] += 1
        elif msg.subject.endswith(b".durable"):
            self._durable(msg)
        else:
            self._detector(link, msg)

    def create_durable(self) -> None:
        """Create (or confirm) the durable consumer, as ``Bus.consume`` does at start and after a failure."""
        self._request("solver", *self.script.durable(), kind="durable")
        self.durable_sent = time.monotonic()

    def _durable(self, msg: Message) -> None:
        if b'"error"' in msg.payload or msg.status:
            self.tally.errors[f"durable consumer refused: {msg.payload[-120:].decode(errors='replace')}"] += 1
            self.tally.refused += not self.refused
            self.refused = True
            return
        self.tally.answers["durable"] += 1
        self.tally.refused -= self.refused
        self.refused = False
        if not self.consumer_ready:
            self.consumer_ready = True
            self.tally.ready += 1
            self.pull()

    def _apply(self, link: Link, msg: Message) -> None:
        """What ``Solver.on_event`` writes for one delivered event, then the ack."""
        self.tally.answers["delivered"] += 1
        msg_id, s = msg.header(b"Nats-Msg-Id"), self.script
        inventory = msg.subject.endswith(b".inventory")
        if msg_id in self.seen and not inventory:
            self.tally.answers["delivered again (seen)"] += 1
        else:
            self.seen[msg_id] = None
            while len(self.seen) > SEEN:
                self.seen.popitem(last=False)
            self.journal_ids.append(msg_id.decode())
            del self.journal_ids[:-256]
            self._put("solver", s.journal(self.journal_ids))
            if not inventory:
                self._put("solver", s.mapping("dev/machine-0"))
                self._put("solver", s.plan(msg_id.decode()))
                kv, subject, payload = s.health()
                self._put("solver", (kv, payload))
                link.publish(subject, payload)
                link.publish(s.kv_subject(SOLVER, "plan", msg_id.decode()), b"",
                             f"{self.inbox['solver']}.put".encode(), b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n")
                self.tally.sent["put"] += 1
        link.publish(msg.reply, ACK)
        self.tally.sent["ack"] += 1

    # --- answers -------------------------------------------------------------

    def _answers(self, link: Link, msg: Message) -> None:
        kind = msg.subject.rsplit(b".", 1)[-1].decode()
        if msg.status == 503:
            self.tally.errors[f"{kind}: no responders"] += 1
        elif b'"error"' in msg.payload[:200] and kind in ("stored", "put", "request", "scan"):
            self.tally.errors[f"{kind}: {msg.payload[:120].decode(errors='replace')}"] += 1
        elif kind == "stored" and b'"duplicate"' in msg.payload:
            self.tally.answers["stored (duplicate dropped)"] += 1
        else:
            self.tally.answers[kind] += 1

    def _detector(self, link: Link, msg: Message) -> None:
        """Answers to the role's requests; anything else is a subscription's event (counted)."""
        if msg.subject.startswith(b"_INBOX."):
            self._answers(link, msg)
        else:
            self.tally.answers["events received (core subscriptions)"] += 1

    def _bridge(self, link: Link, msg: Message) -> None:
        if msg.subject.startswith(b"_INBOX."):
            self._answers(link, msg)
        elif msg.reply:  # a kmod command: answer it
            link.publish(msg.reply, self.script.kmod_reply())
            self.tally.sent["kmod reply"] += 1


def _is_fetch(subject: bytes) -> bool:
    token = subject.rsplit(b".", 1)[-1]
    return token[:1] == b"f" and token[1:].isdigit()

"""Every NATS subject gpushare uses, built and parsed here and nowhere else.

``<prefix>.<node>.event.<kind>``, ``<prefix>.<node>.health.<resource>``,
``<prefix>.<node>.capacity.<resource>``, ``<prefix>.<node>.kmod.<role>``,
``<prefix>.<node>.fence.<resource>``, ``<prefix>.<node>.eviction``,
``<prefix>.<node>.activity``. The prefix is ``gpushare.v1`` in production;
tests and the replay sandbox use their own.  A node name's ``.`` becomes ``_``
(node names never contain ``_``, so the mapping is reversible).

Requests to the kmod-bridge are split by the role that owns the operation
(:data:`KMOD_OPS`): the detector's bookkeeping of reserved containers on
``kmod.detector``, the solver's lending decisions on ``kmod.solver``; NATS
permissions give each role its own subject, and the bridge refuses an
operation that arrives on another role's.

Below :class:`Subjects`, the subjects of NATS and JetStream themselves that gpushare names
(in permissions, in errors, in a key-value listing): reply inboxes, key-value keys, the
JetStream API, acknowledgements and flow control. ``tests/lint`` fails a change that builds
a subject anywhere else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

DEFAULT_PREFIX = "gpushare.v1"
DEFAULT_DOMAIN = "gpushare"

EventKind = Literal["shadow", "share", "generic", "spot", "lowpower", "ownerback", "inventory"]
EVENT_KINDS: tuple[str, ...] = get_args(EventKind)
Channel = Literal["event", "health", "capacity", "kmod", "fence", "eviction", "activity"]
# which role may ask the kmod-bridge for which operation (``config`` is a setting, never a request)
KMOD_OPS: dict[str, tuple[str, ...]] = {
    "detector": ("add", "delete", "stats"),  # the reserved containers it watches, and their counters
    "solver": ("detect", "undetect", "release", "hold", "stats"),  # an owner away, back, held, released;
}  # both read counters (``stats``: the solver reads the module's hold parameters from its reply)
_KMOD_ROLE = {op: role for role, ops in reversed(KMOD_OPS.items()) for op in ops}  # an op's first owner

_TOKEN = re.compile(r"[A-Za-z0-9_-]+\Z")
_PREFIX = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\Z")


class SubjectError(ValueError):
    def __init__(self, subject: str, reason: str) -> None:
        self.subject = subject
        self.reason = reason
        super().__init__(f"invalid subject {subject!r}: {reason}")


def node_token(node: str) -> str:
    if not node or "_" in node or not _TOKEN.match(node.replace(".", "_")):
        raise SubjectError(node, "node names must be non-empty DNS names without '_'")
    return node.replace(".", "_")


def kmod_role(op: str) -> str:
    """The role whose subject carries ``op``; :class:`SubjectError` for an op nobody may request."""
    role = _KMOD_ROLE.get(op)
    if role is None:
        raise SubjectError(op, f"no role requests kmod op {op!r} (ops: {', '.join(sorted(_KMOD_ROLE))})")
    return role


def node_from_token(token: str) -> str:
    return token.replace("_", ".")


def resource_token(resource: str, domain: str = DEFAULT_DOMAIN) -> str:
    """``gpushare/spot-gpu`` -> ``spot-gpu`` (a bare name passes through)."""
    name = resource.removeprefix(domain + "/")
    if not _TOKEN.match(name):
        raise SubjectError(resource, "resource token must be letters, digits, '-' or '_'")
    return name


@dataclass(frozen=True, slots=True)
class SubjectInfo:
    node: str
    channel: str
    name: str  # event kind, resource token, the requesting role (kmod) or ""


@dataclass(frozen=True, slots=True)
class Subjects:
    """Subject builders for one prefix."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not _PREFIX.match(self.prefix):
            raise SubjectError(self.prefix, "prefix must be dot-separated tokens")

    def event(self, node: str, kind: str) -> str:
        if kind not in EVENT_KINDS:
            raise SubjectError(kind, f"unknown event kind (one of {', '.join(EVENT_KINDS)})")
        return f"{self.prefix}.{node_token(node)}.event.{kind}"

    def node_events(self, node: str) -> str:
        return f"{self.prefix}.{node_token(node)}.event.*"

    def health(self, node: str, resource: str) -> str:
        return f"{self.prefix}.{node_token(node)}.health.{resource_token(resource)}"

    def node_health(self, node: str) -> str:
        return f"{self.prefix}.{node_token(node)}.health.*"

    def capacity(self, node: str, resource: str) -> str:
        return f"{self.prefix}.{node_token(node)}.capacity.{resource_token(resource)}"

    def node_capacity(self, node: str) -> str:
        return f"{self.prefix}.{node_token(node)}.capacity.*"

    def kmod_cmd(self, node: str, op: str) -> str:
        """Where a request for ``op`` goes: the subject of the role that owns it (the first that
        does; a service sends on its own role's, :meth:`kmod_requests`)."""
        return self.kmod_requests(node, kmod_role(op))

    def kmod_requests(self, node: str, role: str) -> str:
        """The requests of one role to the node's kmod-bridge (what the bridge serves)."""
        if role not in KMOD_OPS:
            raise SubjectError(role, f"no kmod requests of role {role!r} (one of {', '.join(KMOD_OPS)})")
        return f"{self.prefix}.{node_token(node)}.kmod.{role}"

    def node_kmod(self, node: str) -> str:
        """Every role's requests to the node's kmod-bridge (a stand-in serving them all)."""
        return f"{self.prefix}.{node_token(node)}.kmod.*"

    def presence(self, node: str) -> str:
        """A subject of ``node`` nothing publishes: a direct get of it says whether the stream exists."""
        return f"{self.prefix}.{node_token(node)}.presence"

    def fence(self, node: str, resource: str) -> str:
        """The solver's request that the device plugin refuse Allocate of some devices now, answered
        once it does (a reclaim looks its borrowers up only after that)."""
        return f"{self.prefix}.{node_token(node)}.fence.{resource_token(resource)}"

    def node_fences(self, node: str) -> str:
        return f"{self.prefix}.{node_token(node)}.fence.*"

    def eviction(self, node: str) -> str:
        return f"{self.prefix}.{node_token(node)}.eviction"

    def all(self) -> str:
        return f"{self.prefix}.>"

    def node_all(self, node: str) -> str:
        """Everything of one node (``gpushare-events tail --node``)."""
        return f"{self.prefix}.{node_token(node)}.>"

    def node_channel(self, node: str, channel: str) -> str:
        """One node's ``channel`` (``event.spot``, ``capacity.*``, ``kmod.solver``: a permission's pattern)."""
        return f"{self.prefix}.{node_token(node)}.{channel}"

    def every_node_capacity(self) -> str:
        """Spare vCPU/vMem of every node (the console's observer role reads them all)."""
        return f"{self.prefix}.*.capacity.>"

    def activity(self, node: str) -> str:
        """The GPU activity of every container gpushare placed on the node's cards (core, not stored)."""
        return f"{self.prefix}.{node_token(node)}.activity"

    def every_node_activity(self) -> str:
        """The GPU activity of every node (the console)."""
        return f"{self.prefix}.*.activity"

    def every_node_eviction(self) -> str:
        """The eviction records of every node (the console's timeline)."""
        return f"{self.prefix}.*.eviction"

    def every_node_event(self, kind: str) -> str:
        if kind not in EVENT_KINDS:
            raise SubjectError(kind, f"unknown event kind (one of {', '.join(EVENT_KINDS)})")
        return f"{self.prefix}.*.event.{kind}"

    def stream_subjects(self, node: str = "") -> list[str]:
        """What the event stream records: events, health, capacity, evictions (not kmod requests);
        of one node (its leaf server's stream), or of every node."""
        p, n = self.prefix, node_token(node) if node else "*"
        return [f"{p}.{n}.event.*", f"{p}.{n}.health.*", f"{p}.{n}.capacity.*", f"{p}.{n}.eviction"]

    def rebase(self, subject: str, onto: Subjects) -> str:
        """``subject`` of this prefix under ``onto``'s prefix (the replay sandbox)."""
        if not subject.startswith(self.prefix + "."):
            raise SubjectError(subject, f"does not start with {self.prefix + '.'!r}")
        return onto.prefix + subject[len(self.prefix):]

    def parse(self, subject: str) -> SubjectInfo:
        head = self.prefix + "."
        if not subject.startswith(head):
            raise SubjectError(subject, f"does not start with {head!r}")
        parts = subject[len(head) :].split(".")
        if len(parts) < 2 or not all(_TOKEN.match(p) for p in parts):
            raise SubjectError(subject, "expected <node>.<channel>[.<name>]")
        node, channel, rest = node_from_token(parts[0]), parts[1], parts[2:]
        if channel == "event" and len(rest) == 1 and rest[0] in EVENT_KINDS:
            return SubjectInfo(node, channel, rest[0])
        if channel in ("health", "capacity", "fence") and len(rest) == 1:
            return SubjectInfo(node, channel, rest[0])
        if channel == "kmod" and len(rest) == 1 and rest[0] in KMOD_OPS:
            return SubjectInfo(node, channel, rest[0])
        if channel in ("eviction", "activity") and not rest:
            return SubjectInfo(node, channel, "")
        raise SubjectError(subject, f"unknown channel {'.'.join(parts[1:])!r}")


DEFAULT = Subjects()


# --- NATS's and JetStream's own subjects ------------------------------------------------

JS_API_INFO = "$JS.API.INFO"
AUTH_CALLOUT = "$SYS.REQ.USER.AUTH"  # where the server asks the auth callout service


def below(subject: str) -> str:
    """Every subject under ``subject`` (``subject.>``)."""
    return f"{subject}.>"


INBOX = "_INBOX"  # nats-py's own reply prefix (a connection of no role)


def inbox(role: str, node: str = "") -> str:
    """The reply-subject prefix of a role's connection (others cannot read its replies)."""
    return f"{INBOX}.{role}.{node_token(node)}" if node else f"{INBOX}.{role}"


def kv_stream(bucket: str) -> str:
    """The stream behind a key-value bucket (a stream name, not a subject)."""
    return f"KV_{bucket}"


def kv_key(bucket: str, key: str) -> str:
    """The subject of ``key`` (or of a key prefix, a pattern) in ``bucket``."""
    return f"$KV.{bucket}.{key}"


def kv_key_of(bucket: str, subject: str) -> str:
    """The key a message of ``bucket``'s stream stands for."""
    head = kv_key(bucket, "")
    if not subject.startswith(head):
        raise SubjectError(subject, f"not a key of bucket {bucket}")
    return subject[len(head):]


ANY_DOMAIN = "*"  # the JetStream API of any domain (every node's leaf server: an observer's reads)


def js_api(domain: str = "") -> str:
    """The JetStream API of the server connected to, or of JetStream domain ``domain`` (a node's
    leaf server, reached through the cluster)."""
    return f"$JS.{domain}.API" if domain else "$JS.API"


def js_api_all(domain: str = "") -> str:
    return below(js_api(domain))


def js_stream_info(stream: str, domain: str = "") -> str:
    return f"{js_api(domain)}.STREAM.INFO.{stream}"


def js_direct_get(stream: str, subject: str = "", domain: str = "") -> str:
    """A direct get from ``stream`` (of the last message on ``subject`` when given)."""
    return f"{js_api(domain)}.DIRECT.GET.{stream}" + (f".{subject}" if subject else "")


def js_consumer_create(stream: str, consumer: str = "", filter_subject: str = "", domain: str = "") -> str:
    """Creating a consumer of ``stream`` (named, filtered: the forms the server checks)."""
    tail = "".join(f".{part}" for part in (consumer, filter_subject) if part)
    return f"{js_api(domain)}.CONSUMER.CREATE.{stream}{tail}"


def js_consumer_delete(stream: str, consumer: str, domain: str = "") -> str:
    return f"{js_api(domain)}.CONSUMER.DELETE.{stream}.{consumer}"


def js_consumer_info(stream: str, consumer: str) -> str:
    return f"$JS.API.CONSUMER.INFO.{stream}.{consumer}"


def js_consumer_next(stream: str, consumer: str) -> str:
    """A pull consumer's request for its next messages."""
    return f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"


def js_acks(stream: str, consumer: str) -> str:
    """Every acknowledgement subject of a consumer's messages."""
    return f"$JS.ACK.{stream}.{consumer}.>"


def js_flow_control(stream: str) -> str:
    return f"$JS.FC.{stream}.>"

"""Where gpushare keeps its state in NATS, and who may touch what (docs/state.md).

Each node's leaf server holds, in its own JetStream domain (:meth:`Layout.node_domain`),
one stream (``GPUSHARE``) of that node's events and one key-value bucket per *role*
holding that role's state, the node's subject token first in every key
(``<node>.<kind>.<name>``), so a permission can name one node's part of a bucket (and one
server may hold every node's, as in the tests):

=====================  ===========================  =====================  ========================
bucket                 keys                         written by             read by
=====================  ===========================  =====================  ========================
``<kv>-solver``        ``<node>.mapping.<owner>``,  solver                 solver
                       ``<node>.plan.<trigger>``,
                       ``<node>.journal.state``
``<kv>-health``        ``<node>.health.<resource>`` solver                 deviceplugin, dra-driver
``<kv>-detector``      ``<node>.fact.<pod>``        detector               detector
``<kv>-kmod``          ``<node>.watch.<pidns>``     kmod-bridge            kmod-bridge
=====================  ===========================  =====================  ========================

:func:`permissions` turns this table into the NATS permissions of one role on
one node: a service may publish only its own node's subjects of its own
channels, write only its own bucket under its own node, read only what it
consumes, and only the solver may use its durable consumer. Nobody but the
installer creates, updates or deletes a stream or a bucket. The ``leaf`` role is a node's
leaf server as the cluster sees its connection: its node's traffic only.

Every consumer a role may create is named in its permission, never a wildcard
(the server takes a consumer's name from the request subject, and a create of
an existing name updates it): a node role reads its keys through
``<role>-<node>-<kind>`` consumers, the observer through ``observer-<instance>``
(its pod). Nobody can create, update or delete a consumer another identity
reads through. Node roles get no ``STREAM.INFO`` (its ``subjects_filter``
lists every node's keys); they learn that the event stream exists from a
direct get of a subject of their own that nothing publishes
(``Subjects.presence``), on their leaf as anywhere. The observer's consumers are
named the same in every node's domain (``$JS.<domain>.API``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from . import subjects as nats
from .subjects import DEFAULT_PREFIX, EVENT_KINDS, KMOD_OPS, Subjects, node_token

Role = Literal["detector", "solver", "deviceplugin", "kmod-bridge", "dra-driver", "leaf", "observer", "installer"]
SERVICE_ROLES: tuple[Role, ...] = ("detector", "solver", "deviceplugin", "kmod-bridge", "dra-driver")
# the node's leaf server, as the cluster sees its connection: one node's traffic in and out
LEAF: Role = "leaf"
NODE_ROLES: tuple[Role, ...] = (*SERVICE_ROLES, LEAF)
ROLES: tuple[Role, ...] = (*NODE_ROLES, "observer", "installer")

SOLVER, HEALTH, DETECTOR, KMOD = "solver", "health", "detector", "kmod"
BUCKETS = (SOLVER, HEALTH, DETECTOR, KMOD)
# the kinds of state under each node in each bucket (``<node>.<kind>.<name>``)
KINDS: dict[str, tuple[str, ...]] = {SOLVER: ("mapping", "plan", "journal"), HEALTH: ("health",),
                                     DETECTOR: ("fact",), KMOD: ("watch",)}
OBSERVED = (SOLVER, HEALTH)  # the buckets the observer (the console) follows
_WRITES: dict[str, tuple[str, ...]] = {"solver": (SOLVER, HEALTH), "detector": (DETECTOR,),
                                       "kmod-bridge": (KMOD,)}
_READS: dict[str, tuple[str, ...]] = {"solver": (SOLVER, HEALTH), "detector": (DETECTOR,),
                                      "kmod-bridge": (KMOD,), "deviceplugin": (HEALTH,), "dra-driver": (HEALTH,)}
# node channels each role publishes (requests on kmod.<role> and fence.*), and subscribes to (the
# roles that answer requests may publish their replies: allow_responses)
_PUBLISHES: dict[str, tuple[str, ...]] = {
    "detector": (*(f"event.{k}" for k in EVENT_KINDS if k != "ownerback"), "capacity.*", "kmod.detector",
                 "activity"),
    "solver": ("health.*", "eviction", "kmod.solver", "fence.*"),
    "kmod-bridge": ("event.ownerback",),
    "deviceplugin": (),
    "dra-driver": ("event.inventory",),  # its cards, beside the detector's inventory
}
_SUBSCRIBES: dict[str, tuple[str, ...]] = {
    "detector": ("event.ownerback",),
    "solver": ("capacity.*",),
    "kmod-bridge": tuple(f"kmod.{role}" for role in KMOD_OPS),
    "deviceplugin": ("health.*", "capacity.*", "event.spot", "fence.*"),
    "dra-driver": ("health.spot-gpu",),  # the solver's desired health of the spot devices
}

_ANSWERS: tuple[str, ...] = ("kmod-bridge", "deviceplugin")  # kmod.<role>, fence.*


class LayoutError(ValueError):
    """A role or node that has no permissions (the message says which)."""


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False

    def as_jwt(self) -> dict[str, object]:
        """The permission fields of a user JWT's ``nats`` claim (auth callout)."""
        doc: dict[str, object] = {"pub": {"allow": list(self.publish)}, "sub": {"allow": list(self.subscribe)}}
        if self.allow_responses:
            doc["resp"] = {"max": 1, "ttl": 0}
        return doc

    def as_config(self) -> dict[str, object]:
        """The ``permissions`` object of a user in a nats-server configuration file."""
        doc: dict[str, object] = {"publish": {"allow": list(self.publish)},
                                  "subscribe": {"allow": list(self.subscribe)}}
        if self.allow_responses:
            doc["allow_responses"] = {"max": 1}
        return doc


@dataclass(frozen=True, slots=True)
class Layout:
    prefix: str = DEFAULT_PREFIX
    stream: str = "GPUSHARE"
    kv_prefix: str = "gpushare"

    def bucket(self, name: str) -> str:
        if name not in BUCKETS:
            raise LayoutError(f"unknown bucket {name!r} (one of {', '.join(BUCKETS)})")
        return f"{self.kv_prefix}-{name}"

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.prefix)

    def stream_subjects(self, node: str = "") -> list[str]:
        """What the event stream records: events, health, capacity, evictions (not kmod requests);
        of one node (its leaf's stream), or of every node (one server for all, the tests)."""
        return self.subjects.stream_subjects(node)

    def node_domain(self, node: str) -> str:
        """The JetStream domain of a node's leaf server: its stream and buckets, reached from the
        cluster as ``$JS.<domain>.API``."""
        return f"{self.kv_prefix}-{node_token(node)}"

    def scope(self, node: str, kind: str) -> str:
        """The key prefix of one node's ``kind`` of state in its role's bucket."""
        return f"{node_token(node)}.{kind}"

    def durable(self, node: str) -> str:
        """The solver's durable consumer of one node's events."""
        return f"solver-{node_token(node)}"

    def scan_consumer(self, role: str, scope: str) -> str:
        """The consumer a node role lists its keys of one scope (``<node>.<kind>``) through."""
        return f"{role}-{scope.replace('.', '-')}"

    def observer_consumer(self, instance: str = "") -> str:
        """The consumer one observer (``instance``: its pod) follows a bucket through."""
        return f"observer-{node_token(instance or 'console')}"

    def presence(self, node: str) -> str:
        """A subject of ``node`` nothing publishes (the stream's existence, by a direct get)."""
        return self.subjects.presence(node)

    def inbox(self, role: str, node: str = "") -> str:
        """The reply-subject prefix of a role's connection (others cannot read its replies)."""
        return nats.inbox(role, node)

    def permissions(self, role: str, node: str = "") -> Permissions:
        if role == "installer":
            return Permissions(publish=(">",), subscribe=(">",), allow_responses=True)
        if role == "observer":
            return self._observer(node)  # its instance (pod) names its consumers
        if role == LEAF and node:
            return self._leaf(node)
        if role not in NODE_ROLES:
            raise LayoutError(f"unknown role {role!r} (one of {', '.join(ROLES)})")
        if not node:
            raise LayoutError(f"role {role} acts for one node: a node name is required")
        token, on = node_token(node), self.subjects
        # every node service waits for the event stream to exist: a direct get answered "no message"
        publish = [on.node_channel(node, c) for c in _PUBLISHES[role]] + [
            nats.js_direct_get(self.stream, self.presence(node))]
        subscribe = [on.node_channel(node, c) for c in _SUBSCRIBES[role]] + [nats.below(self.inbox(role, node))]
        for name in _READS.get(role, ()):
            publish += self._kv_read(role, name, node)
        publish += [nats.below(nats.kv_key(self.bucket(name), token)) for name in _WRITES.get(role, ())]
        if role == "solver":
            publish += self._durable_consumer(node)
        return Permissions(tuple(publish), tuple(subscribe), allow_responses=role in _ANSWERS)

    def _kv_read(self, role: str, name: str, node: str) -> list[str]:
        """Its node's keys of one bucket: by key, and listed through consumers named for it."""
        bucket, token = self.bucket(name), node_token(node)
        stream, keys = nats.kv_stream(bucket), nats.below(nats.kv_key(bucket, token))
        scans = [(self.scan_consumer(role, self.scope(node, kind)),
                  nats.below(nats.kv_key(bucket, self.scope(node, kind)))) for kind in KINDS[name]]
        return [nats.js_direct_get(stream, keys),
                *(nats.js_consumer_create(stream, consumer, subject) for consumer, subject in scans),
                *(nats.js_consumer_delete(stream, consumer) for consumer, _ in scans)]

    def _durable_consumer(self, node: str) -> list[str]:
        name, s = self.durable(node), self.stream
        return [nats.js_consumer_create(s, name, self.subjects.node_events(node)),
                nats.js_consumer_info(s, name),
                nats.js_consumer_delete(s, name),  # made again from its floor when found changed
                nats.js_consumer_next(s, name),
                nats.js_acks(s, name)]

    def _leaf(self, node: str) -> Permissions:
        """A node's leaf server as the cluster sees its connection (publish: what it may send into
        the cluster; subscribe: what the cluster may send it). Out: the node's own subjects (only
        observers may listen to them there) and the answers to observers; in: the observers'
        read-only requests to the node's JetStream domain (the observer's own permissions limit
        them). Nothing of another node, and nobody in the cluster may publish on this node's
        subjects through it."""
        return Permissions(publish=(self.subjects.node_all(node), nats.below(self.inbox("observer"))),
                           subscribe=(nats.js_api_all(self.node_domain(node)),
                                      *(nats.js_flow_control(s) for s in self._streams())))

    def _streams(self) -> list[str]:
        return [self.stream, *(nats.kv_stream(self.bucket(b)) for b in BUCKETS)]

    def _observer(self, instance: str) -> Permissions:
        """Reads everything, writes nothing, of the server it is connected to or of any node's leaf
        (``$JS.<domain>.API``): stream and bucket info, direct gets, and what it follows through a
        consumer of its own (``observer-<instance>``, made again after a loss): the buckets of
        :data:`OBSERVED`, and the event stream (``gpushare-events replay``)."""
        consumer = self.observer_consumer(instance)
        follows = [(nats.kv_stream(self.bucket(b)), nats.kv_key(self.bucket(b), ">")) for b in OBSERVED]
        follows.append((self.stream, self.subjects.all()))
        publish = [nats.JS_API_INFO]
        for domain in ("", nats.ANY_DOMAIN):
            for stream in self._streams():
                publish += [nats.js_stream_info(stream, domain), nats.js_direct_get(stream, domain=domain),
                            nats.below(nats.js_direct_get(stream, domain=domain))]
            for stream, keys in follows:
                publish += [nats.js_consumer_create(stream, consumer, keys, domain),
                            nats.js_consumer_delete(stream, consumer, domain)]
        publish += [nats.js_flow_control(stream) for stream, _ in follows]
        return Permissions(tuple(publish), (self.subjects.all(), nats.below(self.inbox("observer"))))

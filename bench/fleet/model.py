"""What one GPU node sends to NATS, and how often: periods read from the services' own settings.

:class:`Periods` takes every period from the code (the settings' defaults, the
bus's fetch loop, nats-py's ping interval), so the emulated fleet follows the
services when they change. :class:`Profile` is the workload the code cannot
tell: what runs on a node and how often its pods change. :class:`NodeScript`
builds one node's subjects and payloads (the real event, plan, journal, mapping
and watch-entry types, encoded as the services encode them).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

import msgspec
from gpushare_common import events as ev
from gpushare_common.bus import escape_key
from gpushare_common.bus.connection import connect_options
from gpushare_common.layout import DETECTOR, HEALTH, KMOD, SOLVER, Layout
from gpushare_common.mapping import DeviceStatus, OwnerEntry
from gpushare_common.settings import NatsSettings
from gpushare_common.subjects import (
    INBOX,
    Subjects,
    below,
    js_consumer_create,
    js_consumer_next,
    js_direct_get,
    js_stream_info,
    kv_key,
    kv_stream,
)
from gpushare_detector.settings import DetectorSettings
from gpushare_deviceplugin.settings import DevicePluginSettings
from gpushare_kmod_bridge.watchset import WatchEntry
from gpushare_solver.actions import Plan, SetHealth
from gpushare_solver.journal import JournalDoc
from gpushare_solver.settings import SolverSettings
from nats.js import api

FETCH_TIMEOUT_S = 0.5  # gpushare_common.bus.jetstream.consume: sub.fetch(batch, timeout=0.5)
DUPLICATE_WINDOW_S = 120.0  # gpushare_common.bus.jetstream.ensure_layout: the stream's duplicate_window
CONNECTIONS = ("detector", "solver", "deviceplugin", "kmod-bridge")  # one NATS connection per service
JOURNAL_SEEN = 256  # gpushare_solver.service._PERSISTED_SEEN: event ids kept in the journal


@dataclass(frozen=True, slots=True)
class Periods:
    resync_s: float  # detector: republish every fact (stable ids) and resend the kmod watch set
    inventory_s: float  # detector: read the kubelet's cards, publish only a change
    owners_s: float  # detector: one kmod ``stats`` request per sample (scrape_s)
    capacity_s: float  # detector: sample cgroups; publish vcpu and vmem when they move
    capacity_republish_s: float  # detector: publish them anyway this often
    health_resync_s: float  # device plugin: re-read its desired health (one get per plugin)
    plugins: int  # device plugin: share specs + share-dev specs + spot
    ping_s: float  # nats-py keep-alive PING on every connection

    @classmethod
    def from_code(cls) -> Periods:
        d, p = DetectorSettings(), DevicePluginSettings()
        ping = float(connect_options(NatsSettings(), INBOX)["ping_interval"])
        return cls(resync_s=d.resync_s, inventory_s=d.inventory_s, owners_s=d.scrape_s, capacity_s=d.capacity_s,
                   capacity_republish_s=d.capacity_republish_s, health_resync_s=p.resync_s,
                   plugins=len(p.share_specs) + len(p.share_dev_specs) + int(p.spot), ping_s=ping)


@dataclass(frozen=True, slots=True)
class Profile:
    """What runs on one node (workload, not code): chosen to be a busy 8-card node."""

    cards: int = 8
    shadow_pods: int = 2  # ShareGPU holders (share-gpu-4)
    share_pods: int = 4  # SharePods using them
    dev_machines: int = 2  # lendable reserved pods: one generic fact and one lowpower fact each
    spot_pods: int = 2  # borrowers
    churn_per_hour: float = 12.0  # pod starts and stops on the node
    capacity_moves: bool = True  # the node's use moves by more than the usage step every sample
    # the key-value listings a service start makes (one short-lived consumer each, four a node);
    # off by default: nodes join at the fleet's pace, not all at once (see the module docstring)
    startup_scans: bool = False
    # the expiry of the solver's fetches (the code's 0.5 s; another value shows what a change would do)
    fetch_expires_s: float = FETCH_TIMEOUT_S

    @property
    def facts(self) -> int:
        """Events one resync republishes: every pod fact, every owner's away state, the inventory."""
        return self.shadow_pods + self.share_pods + 2 * self.dev_machines + self.spot_pods + 1


def per_node_rates(profile: Profile, periods: Periods) -> dict[str, float]:
    """Messages per second one node sends (steady state), by kind."""
    capacity_every = periods.capacity_s if profile.capacity_moves else periods.capacity_republish_s
    return {
        "solver pull requests (durable consumer fetch)": 1 / profile.fetch_expires_s,
        "JetStream publishes (resync, stable ids)": profile.facts / periods.resync_s,
        "JetStream publishes (capacity)": 2 / capacity_every,
        "JetStream publishes (pod churn)": profile.churn_per_hour / 3600,
        "requests (kmod add/stats, health gets)": 1 / periods.resync_s + 1 / periods.owners_s
        + periods.plugins / periods.health_resync_s,
        "keep-alive pings": len(CONNECTIONS) / periods.ping_s,
    }


def _id() -> str:
    return uuid.uuid4().hex


@dataclass
class NodeScript:
    """One node's subjects and payloads."""

    node: str
    layout: Layout
    profile: Profile
    facts: list[tuple[bytes, str, bytes]] = field(default_factory=list)  # subject, stable id, payload

    def __post_init__(self) -> None:
        self.subjects = Subjects(self.layout.prefix)
        self.cards = tuple(f"GPU-{self.node}-{i}" for i in range(self.profile.cards))
        p, cards = self.profile, self.cards
        made: list[ev.Event] = []
        for i in range(p.shadow_pods):
            made.append(ev.ShadowEvent(node=self.node, shadow_pod=f"gpushare-system/shadow-{i}", state="running",
                                       resource="share-gpu-4", share_spec=4, vendor_resource="nvidia.com/gpu",
                                       devices=(cards[i],)))  # fmt: skip
        for i in range(p.share_pods):
            made.append(ev.ShareEvent(node=self.node, share_pod=f"infer/pod-{i}", container="main",
                                      resource="share-gpu-4", state="using",
                                      devices=(f"gpushare-system/shadow-{i % max(1, p.shadow_pods)}-{i}",)))
        for i in range(p.dev_machines):
            owner, card = f"dev/machine-{i}", cards[p.shadow_pods + i]
            made.append(ev.ReservedEvent(node=self.node, pod=owner, container="main", vendor_resource="nvidia.com/gpu",
                                        state="using", devices=(card,), lendable=True))  # fmt: skip
            made.append(ev.LowPowerEvent(node=self.node, owner=owner, using=False, devices=(card,)))
        for i in range(p.spot_pods):
            made.append(self._spot(i))
        made.append(ev.CardInventory(node=self.node, vendor_resource="nvidia.com/gpu", devices=cards))
        self.facts = [self._fact(e) for e in made]

    def _spot(self, i: int) -> ev.SpotEvent:
        card = self.cards[self.profile.shadow_pods + i % max(1, self.profile.dev_machines)]
        return ev.SpotEvent(node=self.node, pod=f"spot/job-{_id()[:8]}", container="main", state="using",
                            devices=(f"spot-{card}",), pod_uid=_id())  # fmt: skip

    def _fact(self, event: ev.Event) -> tuple[bytes, str, bytes]:
        subject = self.subjects.event(self.node, ev.event_tag(event))
        return subject.encode(), event.id, ev.encode(event)

    def churn(self) -> tuple[bytes, str, bytes]:
        """A pod started or stopped: one fact replaced by a new one (a new id)."""
        index = next((i for i, f in enumerate(self.facts) if f[0].endswith(b".spot")), 0)
        self.facts[index] = self._fact(self._spot(index))
        return self.facts[index]

    def capacity(self) -> list[tuple[bytes, str, bytes]]:
        out = []
        for resource, unit in (("vcpu", 1000), ("vmem", 1 << 30)):
            event = ev.SpareCapacity(node=self.node, resource=resource, devices=12, unit=unit,
                                     inputs={"node_used": 0.4, "reserved": 0.1, "pods_used": 0.3})
            out.append((self.subjects.capacity(self.node, resource).encode(), event.id, ev.encode(event)))
        return out

    def kmod_command(self, op: ev.KmodOp) -> bytes:
        pods = tuple(f"dev/machine-{i}/main" for i in range(self.profile.dev_machines))
        return ev.encode(ev.KmodCommand(node=self.node, op=op, pods=pods, reason="detector"))

    def kmod_reply(self) -> bytes:
        return ev.encode(ev.KmodReply(node=self.node, op="add", status=0))

    # --- JetStream API --------------------------------------------------------

    def durable(self) -> tuple[bytes, bytes]:
        """The solver's durable consumer, created as ``bus.consume`` creates it."""
        name, stream = self.layout.durable(self.node), self.layout.stream
        config = api.ConsumerConfig(name=name, durable_name=name, ack_policy=api.AckPolicy.EXPLICIT, max_deliver=-1,
                                    ack_wait=SolverSettings().ack_wait_s, deliver_policy=api.DeliverPolicy.ALL,
                                    filter_subject=self.subjects.node_events(self.node))  # fmt: skip
        subject = js_consumer_create(stream, name, config.filter_subject)
        return subject.encode(), json.dumps({"stream_name": stream, "config": config.as_dict()}).encode()

    def pull_subject(self) -> bytes:
        return js_consumer_next(self.layout.stream, self.layout.durable(self.node)).encode()

    def scan(self, bucket: str, kind: str, deliver: str) -> tuple[bytes, bytes]:
        """The short-lived consumer a key-value listing creates (``Store.raw_items`` at a start)."""
        name_of = self.layout.bucket(bucket)
        stream, head = kv_stream(name_of), kv_key(name_of, self.layout.scope(self.node, kind))
        name = f"scan{_id()[:16]}"
        config = api.ConsumerConfig(name=name, filter_subject=below(head), deliver_subject=deliver,
                                    deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT, ack_policy=api.AckPolicy.NONE,
                                    inactive_threshold=5.0, mem_storage=True, num_replicas=1)  # fmt: skip
        subject = js_consumer_create(stream, name, config.filter_subject)
        return subject.encode(), json.dumps({"stream_name": stream, "config": config.as_dict()}).encode()

    def stream_info(self, stream: str) -> bytes:
        return js_stream_info(stream).encode()

    # --- key-value -----------------------------------------------------------

    def kv_subject(self, bucket: str, kind: str, key: str) -> bytes:
        return kv_key(self.layout.bucket(bucket), f"{self.layout.scope(self.node, kind)}.{escape_key(key)}").encode()

    def journal(self, seen: list[str]) -> tuple[bytes, bytes]:
        doc = JournalDoc(seen=seen[-JOURNAL_SEEN:], inventory={"nvidia.com/gpu": list(self.cards)})
        return self.kv_subject(SOLVER, "journal", "state"), msgspec.json.encode(doc)

    def mapping(self, owner: str) -> tuple[bytes, bytes]:
        entry = OwnerEntry(owner=owner, kind="spot-owner", resource="spot-gpu",
                           devices={c: DeviceStatus(id=c) for c in self.cards[:2]})
        return self.kv_subject(SOLVER, "mapping", owner), msgspec.json.encode(entry)

    def plan(self, trigger: str) -> tuple[bytes, bytes]:
        action = SetHealth(resource="spot-gpu", devices={f"spot-{self.cards[0]}": "Unhealthy"}, reason="spot")
        plan = Plan(trigger_id=trigger, event="spot", actions=[action])
        return self.kv_subject(SOLVER, "plan", trigger), msgspec.json.encode(plan)

    def health(self) -> tuple[bytes, bytes, bytes]:
        """(KV subject, core health subject, payload) of the spot resource's desired health."""
        event = ev.DeviceHealth(node=self.node, resource="spot-gpu", full=True,
                                devices={f"spot-{c}": "Healthy" for c in self.cards})
        return (self.kv_subject(HEALTH, "health", "spot-gpu"),
                self.subjects.health(self.node, "spot-gpu").encode(), ev.encode(event))

    def facts_kv(self, index: int) -> tuple[bytes, bytes]:
        payload = self.facts[index][2]
        return self.kv_subject(DETECTOR, "fact", f"pod-{index}"), b"[" + payload + b"]"

    def watch(self, pidns: int) -> tuple[bytes, bytes]:
        entry = WatchEntry(pidns=pidns, pod=f"dev/machine-{pidns % 8}", container="main")
        return self.kv_subject(KMOD, "watch", str(pidns)), msgspec.json.encode(entry)

    def health_gets(self) -> list[bytes]:
        """The device plugin's direct gets of its desired health, one per plugin."""
        settings, bucket = DevicePluginSettings(), self.layout.bucket(HEALTH)
        tokens = [f"share-gpu-{n}" for n in settings.share_specs]
        tokens += [f"share-dev-gpu-{n}" for n in settings.share_dev_specs] + ["spot-gpu"] * settings.spot
        scope = self.layout.scope(self.node, "health")
        return [js_direct_get(kv_stream(bucket), kv_key(bucket, f"{scope}.{t}")).encode() for t in tokens]

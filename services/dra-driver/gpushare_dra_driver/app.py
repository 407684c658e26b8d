"""Lifecycle of the DRA driver: serve the kubelet, follow the cards, publish the slice, drain.

Order: the prepared-claims state is read and the CDI directory reconciled with it; the DRA
and registration sockets serve (so the kubelet can unprepare what was prepared before a
restart, even before anything else is up); the vendor plugins are followed and the slice
published on every change; NATS brings the solver's desired spot health (and takes the
node's card inventory).

- Consumes: the vendor plugins' device lists, the solver's desired spot health (core subject;
  the ``health`` bucket after every reconnect), ResourceClaims (API server reads).
- Publishes: the node's card inventory (``event.inventory``, with the cards its share claims use:
  not lendable); its ResourceSlice; CDI specs and
  prepared claims to the kubelet (DRA and plugin-registration gRPC).
- Runs: socket keeper, vendor feeds, slice publisher, NATS; HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from gpushare_common import dra, events
from gpushare_common.adapters.vendorplugin import watch_vendor
from gpushare_common.bus import BusError, Permanent
from gpushare_common.logging import get_logger
from gpushare_common.retry import Backoff, Supervised
from gpushare_common.service import ServiceBase
from gpushare_common.settings import CommonSettings
from gpushare_common.topology import CardTopology, card_topology
from gpushare_common.vendors import VendorResource
from prometheus_client import CollectorRegistry

from .adapters import kube as kube_adapter
from .adapters import kubelet
from .adapters.files import NodeFiles
from .claims import ClaimRef
from .healthevents import HealthTeller, Versioned
from .inventory import Inventory
from .metrics import DriverMetrics
from .mps import DaemonError, MpsDaemon, answered_with_daemon
from .prepare import ClaimSource, Node, Preparer
from .settings import DraSettings
from .slices import build_slices, lendable_cards
from .state import PreparedClaim
from .status import DraStatus

SERVICE = "dra-driver"
SPOT_TOKEN = "spot-gpu"
log = get_logger(SERVICE)


class Service(ServiceBase):
    """The driver of one node (the ``kubelet.Driver`` the gRPC servicers call)."""

    status_model = DraStatus
    freeze_after_start = True  # the kubelet's prepare calls must not wait on a collection

    def __init__(self, common: CommonSettings, settings: DraSettings, vendors: dict[str, VendorResource],
                 registry: CollectorRegistry | None = None, stop: asyncio.Event | None = None) -> None:
        super().__init__(SERVICE, common.http, "kubelet", "slice", "nats", stop=stop, registry=registry)
        self.common, self.settings, self.vendors = common, settings, vendors
        self.node = self.pool = common.node.require()
        self.name, self.endpoint = settings.driver, settings.dra_socket
        self.metrics = DriverMetrics(self.registry)
        self.bus = self.skeleton.bus(common.nats, self.node)  # drained last on exit
        self.files = NodeFiles(settings.cdi_dir, settings.state_file)
        self.inventory = Inventory(self.node, self._topology, settings.card_memory(), settings.card_model,
                                   settings.driver)
        self.spot_health: dict[str, str] = {}
        self._health_ts = 0.0
        self.cards_changed, self.board = asyncio.Event(), Versioned()
        self.claims: ClaimSource | None = None
        self.slices: Any = None
        self.generation = 0
        self.published: list[dict[str, Any]] | None = None
        self.registered = ""
        self.preparer = Preparer(
            Node(settings.driver, self.pool, settings.shares, vendors, settings.device_root,
                 settings.host_root, settings.mps_dir, self.inventory.devices,
                 lambda: self.inventory.slots(settings.slot_kinds)),
            self, self.files, self.files.load_state())
        self.mps = MpsDaemon(self.node, settings.mps_dir, settings.mps_command, settings.mps_ready_s)
        self.skeleton.on_exit(self.mps.close)
        self.sockets = [kubelet.dra_server(settings.dra_socket, self, self.stopping, settings.resync_s),
                        kubelet.registration_server(settings.registration_socket, self)]
        for server in self.sockets:  # closed on exit before NATS is drained
            self.skeleton.on_exit(server.stop)

    def _topology(self, vendor: str, card: str) -> CardTopology:
        entry = self.vendors.get(vendor)
        return card_topology(entry, card, self.settings.host_root) if entry else CardTopology()

    # --- the kubelet (kubelet.Driver) -------------------------------------------------

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        assert self.claims is not None, "claims are read only once the API client is up"
        return await self.claims.get_claim(namespace, name)

    async def prepare(self, refs: list[ClaimRef]) -> dict[str, PreparedClaim | str]:
        started, shared = time.perf_counter(), self.shared_cards()
        results, read_s = await self.preparer.prepare_timed(refs)
        results = await answered_with_daemon(self.mps, self.preparer, self.settings.mps_profiles, results)
        total_s = time.perf_counter() - started
        self.metrics.observe("prepare", results.values(), total_s)
        if read_s is not None:  # a call that prepared something new (not an answer from memory)
            self.metrics.observe_prepare(read_s, total_s)
        if self.shared_cards() != shared:
            self.cards_changed.set()
        return results

    async def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]:
        started, shared = time.perf_counter(), self.shared_cards()
        results = await self.preparer.unprepare(refs)
        if self.mps.needed and not self.capped():
            await self.mps.ensure(False)  # the last capped share is gone
        self.metrics.observe("unprepare", results.values(), time.perf_counter() - started)
        if self.shared_cards() != shared:
            self.cards_changed.set()
        return results

    def capped(self) -> frozenset[str]:
        """Cards with prepared shares whose caps need the MPS control daemon."""
        return self.preparer.capped_cards(self.settings.mps_profiles)

    def shared_cards(self) -> frozenset[str]:
        """Cards with shares prepared here: not lent to spot claims while they are shared."""
        return self.preparer.shared_cards()

    def device_states(self) -> dict[str, bool]:
        """Every device's health: a card's (its vendor plugin's), its slots' the same, its spot
        mirror healthy while the card is and the solver lends it (taken back by its owner: not)."""
        lendable = lendable_cards(self.inventory.cards, self.spot_health)
        states = {name: healthy for c in self.inventory.cards
                  for name, healthy in ((c.name, c.healthy), (c.spot_name, c.id in lendable))}
        states.update({name: card.healthy for name, (card, _, _) in
                       self.inventory.slots(self.settings.slot_kinds).items()})
        return states

    def device_health(self) -> tuple[int, list[tuple[str, str, bool]]]:
        return self.board.version, [(self.pool, name, healthy) for name, healthy in self.device_states().items()]

    async def health_changed(self, version: int, within_s: float) -> None:
        await self.board.wait_newer(version, within_s)

    def registration(self, registered: bool, error: str) -> None:
        self.registered = "" if registered else (error or "refused")
        log.info("kubelet registration", node=self.node, registered=registered, error=error or None)
        self.health.set("kubelet", registered, error)

    # --- start ------------------------------------------------------------------------

    async def start(self) -> None:
        leaks, rewritten = self.preparer.recover()
        log.info("prepared claims restored", node=self.node, claims=len(self.preparer.state.claims),
                 leaks_removed=len(leaks), specs_rewritten=len(rewritten))
        if self.capped():  # shares prepared before a restart: their daemon first
            with contextlib.suppress(DaemonError):  # else the supervisor tries again
                await self.mps.ensure(True)
        self.skeleton.spawn("mps", self.mps.supervise(self.settings.poll_s))
        for server in self.sockets:
            await server.start()
        await kubelet.dial(self.settings.registration_socket)
        self.skeleton.spawn("sockets", self._keep_sockets())
        for vendor, socket in self.settings.vendor_sockets.items():
            self.skeleton.spawn(f"vendor {vendor}", self._follow_vendor(vendor, socket))
        self.skeleton.spawn("kubernetes", self._kube())
        self.skeleton.spawn("nats", self._nats(), critical=False)

    async def _kube(self) -> None:
        kube = kube_adapter.connect(self.common.kube)
        self.skeleton.on_exit(kube.close)
        self.claims, self.slices = kube_adapter.Claims(kube), kube_adapter.Slices(kube, self.node, self.settings.driver)
        teller = HealthTeller(self.node, self.board, lambda: self.preparer.state.claims.values(), self.device_states,
                              self.get_claim, kube_adapter.Events(kube))
        self.skeleton.spawn("health events", teller.run(self.settings.resync_s), critical=False)
        await self._publish_loop(kube_adapter.PublishError)

    async def _keep_sockets(self) -> None:
        """Serve again a socket that vanished (a kubelet that wiped its directories)."""
        while True:
            await asyncio.sleep(self.settings.poll_s)
            for server in self.sockets:
                if server.lost():
                    log.warning("socket vanished; serving it again", node=self.node, socket=server.path)
                    await server.start()

    async def _follow_vendor(self, vendor: str, socket: str) -> None:
        async for cards in watch_vendor(vendor, self.settings.vendor_socket(socket), self.stopping,
                                        self.settings.backoff_min_s, self.settings.backoff_max_s):
            if self.inventory.update(vendor, cards):
                self.cards_changed.set()
                self.board.bump()
                log.info("cards changed", node=self.node, vendor=vendor,
                         cards=",".join(c.id for c in self.inventory.cards if c.vendor == vendor))
            await self._publish_inventory()

    # --- the slice --------------------------------------------------------------------

    def desired_slices(self) -> list[dict[str, Any]]:
        lendable = lendable_cards(self.inventory.cards, self.spot_health) - self.shared_cards() \
            if self.settings.spot else set()
        return build_slices(self.node, self.settings.driver, self.inventory.cards, self.settings.shares,
                            lendable, self.generation, self.settings.slot_kinds)

    async def _publish_loop(self, failure: type[Exception]) -> None:
        """The slice again on every change of the cards, every ``resync_s``, and after a failure
        with backoff, until the driver stops."""
        backoff = Backoff(self.settings.backoff_min_s, self.settings.backoff_max_s)
        async for publication in Supervised("publish the slice", self.stopping, backoff, wake=self.cards_changed,
                                            every_s=self.settings.resync_s, node=self.node):  # fmt: skip
            try:
                await self.publish_slice(force=self.published is None)
            except failure as err:
                self.health.set("slice", False, str(err))
                publication.failed(err)
            else:
                publication.progress()
                await self._publish_inventory()  # the cards shared now, for the solver (and every resync)

    async def publish_slice(self, force: bool = False) -> bool:
        """Write the pool's slices when their content changed; True when it did."""
        bodies = self.desired_slices()
        content = [{k: v for k, v in b["spec"].items() if k != "pool"} for b in bodies]
        if not force and self.published is not None and content == self.published:
            return False
        self.generation += 1
        for body in bodies:
            body["spec"]["pool"]["generation"] = self.generation
        started = time.perf_counter()
        await self.slices.publish_all(bodies)
        self.published = content
        self.metrics.slices.inc()
        self.metrics.publish_seconds.observe(time.perf_counter() - started)
        self.health.set("slice", True)
        log.info("slice published", node=self.node, generation=self.generation, slices=len(bodies),
                 devices=sum(len(c.get("devices", [])) for c in content))
        return True

    # --- NATS: desired spot health in, inventory out -----------------------------------

    async def _nats(self) -> None:
        await self.bus.connect(self.stopping)
        await self.bus.wait_for_stream(self.stopping)
        await self.bus.subscribe(self.bus.subjects.health(self.node, SPOT_TOKEN), self._on_event)
        await self._load_health()
        await self._publish_inventory(resend=True)
        while True:  # the bucket again after every reconnect, and every resync_s as a safety net
            seen = self.bus.reconnects
            deadline = time.monotonic() + self.settings.resync_s
            while self.bus.reconnects == seen and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            with contextlib.suppress(BusError):
                await self._load_health()
                await self._publish_inventory(resend=True)

    async def _load_health(self) -> None:
        store = await self.bus.store("health", self.bus.layout.scope(self.node, "health"))
        try:
            saved = await store.get(SPOT_TOKEN, events.DeviceHealth)
        except Permanent as err:
            log.warning("undecodable desired health skipped", node=self.node, reason=err.reason)
            return
        if saved is not None:
            await self._on_event(saved)

    async def _on_event(self, event: events.AnyEvent) -> None:
        if not isinstance(event, events.DeviceHealth) or event.resource != SPOT_TOKEN:
            return
        if event.ts < self._health_ts:
            return
        self._health_ts = event.ts
        lendable = lendable_cards(self.inventory.cards, self.spot_health)
        self.spot_health = dict(event.devices) if event.full else {**self.spot_health, **event.devices}
        self.cards_changed.set()
        if lendable_cards(self.inventory.cards, self.spot_health) != lendable:
            self.board.bump()  # the spot devices' health in the kubelet's stream

    async def _publish_inventory(self, resend: bool = False) -> None:
        if not self.settings.publish_inventory or not self.bus.is_connected:
            return
        changed = self.inventory.events(self.shared_cards())
        for event in self.inventory.current() if resend else changed:
            try:
                await self.bus.publish_reliably(self.bus.subjects.event(self.node, "inventory"), event,
                                                self.stopping, deadline_s=5)
            except BusError as err:
                log.warning("card inventory not published", node=self.node, error=str(err))

    # --- stop and views ---------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "node": self.node, "driver": self.settings.driver,
            "registration": {"socket": self.settings.registration_socket,
                             "registered": self.health.report()["components"]["kubelet"]["ready"],
                             "error": self.registered},
            "cards": [{"id": c.id, "device": c.name, "vendor": c.vendor, "index": c.index, "healthy": c.healthy,
                       "pcie_root": c.topology.pcie_root, "numa_node": c.numa_node} for c in self.inventory.cards],
            "lendable": sorted(lendable_cards(self.inventory.cards, self.spot_health)),
            "slice_generation": self.generation,
            "prepared": self.preparer.status(),
            "mps_daemon": self.mps.status(),
            "shares_per_card": self.settings.shares, "device_classes": list(dra.DEVICE_CLASSES),
        }

"""The cluster the browser tests look at, and what is true in it, read apart from the console.

:func:`populate` makes, on one node with five fake cards: card 4 unhealthy (its vendor plugin
says so), a reserved pod (``busy``) on one card, three SharePods of ``share-gpu-2`` (so two
ShadowPods, shared by two and by one), and a lendable dev machine whose owner goes away and
whose card is then lent to a spot pod (``borrower``).

:func:`expected_cards` says what each card should show from the node simulator's own device
table (the kubelet stand-in's record of which container got which card and spot device) and
the SharePods' ``device-owner`` annotations in the API: not from the state the console reads.

:func:`populate_dra` adds a DRA node (for the tests that ask for it): two claims of 25 shares,
then a spot claim; :func:`expected_dra` reads each of its cards' claims and spot mirror from
the API's ResourceClaims and the driver's ResourceSlice.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare_common import dra
from gpushare_common.adapters.kube import resource_path
from gpushare_common.pods import SYSTEM_NAMESPACE
from gpushare_sim.scenarios import dra as dra_scenario
from gpushare_sim.scenarios.kit import GPU, LIST_DEVICES, Scenario, container, pod_body, wait_until
from gpushare_sim.scenarios.spot import LENDABLE, OWNER_LOOP, SPOT, lend, pinned

from tests.console.cdp import Browser

GPUS = 5
UNHEALTHY_INDEX = 4
SHARE = "share-gpu-2"
SHARE_PODS = ("share-1", "share-2", "share-3")
DEVICE_OWNER = "gpushare.k8s.io/device-owner"
QUARTERS = ("quarter-1", "quarter-2")  # a claim of 25 shares each
DRA_BORROWER = "dra-borrower"  # a spot claim
SLEEP = ["sleep", "3600"]
Obj = dict[str, Any]


@dataclass
class Scene:
    s: Scenario
    browser: Browser
    node: str
    report_dir: Path  # the dev machine's workload reports (its "go" file makes it call the GPU)

    @property
    def url(self) -> str:
        return self.s.cluster.console_url

    async def page(self, expression: str, timeout: float, what: str) -> Any:
        """Wait (in a thread: the loop keeps following the stream) until the page shows it."""
        return await asyncio.to_thread(self.browser.wait_for, expression, timeout, what)

    async def open(self, view: str, page: str) -> None:
        await asyncio.to_thread(self.browser.navigate, f"{self.url}#{view}")
        await self.page(f"document.body.dataset.page === '{page}'", 30, f"the {page} view")

    async def shot(self, directory: Path, name: str) -> Path:
        path = await asyncio.to_thread(self.browser.screenshot, directory / f"{name}.png")
        print(f"screenshot of the {name} page: {path}")
        return path


async def populate(s: Scenario, browser: Browser) -> Scene:
    node = s.cluster.nodes[0].name
    await _card_unhealthy(s, node, UNHEALTHY_INDEX)
    owner = pod_body("devmachine", [container("main", ["sh", "-c", OWNER_LOOP], {GPU: "1"})], labels=LENDABLE)
    await s.create(pinned(owner, node))
    await s.create(pinned(pod_body("busy", [container("main", LIST_DEVICES, {GPU: "1"})]), node))
    for name in SHARE_PODS:
        await s.create(pod_body(name, [container("main", LIST_DEVICES, {f"gpushare/{SHARE}": "1"})]))
    card = (await s.devices_seen("devmachine", timeout=90))[0]
    for name in ("busy", *SHARE_PODS):
        await s.devices_seen(name, timeout=90)
    await lend(s, node, card, "borrower")
    pod = await s.wait_running("devmachine")
    return Scene(s, browser, node, s.node_dir(pod) / "util" / s.namespace / "devmachine" / "main")


async def _card_unhealthy(s: Scenario, node: str, index: int) -> None:
    """The vendor plugin reports card ``index`` Unhealthy; wait until the Node shows one card less."""
    url = f"{s.cluster.child(f'node@{node}').http}/gpus/{index}/health?healthy=false"
    await asyncio.to_thread(_post, url)

    async def fewer() -> bool:
        doc = await s.kube.get_node(node)
        return int((doc.get("status") or {}).get("allocatable", {}).get(GPU, "0")) == GPUS - 1

    await wait_until(fewer, 60, f"{node} allocating {GPUS - 1} cards", s.cluster)


def _post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10):
        pass


def _get(url: str) -> Obj:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return dict(json.load(reply))


def device_table(s: Scenario, node: str) -> Obj:
    """The kubelet stand-in's device table: resources (id -> health) and allocations."""
    return dict(_get(f"{s.cluster.child(f'node@{node}').http}/status")["devices"])


async def expected_cards(s: Scenario, node: str) -> list[Obj]:
    """What each real card of ``node`` should show: state, holder, sharers, borrower."""
    table = await asyncio.to_thread(device_table, s, node)
    holders: dict[str, str] = {}
    borrowers: dict[str, str] = {}
    for held in table["allocations"]:
        pod = f"{held['namespace']}/{held['pod']}"
        holders.update(dict.fromkeys(held["devices"].get(GPU, []), pod))
        borrowers.update({d.removeprefix("spot-"): pod for d in held["devices"].get(SPOT, [])})
    pods, _ = await s.kube.list_pods()
    sharers: dict[str, list[str]] = {}
    for pod in pods:
        owner = (pod["metadata"].get("annotations") or {}).get(DEVICE_OWNER)
        if owner and not pod["metadata"].get("deletionTimestamp"):
            sharers.setdefault(owner, []).append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
    return [_expected(card, health, holders.get(card, ""), sharers, borrowers.get(card, ""))
            for card, health in table["resources"][GPU].items()]  # fmt: skip


def _expected(card: str, health: str, holder: str, sharers: dict[str, list[str]], borrower: str) -> Obj:
    shadow = holder.startswith(f"{SYSTEM_NAMESPACE}/")
    state = "unhealthy" if health != "Healthy" else "lent" if borrower else "shared" if shadow \
        else "held" if holder else "idle"
    return {"card": card, "state": state, "holder": holder,
            "sharers": ",".join(sorted(sharers.get(holder, []))) if shadow else "", "borrower": borrower}


def cards_in_page(selector: str) -> str:
    """JavaScript: the cards the page shows (its data attributes), as the expectation lists them."""
    return (f"[...document.querySelectorAll({json.dumps(selector)})].map(e => ({{card: e.dataset.card, "
            "state: e.dataset.state, holder: e.dataset.holder || '', borrower: e.dataset.borrower || '', "
            "sharers: (e.dataset.sharers || '').split(',').filter(Boolean).sort().join(',')}))")  # fmt: skip


async def populate_dra(s: Scenario) -> str:
    """A DRA node joins: two claims of 25 shares on one card, then (once the driver withdrew that
    card's spot mirror) a spot claim borrowing an idle card. The DRA node's name."""
    node = (await s.cluster.add_node(dra=True)).name
    await dra_scenario.install_classes(s)
    await dra_scenario.template(s, "quarter", dra_scenario.QUARTER)
    await dra_scenario.template(s, "spot", dra_scenario.SPOT)
    for name in QUARTERS:
        await s.create(dra_scenario.claim_pod(name, "quarter", node, SLEEP))
    for name in QUARTERS:
        await s.wait_running(name, 90)

    async def withdrawn() -> bool:
        cards = await expected_dra(s, node)
        return any(c["claims"] and c["spot"] == "Unhealthy" for c in cards.values())

    await wait_until(withdrawn, 30, "the shared card's spot mirror out of the slice", s.cluster)
    await s.create(dra_scenario.claim_pod(DRA_BORROWER, "spot", node, SLEEP))
    await s.wait_running(DRA_BORROWER, 90)
    return node


async def expected_dra(s: Scenario, node: str) -> dict[str, Obj]:
    """Each card of the DRA node, from the API: its state, its share and exclusive claims
    ([claim, shares, pods]), its spot mirror (Healthy: offered, lent: a spot claim holds it,
    Unhealthy: not offered) and its borrower."""
    devices = await dra_scenario.slice_devices(s, node)
    card_of = {d["name"]: d["attributes"][dra.ATTR_UUID]["string"] for d in devices}
    offered = {card_of[d["name"]] for d in devices if d["attributes"][dra.ATTR_KIND]["string"] == dra.KIND_SPOT}
    cards: dict[str, Obj] = {card_of[d["name"]]: {"claims": [], "spot": "Unhealthy", "borrower": ""} for d in devices
                             if d["attributes"][dra.ATTR_KIND]["string"] == dra.KIND_CARD}  # fmt: skip
    for card in offered:
        cards[card]["spot"] = "Healthy"
    claims, _ = await s.kube.list_objects(resource_path("resourceclaims", s.namespace))
    for claim in claims:
        status = claim.get("status") or {}
        pods = ",".join(sorted(f"{s.namespace}/{r['name']}" for r in status.get("reservedFor") or []))
        for result in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
            device = result["device"]
            if result["pool"] != node:
                continue
            if device.startswith(dra.SPOT_DEVICE_PREFIX):
                card = card_of.get(device) or card_of[device.removeprefix(dra.SPOT_DEVICE_PREFIX)]
                cards[card].update(spot="lent", borrower=pods)
                continue
            shares = int((result.get("consumedCapacity") or {}).get(dra.SHARES, 0))
            cards[card_of[device]]["claims"].append([f"{s.namespace}/{claim['metadata']['name']}", shares, pods])
    for card in cards.values():
        card["claims"].sort()
        card["state"] = "lent" if card["borrower"] else "shared" if card["claims"] else "idle"
    return cards


DRA_IN_PAGE = ("Object.fromEntries([...document.querySelectorAll('.card-panel')].map(e => [e.dataset.card, {"
               "state: e.dataset.state, spot: e.dataset.spot || '', borrower: e.dataset.borrower || '', "
               "claims: [...e.querySelectorAll('li.claim')].filter(c => c.dataset.role !== 'spot')"
               ".map(c => [c.dataset.claim, Number(c.dataset.shares), c.dataset.pods]).sort()}]))")
"""JavaScript: the DRA node page's cards as :func:`expected_dra` lists them."""

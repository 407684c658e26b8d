"""The console in a real headless Chromium against a running local cluster.

Each page is loaded, what it shows is read from the DOM and compared with the cluster (the
kubelet stand-in's device table, the API's pods, the eviction records on the stream), a change
must reach an open page within 1 s, and each page is saved as a screenshot in the test's own
directory (the path is printed; ``pytest -s`` shows it).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from gpushare_common import events
from gpushare_common.adapters.kube import NotFound
from gpushare_common.pods import SYSTEM_NAMESPACE
from gpushare_sim.scenarios.kit import container, pod_body, wait_until
from gpushare_sim.scenarios.spot import owner_back
from prometheus_client.parser import text_string_to_metric_families

from tests.console.scene import DRA_BORROWER, DRA_IN_PAGE, QUARTERS, Scene, cards_in_page, expected_cards, expected_dra

pytestmark = [pytest.mark.slow, pytest.mark.containerd, pytest.mark.asyncio(loop_scope="module")]
LIVE_S = 1.0


async def _cards_match(scene: Scene, selector: str) -> list[dict[str, str]]:
    """Wait until the page's cards equal the cluster's (the solver takes a moment); the cards."""
    expression = cards_in_page(selector)
    expected: list[dict[str, str]] = []

    async def same() -> bool:
        nonlocal expected
        expected = await expected_cards(scene.s, scene.node)
        shown = await scene.page(expression, 10, "cards")
        return bool(shown == expected)

    try:
        await wait_until(same, 30, "the page's cards to match the cluster", scene.s.cluster, interval=0.2)
    except TimeoutError:
        shown = scene.browser.evaluate(expression)
        pytest.fail(f"cards shown:\n{json.dumps(shown, indent=1)}\nexpected:\n{json.dumps(expected, indent=1)}")
    return expected


async def test_fleet_shows_every_card_as_the_cluster_has_it(scene: Scene, tmp_path: Path) -> None:
    await scene.open("/", "fleet")
    cards = await _cards_match(scene, f'.node-row[data-node="{scene.node}"] .card')
    assert sorted(c["state"] for c in cards) == ["held", "lent", "shared", "shared", "unhealthy"]
    counts = await scene.page("document.getElementById('totals').textContent", 5, "the totals")
    assert "1 held · 2 shared · 1 lent · 0 idle · 1 unhealthy" in counts
    await scene.shot(tmp_path, "fleet")


async def test_node_page_shows_cards_sharers_borrowers_and_pods(scene: Scene, tmp_path: Path) -> None:
    await scene.open(f"/node/{scene.node}", "node")
    cards = await _cards_match(scene, ".card-panel")
    listed = await scene.page("[...document.querySelectorAll('li.sharer')].map(e => e.dataset.pod).sort()", 5,
                              "the SharePods")  # fmt: skip
    assert listed == sorted(p for c in cards for p in c["sharers"].split(",") if p)
    assert len(listed) == 3
    borrower = await scene.page("document.querySelector('li.borrower')?.dataset.pod", 5, "the borrower")
    assert borrower == f"{scene.s.namespace}/borrower"
    counted = ("[...document.querySelectorAll('li.sharer, li.borrower')].every(e => "
               "/^[0-9]+$/.test(e.querySelector('.activity')?.dataset.calls ?? ''))")
    assert await scene.page(counted, 20, "every SharePod's and the borrower's GPU calls, counted by the kernel")
    roles = await scene.page("[...document.querySelectorAll('li .activity')].map(e => e.dataset.role).sort()", 5,
                             "the roles")  # fmt: skip
    assert roles.count("sharer") == 3 and roles.count("borrower") == 1 and "owner" in roles
    pods, _ = await scene.s.kube.list_pods(field_selector=f"spec.nodeName={scene.node}")
    on_node = sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods)
    shown = await scene.page("[...document.querySelectorAll('tr.pod')].map(e => e.dataset.pod).sort()", 5, "pods")
    assert shown == on_node
    await scene.shot(tmp_path, "node")


def _detector_utilisation(url: str) -> dict[str, float]:
    """Each card's utilisation as the detector exports it (its last scrape of the exporter)."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {s.labels["card"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "gpushare_gpu_utilisation_percent"}  # fmt: skip


async def test_the_fleet_shows_each_cards_utilisation_as_the_detector_scraped_it(scene: Scene, tmp_path: Path) -> None:
    """A workload reports 42 % on card 3 to the fake exporter; each card's figure on the page is the
    one the detector scraped (its own metrics say which)."""
    busy = scene.report_dir.parents[2] / scene.s.namespace / "util-probe" / "main" / "nvidia3.json"
    busy.parent.mkdir(parents=True, exist_ok=True)
    busy.write_text(json.dumps({"dev": "nvidia3", "util": 42, "ts": time.time(), "every_ms": 60_000}))
    await scene.open("/", "fleet")
    url = f"{scene.s.cluster.service('detector', scene.node).http}/metrics"
    shown_js = (f"Object.fromEntries([...document.querySelectorAll('.node-row[data-node=\"{scene.node}\"] .card')]"
                ".filter(e => e.dataset.card).map(e => [e.dataset.card, e.dataset.util ?? null]))")
    seen: dict[str, Any] = {}

    async def same() -> bool:
        scraped = await asyncio.to_thread(_detector_utilisation, url)
        seen.update(shown=await scene.page(shown_js, 10, "the cards"), scraped=scraped)
        return max(scraped.values(), default=0) >= 42 and \
            seen["shown"] == {c: str(round(scraped[c])) for c in seen["shown"] if c in scraped}

    try:
        await wait_until(same, 30, "each card's utilisation as the detector's", scene.s.cluster, interval=0.2)
    except TimeoutError:
        pytest.fail(f"the page and the detector disagree: {json.dumps(seen, indent=1)}")
    finally:
        busy.unlink()
    assert len(seen["shown"]) >= 4 and max(map(int, seen["shown"].values())) >= 42, seen
    await scene.shot(tmp_path, "fleet-utilisation")


async def test_a_change_reaches_the_open_page_within_a_second(scene: Scene, tmp_path: Path) -> None:
    await scene.open(f"/node/{scene.node}", "node")
    await scene.page("document.getElementById('live').dataset.state === 'live'", 10, "the live stream")
    body = pod_body("arrives-live", [container("main", ["sleep", "3600"])])
    body["spec"]["nodeName"] = scene.node
    started = time.monotonic()
    await scene.s.create(body)
    await scene.page(f"!!document.querySelector('tr.pod[data-pod=\"{scene.s.namespace}/arrives-live\"]')",
                     5, "the new pod")  # fmt: skip
    elapsed = time.monotonic() - started
    print(f"pod created -> shown on the open node page: {elapsed * 1000:.0f} ms")
    assert elapsed < LIVE_S, f"the new pod took {elapsed:.2f}s to appear (more than {LIVE_S}s)"
    await scene.shot(tmp_path, "node-live")


async def test_the_fleet_shows_each_nodes_gpushare_pods_with_their_readiness(scene: Scene, tmp_path: Path) -> None:
    """The local cluster runs its services as processes: a pod labelled as the detector stands in
    for the chart's DaemonSet pod; its Ready condition (the kubelet's) is what the page shows."""
    name, labels = "gpushare-detector-probe", {"app.kubernetes.io/part-of": "gpushare",
                                               "app.kubernetes.io/name": "gpushare-detector"}
    body = pod_body(name, [container("main", ["sleep", "3600"])], labels=labels)
    body["spec"]["nodeName"] = scene.node
    await scene.open("/", "fleet")
    await scene.s.kube.create_pod(SYSTEM_NAMESPACE, body)
    try:
        shown = f'.node-row[data-node="{scene.node}"] .svc[data-service="detector"]'
        assert await scene.page(f"document.querySelector('{shown}')?.dataset.ready === 'true'", 60,
                                "the detector's pod ready")  # fmt: skip
        await scene.shot(tmp_path, "fleet-services")
    finally:
        await scene.s.delete(name, SYSTEM_NAMESPACE)

        async def gone() -> bool:
            try:
                await scene.s.kube.get_pod(SYSTEM_NAMESPACE, name)
            except NotFound:
                return True
            return False

        await wait_until(gone, 60, f"{SYSTEM_NAMESPACE}/{name} gone", scene.s.cluster)


async def test_evictions_show_the_owner_back_with_its_hops(scene: Scene, tmp_path: Path) -> None:
    await scene.open("/evictions", "evictions")
    trial = await owner_back(scene.s, scene.report_dir, "borrower")
    record = next(r for r in scene.s.evictions if r.pod == f"{scene.s.namespace}/borrower")
    entry = f'article.entry[data-trigger="{record.trigger_id}"]'
    row = await scene.page(f"(e => e && [e.dataset.reason, e.dataset.outcome])(document.querySelector("
                           f"'{entry} tr.eviction[data-pod=\"{record.pod}\"]'))", 10, "the eviction")  # fmt: skip
    assert row == ["owner-back", "evicted"]
    hops = await scene.page(f"Object.fromEntries([...document.querySelectorAll('{entry} g.hop')]"
                            ".map(g => [g.dataset.hop, Number(g.dataset.ms)]))", 5, "the hops")  # fmt: skip
    assert hops["evicted"] - hops["handled"] == pytest.approx(record.total_ms, abs=0.01)
    assert hops["released"] - hops["handled"] == pytest.approx(record.released_ms, abs=0.01)
    assert hops["tasks_dead"] - hops["handled"] == pytest.approx(record.tasks_dead_ms, abs=0.01)
    notice = _owner_back_of(scene, record.trigger_id)
    assert notice is not None, "the eviction's trigger should be the kernel's owner-back event"
    assert hops["notice"] == 0 and hops["published"] == pytest.approx(notice.notice_to_publish_ms, abs=0.01)
    assert trial.owner_returned > 0
    await scene.shot(tmp_path, "evictions")


def _owner_back_of(scene: Scene, trigger: str) -> events.OwnerBackEvent | None:
    return next((e for e in scene.s.owner_backs if e.id == trigger), None)


async def test_a_dra_nodes_cards_show_their_claims_shares_spot_mirror_and_borrower(scene: Scene, dra_node: str,
                                                                                   tmp_path: Path) -> None:
    """Two claims of 25 shares on one card and a spot claim on another, on a DRA node: the page
    shows the claims with their shares and pods, the spot mirrors as the ResourceSlice offers them
    and the borrower, as the API has them."""
    await scene.open(f"/node/{dra_node}", "node")
    expected: dict[str, Any] = {}

    async def same() -> bool:
        nonlocal expected
        expected = await expected_dra(scene.s, dra_node)
        return bool(await scene.page(DRA_IN_PAGE, 10, "the DRA cards") == expected)

    try:
        await wait_until(same, 30, "the DRA cards to match the API", scene.s.cluster, interval=0.2)
    except TimeoutError:
        shown = scene.browser.evaluate(DRA_IN_PAGE)
        pytest.fail(f"cards shown:\n{json.dumps(shown, indent=1)}\nexpected:\n{json.dumps(expected, indent=1)}")
    cards = await expected_dra(scene.s, dra_node)
    (shared,) = [c for c in cards.values() if c["claims"]]
    ns = scene.s.namespace
    assert [(shares, pods) for _, shares, pods in shared["claims"]] == [(25, f"{ns}/{q}") for q in QUARTERS]
    assert (shared["state"], shared["spot"]) == ("shared", "Unhealthy")
    (lent,) = [c for c in cards.values() if c["spot"] == "lent"]
    assert (lent["state"], lent["borrower"]) == ("lent", f"{ns}/{DRA_BORROWER}")
    assert any(c["spot"] == "Healthy" for c in cards.values()), "an idle card's spot mirror is offered"
    roles = await scene.page("Object.fromEntries([...document.querySelectorAll('tr.pod')]"
                             ".map(e => [e.dataset.pod, e.dataset.claims]))", 5, "the pods' claims")  # fmt: skip
    assert [roles[f"{ns}/{p}"] for p in (*QUARTERS, DRA_BORROWER)] == ["share", "share", "spot"]
    await scene.shot(tmp_path, "dra-node")

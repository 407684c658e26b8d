"""cardmap: every card of a node with its users and state, from the solver's state."""

from __future__ import annotations

import msgspec
from gpushare_common.cardmap import CARD_STATES, CardFacts, card_map, card_order
from gpushare_common.mapping import IDLE_SPACE, RESERVED, SHADOW, SPOT_OWNER, MappingCache
from gpushare_solver.journal import JournalDoc
from hypothesis import given
from hypothesis import strategies as st

CARDS = ["GPU-0", "GPU-1", "GPU-2", "GPU-3", "GPU-4", "GPU-10"]


def _cache() -> MappingCache:
    cache = MappingCache()
    cache.create("ml/busy", ["GPU-0"], kind=RESERVED)
    cache.create("ml/dev", ["GPU-1"], kind=SPOT_OWNER)
    cache.create("gpushare-system/shadow-a", ["gpushare-system/shadow-a-0", "gpushare-system/shadow-a-1"],
                 kind=SHADOW, resource="share-gpu-2")
    cache.use("gpushare-system/shadow-a", "ml/share-1", "gpushare-system/shadow-a-0")
    cache.use("gpushare-system/shadow-a", "ml/share-2", "gpushare-system/shadow-a-1")
    cache.create(IDLE_SPACE, ["spot-GPU-1", "spot-GPU-3"], kind=IDLE_SPACE)
    cache.use(IDLE_SPACE, "ml/borrower", "spot-GPU-1")
    return cache


def test_each_card_gets_its_holder_sharers_borrower_and_state() -> None:
    inventory = {"nvidia.com/gpu": ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]}
    cards = card_map(_cache(), inventory, {"gpushare-system/shadow-a": ["GPU-2"]},
                     {"spot-GPU-1": "Healthy", "spot-GPU-4": "Unhealthy"})
    seen = {c.card: (c.state, c.holder, c.sharers, c.borrower) for c in cards}
    assert seen == {
        "GPU-0": ("held", "ml/busy", (), ""),
        "GPU-1": ("lent", "ml/dev", (), "ml/borrower"),
        "GPU-2": ("shared", "gpushare-system/shadow-a", ("ml/share-1", "ml/share-2"), ""),
        "GPU-3": ("idle", "", (), ""),
        "GPU-4": ("unhealthy", "", (), ""),
    }
    shared = next(c for c in cards if c.card == "GPU-2")
    assert shared.share_devices == 2
    assert shared.users() == [("gpushare-system/shadow-a", "owner"), ("ml/share-1", "sharer"),
                              ("ml/share-2", "sharer")]


def test_an_away_owner_without_borrower_is_idle_and_no_inventory_means_none_unhealthy() -> None:
    cache = MappingCache()
    cache.create("ml/dev", ["GPU-1"], kind=SPOT_OWNER)
    cards = card_map(cache, {}, {}, {"spot-GPU-5": "Unhealthy"})
    assert [(c.card, c.state) for c in cards] == [("GPU-1", "idle"), ("GPU-5", "idle")]


def test_the_solver_journal_reads_as_card_facts() -> None:
    doc = JournalDoc(seen=["x"], inventory={"nvidia.com/gpu": ["GPU-0"]}, shadow_cards={"s/a": ["GPU-1"]},
                     dra_shared={"gpushare.k8s.io/nvidia.com/gpu": ["GPU-2"]})
    facts = msgspec.json.decode(msgspec.json.encode(doc), type=CardFacts)
    assert facts.inventory == doc.inventory and facts.shadow_cards == doc.shadow_cards
    assert facts.dra_shared == doc.dra_shared


@given(st.lists(st.sampled_from(CARDS), unique=True), st.lists(st.sampled_from(CARDS), unique=True))
def test_every_card_named_anywhere_is_listed_once_in_order(inventory: list[str], held: list[str]) -> None:
    cache = MappingCache()
    if held:
        cache.create("ml/busy", held, kind=RESERVED)
    cards = card_map(cache, {"nvidia.com/gpu": inventory}, {}, {})
    names = [c.card for c in cards]
    assert names == sorted(set(inventory) | set(held), key=card_order)
    assert all(c.state in CARD_STATES for c in cards)
    assert all(c.state == "unhealthy" for c in cards if inventory and c.card not in inventory)

"""The services' one transaction seam (:mod:`sidecar.service.records`) on every
real store: ``update`` loads, authorises, runs the step and writes (with its
mapper's upkeep) only a record that changed; a refused or failed step writes
nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.auth import Principal
from sidecar.core.chains import Chain
from sidecar.errors import Forbidden, NotFound
from sidecar.service import keys, records
from sidecar.service.mappers import STOPS, Chains
from sidecar.store import Store

pytestmark = pytest.mark.all_stores  # they face the store: every backend

NOW = 1_800_000_000.0
NS = "p"
ADMIN = Principal("admin", None, True)
OTHER = Principal("other", frozenset({"wf-b"}), False)
CHAINS = Chains(longest_chain_s=86_400)


def _chain(chain_id: str = "c1", workflow: str = "wf-a") -> Chain:
    return Chain(chain_id, workflow, 0, 1, 0, 0, NOW, NOW, NOW + 3600)


def _put(store: Store, chain: Chain) -> None:
    """Store a chain as a document only (no index upkeep)."""
    key = keys.chain(NS, chain.chain_id)
    records.run(store, [key], lambda txn: txn.put(key, chain.to_doc(), 3600), NOW)


def _recent(store: Store) -> list[str]:
    return [m for m, _ in store.index_page(keys.recent_chains(NS))]


def test_update_writes_a_changed_record_with_its_upkeep(store: Store) -> None:
    _put(store, _chain())
    drops = records.update(
        store,
        CHAINS,
        NS,
        "c1",
        ADMIN,
        lambda c, txn: (replace(c, drops=c.drops + 1, updated_at=txn.now), c.drops + 1),
        NOW + 5,
    )
    assert drops == 1
    assert CHAINS.decode(store.get(keys.chain(NS, "c1"))) == replace(
        _chain(), drops=1, updated_at=NOW + 5
    )
    assert _recent(store) == ["c1"]


def test_update_writes_nothing_when_the_step_changes_nothing(store: Store) -> None:
    _put(store, _chain())
    same = records.update(store, CHAINS, NS, "c1", ADMIN, lambda c, _txn: (c, "same"), NOW)
    none = records.update(store, CHAINS, NS, "c1", ADMIN, lambda c, _txn: (None, "none"), NOW)
    assert (same, none) == ("same", "none")
    assert _recent(store) == []  # no save, so no upkeep either


def test_update_of_an_absent_record_is_not_found_and_writes_nothing(store: Store) -> None:
    with pytest.raises(NotFound):
        records.update(store, CHAINS, NS, "c9", ADMIN, lambda c, _txn: (c, None), NOW)
    assert store.get(keys.chain(NS, "c9")) is None


def test_update_refuses_a_record_outside_the_scope_before_the_step(store: Store) -> None:
    _put(store, _chain())
    ran: list[bool] = []

    def step(c: Chain, _txn: records.Txn) -> tuple[Chain, None]:
        ran.append(True)
        return replace(c, drops=9), None

    with pytest.raises(Forbidden):
        records.update(store, CHAINS, NS, "c1", OTHER, step, NOW)
    assert ran == []
    assert CHAINS.decode(store.get(keys.chain(NS, "c1"))) == _chain()


def test_a_failing_step_writes_nothing_it_planned(store: Store) -> None:
    _put(store, _chain())
    stop_key = keys.chain_stop(NS, "c1")

    def step(txn: records.Txn) -> None:
        txn.save(CHAINS, NS, keys.chain(NS, "c1"), replace(_chain(), drops=3))
        txn.put(stop_key, {"at": NOW, "reason": "r", "actor": "a"})
        raise RuntimeError("the core refused")

    with pytest.raises(RuntimeError):
        records.run(store, [keys.chain(NS, "c1"), stop_key], step, NOW)
    assert CHAINS.decode(store.get(keys.chain(NS, "c1"))) == _chain()
    assert STOPS.decode(store.get(stop_key)) is None
    assert _recent(store) == []

"""A write the caller stopped waiting for never lands later: a store that
pauses (a stall, a stopped process) with a compare-and-set queued and runs
it after the decision was answered 503 writes nothing, because the write
carries a fence (the latest server time it may still apply at)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import PostgresServer, store_server_pids
from sidecar.errors import StoreUnavailable
from sidecar.store import Plan, Snapshot, Store, Write, store_from_url
from sidecar.store.base import FENCE_MARGIN_S, TxnFn, clock_offset, fence_margin
from sidecar.store.postgres import PostgresStore

pytestmark = pytest.mark.all_stores


def _reserve(key: str) -> TxnFn[str]:
    """Reserve ``key`` if absent (a first begin's shape)."""

    def fn(snap: Snapshot) -> Plan[str]:
        if snap.get(key) is None:
            return Plan("new", {key: Write({"n": 1})})
        return Plan("replay")

    return fn


def _open(store_url: str) -> Store:
    store = store_from_url(store_url, timeout_s=1.0)
    store.ensure_schema()
    return store


def test_a_guess_answered_503_while_the_store_paused_writes_nothing_later(
    store_url: str, request: pytest.FixtureRequest
) -> None:
    """The write of a decision on a guess (a first begin: the id is new) is
    sent before the store has answered anything; the store pauses past the
    decision's deadline with it queued, then runs it. The decision was a 503,
    so the write must not be there."""
    if store_url.startswith("sqlite"):
        pytest.skip("a SQLite file has no server to pause")
    store = _open(store_url)
    try:
        # Connections open, clocks compared, Redis's script loaded (else the
        # queued write would only have met NOSCRIPT).
        assert store.transact(["warm"], _reserve("warm"), absent_likely=True) == "new"
        pids = store_server_pids(store_url, request)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable):
                store.transact(["op"], _reserve("op"), absent_likely=True)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)  # the queued write, had it run, is in by now
        assert store.get("op") is None
        assert store.transact(["op"], _reserve("op"), absent_likely=True) == "new"
    finally:
        store.close()


def test_a_write_fenced_by_a_clock_compared_wrong_is_decided_again(store_url: str) -> None:
    """A fence that falls too early (the server's clock stepped back since
    the last comparison) refuses the write, which is then known unwritten:
    the store compares the clocks again and decides once more, in time; the
    caller never sees a 503 for it."""
    if store_url.startswith("sqlite"):
        pytest.skip("SQLite has no server clock")
    store = _open(store_url)
    try:
        assert store.transact(["warm"], _reserve("warm"), absent_likely=True) == "new"
        for key, guess in (("read", False), ("guessed", True)):
            clock = store.server_clock  # type: ignore[attr-defined]
            clock.offset_s = (clock.offset_s or 0.0) - 30
            assert store.transact([key], _reserve(key), absent_likely=guess) == "new"
            assert store.transact([key], _reserve(key), absent_likely=guess) == "replay"
            assert store.get(key) == {"n": 1}
    finally:
        store.close()


@pytest.mark.postgres
def test_serializable_transactions_are_fenced_too(postgres_server: PostgresServer) -> None:
    """Under ``?isolation=serializable`` the commit pipeline carries the fence
    as well: with the clocks held compared 30 s wrong, every write is refused
    until the deadline, and nothing is there."""
    postgres_server.reset()
    store = PostgresStore(postgres_server.url + "?isolation=serializable", timeout_s=1.0)
    store.ensure_schema()
    try:
        assert store.transact(["warm"], _reserve("warm")) == "new"
        assert store.server_clock.offset_s is not None  # compared, as in the default mode
        store.server_clock.offset_s -= 30
        store._compare_clocks = lambda conn: None  # type: ignore[method-assign]
        with pytest.raises(StoreUnavailable):
            store.transact(["op"], _reserve("op"))
        assert store.get("op") is None
    finally:
        store.close()


def test_a_clock_comparison_errs_early_and_sets_loose_readings_aside() -> None:
    """The offset is taken at the answer's arrival (the server read its clock
    before it), never overstated; a reading whose round trip outlasted the
    fence's margin is no reading at all."""
    assert clock_offset(1000.0, sent_s=10.0, answered_s=10.02) == pytest.approx(990.0 - 0.02)
    assert clock_offset(1000.0, sent_s=10.0, answered_s=10.0 + FENCE_MARGIN_S + 0.01) is None
    assert fence_margin(2.0) == FENCE_MARGIN_S
    assert fence_margin(0.2) == pytest.approx(0.05)

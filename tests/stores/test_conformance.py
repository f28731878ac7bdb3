"""One conformance suite over every store: each test runs on SQLite, a real Redis and
a real PostgreSQL; the tests named after one store check a mechanism only it has
(Redis's guesses and script retries, PostgreSQL's commit-time locks)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import PostgresServer, RedisServer
from sidecar.errors import ConfigError, SchemaMismatch, StoreUnavailable
from sidecar.store import (
    SCHEMES,
    Compactable,
    Increment,
    IndexEntry,
    Plan,
    Snapshot,
    Store,
    StoreEvents,
    Sweepable,
    Write,
    store_class,
    store_from_url,
)
from sidecar.store.base import SCHEMA_VERSION, Doc, T, TxnFn
from sidecar.store.postgres import LOCK_CLASS, PostgresStore
from sidecar.store.redis import RedisStore

pytestmark = pytest.mark.all_stores  # they face the store: every backend


def put(store: Store, key: str, doc: dict | None, ttl_s: float | None = None) -> None:
    store.transact([key], lambda snap: Plan(None, {key: Write(doc, ttl_s)}))


class Tally:
    """Counts what stores built with :attr:`events` report (the app's metrics count
    the same callbacks)."""

    def __init__(self) -> None:
        self.round_trips = 0
        self.conflicts = 0
        self.events = StoreEvents(round_trip=self._round_trip, conflict=self._conflict)

    def _round_trip(self) -> None:
        self.round_trips += 1

    def _conflict(self) -> None:
        self.conflicts += 1


def test_transaction_writes_and_reads_back(store: Store) -> None:
    put(store, "a", {"n": 1, "s": "é", "l": [1, 2.5, None, True]})
    assert store.get("a") == {"n": 1, "s": "é", "l": [1, 2.5, None, True]}
    assert store.get_many(["a", "missing"]) == {
        "a": {"n": 1, "s": "é", "l": [1, 2.5, None, True]},
        "missing": None,
    }


def test_delete(store: Store) -> None:
    put(store, "a", {"n": 1})
    put(store, "a", None)
    assert store.get("a") is None


def test_function_error_writes_nothing(store: Store) -> None:
    put(store, "a", {"n": 1})

    def boom(snap: Snapshot) -> Plan[None]:
        snap.get("a")
        raise ValueError("policy said no")

    with pytest.raises(ValueError):
        store.transact(["a"], boom)
    assert store.get("a") == {"n": 1}


def test_write_without_read_is_refused(store: Store) -> None:
    with pytest.raises(RuntimeError):
        store.transact(["a"], lambda snap: Plan(None, {"b": Write({"x": 1})}))
    assert store.get("b") is None


def test_lazy_read_inside_transaction(store: Store) -> None:
    put(store, "ptr", {"to": "target"})
    put(store, "target", {"v": 1})

    def follow(snap: Snapshot) -> Plan[int]:
        target = snap.get("ptr")["to"]  # type: ignore[index]
        doc = snap.get(target)
        assert doc is not None
        return Plan(doc["v"], {target: Write({"v": doc["v"] + 1})})

    assert store.transact(["ptr"], follow) == 1
    assert store.get("target") == {"v": 2}


def test_ttl_expires_document(store: Store) -> None:
    put(store, "short", {"x": 1}, ttl_s=0.05)
    put(store, "long", {"x": 1}, ttl_s=3600)
    import time

    time.sleep(0.15)  # real TTL: the store's own clock, not the policy's
    assert store.get("short") is None
    assert store.get("long") == {"x": 1}


def test_counter_is_atomic_across_threads(store: Store) -> None:
    """64 increments from 16 threads: no lost update."""

    def incr(_: int) -> None:
        def fn(snap: Snapshot) -> Plan[None]:
            doc = snap.get("counter") or {"n": 0}
            return Plan(None, {"counter": Write({"n": doc["n"] + 1})})

        store.transact(["counter"], fn)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(incr, range(64)))
    assert store.get("counter") == {"n": 64}


def test_increments_never_conflict_and_none_is_lost(store: Store) -> None:
    """200 increments of one key from 16 threads, each transaction also reading
    the key unchecked and writing a key of its own: no retry is needed for the
    shared key, and the count is exact."""
    put(store, "hits", {"count": 5, "note": "kept"})

    def hit(i: int) -> int:
        def fn(snap: Snapshot) -> Plan[int]:
            seen = (snap.get("hits") or {}).get("count", 0)
            plan = Plan(seen, {f"own:{i}": Write({"i": i})}, unchecked={"hits"})
            plan.increments["hits"] = Increment("count", 1, 3600)
            return plan

        return store.transact(["hits", f"own:{i}"], fn)

    with ThreadPoolExecutor(16) as pool:
        seen = list(pool.map(hit, range(200)))
    assert store.get("hits") == {"count": 205, "note": "kept"}
    assert min(seen) >= 5 and max(seen) <= 204


def test_increment_creates_the_document_with_its_ttl(store: Store) -> None:
    def fn(snap: Snapshot) -> Plan[None]:
        snap.get("mine")
        plan = Plan(None, {"mine": Write({"ok": True})})
        plan.increments["fresh"] = Increment("count", 3, 0.05)
        return plan

    store.transact(["mine"], fn)
    assert store.get("fresh") == {"count": 3}
    import time

    time.sleep(0.15)
    assert store.get("fresh") is None


def test_increment_alone_or_into_a_non_object_changes_nothing(store: Store) -> None:
    """A plan that only increments could not be recognized after a timed-out
    answer (it might apply twice): refused. An increment whose target is not
    a JSON object fails the commit before anything is written."""
    with pytest.raises(RuntimeError, match="also write"):
        store.transact([], lambda snap: Plan(None, increments={"n": Increment("count")}))
    assert store.get("n") is None

    put(store, "odd", [1, 2])  # type: ignore[arg-type]

    def fn(snap: Snapshot) -> Plan[None]:
        snap.get("mine")
        plan = Plan(None, {"mine": Write({"ok": True})})
        plan.increments["odd"] = Increment("count")
        return plan

    with pytest.raises((RuntimeError, StoreUnavailable), match="not a JSON object"):
        store.transact(["mine"], fn)
    assert store.get("mine") is None and store.get("odd") == [1, 2]


def test_unchecked_key_is_not_compared_but_cannot_be_written(store: Store) -> None:
    put(store, "seen", {"v": 1})
    calls = []

    def fn(snap: Snapshot) -> Plan[None]:
        calls.append(snap.get("seen"))
        # Changed between read and commit (Redis; SQLite holds its write lock
        # from the read, so nothing changes meanwhile there anyway).
        if len(calls) == 1 and store.backend == "redis":
            put(store, "seen", {"v": 2})
        return Plan(None, {"mine": Write({"ok": True})}, unchecked={"seen"})

    store.transact(["seen", "mine"], fn)
    assert len(calls) == 1 and store.get("mine") == {"ok": True}

    def writes_it(snap: Snapshot) -> Plan[None]:
        snap.get("seen")
        return Plan(None, {"seen": Write({"v": 3})}, unchecked={"seen"})

    before = store.get("seen")
    with pytest.raises(RuntimeError, match="unchecked"):
        store.transact(["seen"], writes_it)
    assert store.get("seen") == before


def test_race_exactly_one_reservation(store: Store) -> None:
    """32 threads reserve the same key at once: exactly one creates it."""
    barrier = threading.Barrier(32)

    def reserve(i: int) -> bool:
        barrier.wait()

        def fn(snap: Snapshot) -> Plan[bool]:
            if snap.get("op") is not None:
                return Plan(False)
            return Plan(True, {"op": Write({"owner": i})})

        return store.transact(["op"], fn)

    with ThreadPoolExecutor(32) as pool:
        wins = list(pool.map(reserve, range(32)))
    assert wins.count(True) == 1
    assert store.get("op") == {"owner": wins.index(True)}


def test_index_pages_in_order_with_cursor(store: Store) -> None:
    def fn(snap: Snapshot) -> Plan[None]:
        entries = [IndexEntry("ix", f"m{i:02d}", float(i // 2)) for i in range(10)]
        return Plan(None, {}, entries)

    store.transact([], fn)
    first = store.index_page("ix", limit=4)
    assert [m for m, _ in first] == ["m00", "m01", "m02", "m03"]
    second = store.index_page("ix", after=(first[-1][1], first[-1][0]), limit=4)
    assert [m for m, _ in second] == ["m04", "m05", "m06", "m07"]
    bounded = store.index_page("ix", min_score=1.0, max_score=2.0, limit=10)
    assert [m for m, _ in bounded] == ["m02", "m03", "m04", "m05"]
    store.transact([], lambda snap: Plan(None, {}, [IndexEntry("ix", "m03", None)]))
    assert "m03" not in [m for m, _ in store.index_page("ix", limit=20)]


def test_index_scores_keep_sub_millisecond_precision(store: Store) -> None:
    score = 1_790_000_000.123456
    store.transact([], lambda snap: Plan(None, {}, [IndexEntry("ix", "a", score)]))
    [(member, got)] = store.index_page("ix", limit=1)
    assert member == "a" and got == score
    assert store.index_page("ix", after=(got, member), limit=5) == []


def test_schema_version_stamped_and_newer_refused(store: Store) -> None:
    assert store._read_schema_version() == SCHEMA_VERSION
    store._write_schema_version(SCHEMA_VERSION + 1)
    with pytest.raises(SchemaMismatch):
        store.ensure_schema()


def test_older_schema_is_migrated_step_by_step(store: Store) -> None:
    ran: list[int] = []
    store._write_schema_version(1)
    found = store.ensure_schema(3, {1: lambda s: ran.append(1), 2: lambda s: ran.append(2)})
    assert found == 1 and ran == [1, 2] and store._read_schema_version() == 3


def test_missing_migration_step_refuses(store: Store) -> None:
    store._write_schema_version(1)
    with pytest.raises(SchemaMismatch):
        store.ensure_schema(2, {})


def test_ping_reports_backend(store: Store) -> None:
    facts = store.ping()
    assert facts["backend"] == store.backend
    assert isinstance(facts["warnings"], list)


def test_unknown_scheme_is_config_error() -> None:
    with pytest.raises(ConfigError):
        store_from_url("mongodb://localhost")
    with pytest.raises(ConfigError):
        store_from_url("sqlite:///x.db?bogus=1")


def test_every_registered_scheme_opens_a_store_class_that_names_it() -> None:
    """The registry maps each scheme to a class of the interface, and that class
    lists the scheme among its own (a scheme added in one place only is caught)."""
    classes = {store_class(scheme) for scheme in SCHEMES}
    assert {c.backend for c in classes} == {"sqlite", "redis", "postgresql"}
    for scheme in SCHEMES:
        cls = store_class(scheme)
        assert issubclass(cls, Store) and scheme in cls.schemes, scheme
    assert {s for c in classes for s in c.schemes} == set(SCHEMES)


def test_purge_finds_its_stores_by_capability(tmp_path: Path) -> None:
    """`loopstop purge` sweeps the stores that keep expired rows (SQLite, PostgreSQL)
    and vacuums SQLite's file; Redis is neither (it expires keys by itself)."""
    from sidecar.store.sqlite import SQLiteStore

    assert issubclass(SQLiteStore, Sweepable) and issubclass(SQLiteStore, Compactable)
    assert issubclass(PostgresStore, Sweepable) and not issubclass(PostgresStore, Compactable)
    assert not issubclass(RedisStore, Sweepable) and not issubclass(RedisStore, Compactable)
    sqlite = store_from_url(f"sqlite:///{tmp_path / 'l.db'}")
    assert isinstance(sqlite, Sweepable) and sqlite.sweep() == 0
    sqlite.close()


def test_postgres_deadlines_end_a_connection_only_past_its_deadline() -> None:
    """The deadline of a call ends its connection (the socket shut down: the peer
    reads the end of the stream) once passed, and never after the call disarmed it."""
    import socket

    from sidecar.store.postgres.connection import Deadlines

    deadlines = Deadlines()
    late, peer_of_late = socket.socketpair()
    kept, peer_of_kept = socket.socketpair()
    try:
        deadlines.arm(late, time.monotonic() + 0.05)  # type: ignore[arg-type]
        deadlines.arm(kept, time.monotonic() + 0.05)  # type: ignore[arg-type]
        assert deadlines.disarm(kept) is False  # the call ended in time
        peer_of_late.settimeout(2.0)
        started = time.monotonic()
        assert peer_of_late.recv(1) == b""  # the end of the stream, at the deadline
        assert time.monotonic() - started < 1.0
        assert deadlines.disarm(late) is True
        time.sleep(0.1)
        kept.sendall(b"x")  # untouched: still open both ways
        assert peer_of_kept.recv(1) == b"x"
    finally:
        deadlines.close()
        for sock in (late, peer_of_late, kept, peer_of_kept):
            sock.close()


def test_the_postgres_pool_leans_on_psycopg_pool_names_that_still_exist() -> None:
    """The pool collectable from any thread (``connection.Pool.__del__``) uses two of
    psycopg_pool's own names; a release that moves them fails here, not in production."""
    import psycopg_pool

    from sidecar.store.postgres.connection import Pool

    assert callable(getattr(psycopg_pool.ConnectionPool, "_signal_stop_worker", None))
    pool = Pool("postgresql://nowhere.invalid/db", open=False)
    assert pool._closed is True  # a pool not opened yet counts as closed


def test_redis_knows_when_a_timed_out_write_landed(redis_server: RedisServer) -> None:
    """After a reply timeout, the exact planned documents in place prove the script ran."""
    redis_server.client().flushdb()
    store = RedisStore(redis_server.url)
    plan: Plan[None] = Plan(None, {"k": Write({"at": 1.5, "id": "x"})})
    assert store._landed(plan) is False
    put(store, "k", {"at": 1.5, "id": "x"})
    assert store._landed(plan) is True
    put(store, "k", {"at": 1.5, "id": "y"})
    assert store._landed(plan) is False
    store.close()


def test_trim_removes_members_scored_below(store: Store) -> None:
    store.transact(
        [], lambda snap: Plan(None, {}, [IndexEntry("ix", f"m{i}", float(i)) for i in range(10)])
    )
    store.transact([], lambda snap: Plan(None, {}, [], [("ix", 4.0)]))
    assert [m for m, _ in store.index_page("ix", limit=20)] == [f"m{i}" for i in range(4, 10)]
    assert store.index_count("ix") == 6 and store.index_count("ix", max_score=5) == 2


def test_one_plan_writes_and_deletes_several_documents(store: Store) -> None:
    """Writes, deletes and TTLs of several documents in one plan land on the right keys."""
    put(store, "gone", {"x": 0})
    put(store, "kept", {"x": 0})

    def fn(snap: Snapshot) -> Plan[None]:
        for key in ("one", "gone", "two", "kept", "three"):
            snap.get(key)
        return Plan(
            None,
            {
                "one": Write({"n": 1}),
                "gone": Write(None),
                "two": Write({"n": 2, "s": "deux"}, ttl_s=3600),
                "three": Write({"n": 3}),
            },
        )

    store.transact(["one", "gone", "two", "kept", "three"], fn)
    assert store.get_many(["one", "gone", "two", "kept", "three"]) == {
        "one": {"n": 1},
        "gone": None,
        "two": {"n": 2, "s": "deux"},
        "kept": {"x": 0},
        "three": {"n": 3},
    }


def _bump_losing(store: Store, calls: list[int], races: int) -> TxnFn[int]:
    """A function that increments "k" and answers what it saw (kept in
    ``calls``); on each of its first ``races`` runs another writer sets "k"
    to ten times that, between this read and its write."""

    def fn(snap: Snapshot) -> Plan[int]:
        seen = snap.get("k")
        assert seen is not None
        calls.append(seen["n"])
        if len(calls) <= races:
            put(store, "k", {"n": seen["n"] * 10})
        return Plan(seen["n"], {"k": Write({"n": seen["n"] + 1})})

    return fn


def test_redis_counts_a_conflict_and_retries(redis_server: RedisServer) -> None:
    """A document changed between the read and the compare-and-set: the script
    applies nothing and answers the current value, on which the transaction
    re-runs and lands; one conflict is counted, and three round trips (one
    read, two scripts)."""
    redis_server.client().flushdb()
    tally = Tally()
    store = RedisStore(redis_server.url, events=tally.events)
    put(store, "k", {"n": 1})
    calls: list[int] = []
    fn = _bump_losing(store, calls, races=1)

    conflicts = tally.conflicts
    trips = tally.round_trips
    assert store.transact(["k"], fn) == 10
    assert calls == [1, 10]
    assert store.get("k") == {"n": 11}
    assert tally.conflicts - conflicts == 1
    # this transaction's 3, plus the 2 of the writer it raced
    assert tally.round_trips - trips == 5
    store.close()


def test_documents_keep_every_value_exactly(store: Store) -> None:
    """Integers past 64 bits (request bodies may carry them up to a double's
    range), non-ASCII text, a lone surrogate and floats come back exactly as
    written."""
    doc = {
        "big": 2**70,
        "neg": -(10**300),
        "edge": 2**64,
        "u64": 2**64 - 1,
        "text": "é ✓ 𝄞",
        "float": 0.1,
        "tiny": 5e-324,
        "nested": [{"big": 2**100}],
        "surrogate": "a\ud800b",  # not Unicode text: bodies refuse it, the store keeps it
    }
    put(store, "exact", doc)
    back = store.get("exact")
    assert back == doc
    assert back is not None and type(back["big"]) is int and type(back["nested"][0]["big"]) is int


def _counting(
    store: Store, tally: Tally, keys: list[str], fn: TxnFn[T], **hint: bool
) -> tuple[T, float]:
    """``store.transact`` and the Redis round trips it took (``store`` reports to ``tally``)."""
    before = tally.round_trips
    result = store.transact(keys, fn, **hint)
    return result, tally.round_trips - before


def _create_once(snap: Snapshot) -> Plan[str]:
    """Create "a" unless it exists; answer what it found."""
    doc = snap.get("a")
    if doc is not None:
        return Plan(f"found {doc['v']}", {})
    return Plan("created", {"a": Write({"v": 1})})


def test_absent_likely_never_changes_a_result(store: Store) -> None:
    """The hint that keys are probably new gives the same answers and writes
    as a plain transaction, whether the guess holds or not."""
    assert store.transact(["a"], _create_once, absent_likely=True) == "created"
    assert store.transact(["a"], _create_once, absent_likely=True) == "found 1"
    assert store.get("a") == {"v": 1}


def test_absent_likely_on_redis_saves_the_read_when_it_holds(
    redis_server: RedisServer,
) -> None:
    """New keys: one round trip (the compare-and-set checks they are absent).
    Existing keys: the script's answer is the read, and the function runs
    again on the stored value: one more round trip when it writes, none when
    it only reads (that answer is one consistent snapshot)."""
    redis_server.client().flushdb()
    tally = Tally()
    store = RedisStore(redis_server.url, events=tally.events)
    assert _counting(store, tally, ["a"], _create_once, absent_likely=True) == ("created", 1)
    seen: list[Doc | None] = []

    def spy(snap: Snapshot) -> Plan[str]:
        seen.append(snap.get("a"))
        return _create_once(snap)

    assert _counting(store, tally, ["a"], spy, absent_likely=True) == ("found 1", 1)
    assert seen == [None, {"v": 1}]

    def bump(snap: Snapshot) -> Plan[int]:
        v = (snap.get("a") or {"v": 0})["v"] + 1
        return Plan(v, {"a": Write({"v": v})})

    assert _counting(store, tally, ["a"], bump, absent_likely=True) == (2, 2)
    assert store.get("a") == {"v": 2}
    assert _counting(store, tally, ["a"], bump) == (3, 2)  # without the hint: read, then write
    store.close()


def test_absent_likely_checks_keys_read_inside_the_function(
    redis_server: RedisServer,
) -> None:
    """A key first read inside the function is guessed absent too, and
    checked: when it exists, the function runs again on it."""
    redis_server.client().flushdb()
    store = RedisStore(redis_server.url)
    put(store, "stop", {"why": "operator"})

    def guarded(snap: Snapshot) -> Plan[str]:
        if snap.get("stop") is not None:
            return Plan("stopped", {})
        return Plan("written", {"a": Write({"v": 1})})

    assert store.transact(["a"], guarded, absent_likely=True) == "stopped"
    assert store.get("a") is None
    store.close()


def test_absent_likely_drops_errors_and_unchecked_reads_of_a_guess(
    redis_server: RedisServer,
) -> None:
    """An exception raised on the guess is not the answer (the function runs
    again on what is stored); a plan that reads a key unchecked is decided on a
    guess only as far as every key it read is compared: a wrong guess of that
    key loses, and the script's answer is the read it decides on."""
    redis_server.client().flushdb()
    store = RedisStore(redis_server.url)
    put(store, "a", {"v": 1})

    def needs(key: str) -> TxnFn[int]:
        def fn(snap: Snapshot) -> Plan[int]:
            doc = snap.get(key)
            if doc is None:
                raise LookupError(f"no {key}")
            return Plan(doc["v"], {key: Write({"v": doc["v"] + 1})})

        return fn

    assert store.transact(["a"], needs("a"), absent_likely=True) == 1
    assert store.get("a") == {"v": 2}
    with pytest.raises(LookupError):  # raised on what is stored: it is the answer
        store.transact(["missing"], needs("missing"), absent_likely=True)

    put(store, "hits", {"count": 41})

    def counts(snap: Snapshot) -> Plan[int]:
        seen = (snap.get("hits") or {}).get("count", 0)
        plan = Plan(seen, {"own": Write({"ok": True})}, unchecked={"hits"})
        plan.increments["hits"] = Increment("count", 1, 3600)
        return plan

    assert store.transact(["hits", "own"], counts, absent_likely=True) == 41
    assert store.get("hits") == {"count": 42}
    store.close()


def test_redis_reads_afresh_after_backing_off(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first conflict re-runs at once on the values the script answered; a
    second backs off, then reads again: values answered before the sleep are
    stale by it, and a hot key would keep losing on them (then give up, 503)."""
    redis_server.client().flushdb()
    store = RedisStore(redis_server.url)
    put(store, "k", {"n": 1})
    calls: list[int] = []
    fn = _bump_losing(store, calls, races=2)

    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        put(store, "k", {"n": 500})  # and once more during the back-off

    monkeypatch.setattr("sidecar.store.redis.store.time.sleep", sleep)
    assert store.transact(["k"], fn) == 500
    assert calls == [1, 10, 500]
    assert len(slept) == 1 and 0 <= slept[0] <= 0.05
    assert store.get("k") == {"n": 501}
    store.close()


def _hammer_one_key(store: Store, bumps_per_thread: int, threads: int = 32) -> None:
    """``threads`` threads bump one document ``bumps_per_thread`` times each:
    every bump lands (none gives up after its retries) and none is lost."""
    put(store, "hot", {"n": 0})

    def bump(snap: Snapshot) -> Plan[None]:
        n = (snap.get("hot") or {"n": 0})["n"] + 1
        return Plan(None, {"hot": Write({"n": n})})

    def worker(_: int) -> int:
        for _i in range(bumps_per_thread):
            store.transact(["hot"], bump)
        return bumps_per_thread

    with ThreadPoolExecutor(threads) as pool:
        done = sum(pool.map(worker, range(threads)))
    assert done == threads * bumps_per_thread
    assert store.get("hot") == {"n": threads * bumps_per_thread}


def test_redis_hot_key_never_gives_up(redis_server: RedisServer) -> None:
    """Thirty-two threads bump one document as fast as they can: every bump lands
    (none gives up after its retries), and none is lost. The decision deadline is
    raised from 2 s to 10 s: on a loaded 2-core machine 32 threads queue on the
    interpreter lock longer than that, which is the deadline's job, not this test's."""
    redis_server.client().flushdb()
    store = RedisStore(redis_server.url, timeout_s=10.0)
    _hammer_one_key(store, bumps_per_thread=100)
    store.close()


def test_redis_guess_answers_a_replay_during_a_write_pause(redis_server: RedisServer) -> None:
    """A failover pauses writes (``CLIENT PAUSE WRITE``), which blocks the
    compare-and-set of a guess: after its timeout the decision is made once
    more on a real read, so a begin that only finds its record is answered;
    one that must write fails closed, and leaves nothing behind."""
    client = redis_server.client()
    client.flushdb()
    store = RedisStore(redis_server.url + "?socket_timeout_s=0.3")

    def create_b(snap: Snapshot) -> Plan[str]:
        if snap.get("b") is not None:
            return Plan("found", {})
        return Plan("created", {"b": Write({"v": 1})})

    put(store, "a", {"v": 7})
    client.execute_command("CLIENT", "PAUSE", "3000", "WRITE")
    try:
        assert store.transact(["a"], _create_once, absent_likely=True) == "found 7"
        with pytest.raises(StoreUnavailable):
            store.transact(["b"], create_b, absent_likely=True)
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
    assert store.get("a") == {"v": 7}
    time.sleep(0.2)  # a blocked script of a dropped connection never runs
    assert store.get("b") is None
    assert store.transact(["b"], create_b, absent_likely=True) == "created"
    assert store.get("b") == {"v": 1}
    store.close()


def _bump(snap: Snapshot) -> Plan[int]:
    v = (snap.get("a") or {"v": 0})["v"] + 1
    return Plan(v, {"a": Write({"v": v})})


def test_recent_likely_never_changes_a_result(store: Store) -> None:
    """The hint that keys still hold what this process last saw gives the same
    answers and writes as a plain transaction, whether the guess holds or not."""
    assert store.transact(["a"], _bump, recent_likely=True) == 1
    assert store.transact(["a"], _bump, recent_likely=True) == 2
    assert store.get("a") == {"v": 2}


def test_recent_likely_on_redis_saves_the_read_and_checks_the_guess(
    redis_server: RedisServer,
) -> None:
    """Keys this process just wrote: one round trip. A key another process
    changed since: the compare-and-set refuses the guess, answers the stored
    value and the function runs again on it (two, as without the hint, and
    no conflict counted); nothing is lost."""
    redis_server.client().flushdb()
    tally = Tally()  # both processes' stores count to it, as two workers to one /metrics
    mine = RedisStore(redis_server.url, events=tally.events)
    other = RedisStore(redis_server.url, events=tally.events)
    assert _counting(mine, tally, ["a"], _bump, recent_likely=True) == (1, 2)  # not seen: read
    assert _counting(mine, tally, ["a"], _bump, recent_likely=True) == (2, 1)
    assert other.transact(["a"], _bump) == 3
    seen: list[Doc | None] = []

    def spy(snap: Snapshot) -> Plan[int]:
        seen.append(snap.get("a"))
        return _bump(snap)

    conflicts = tally.conflicts
    assert _counting(mine, tally, ["a"], spy, recent_likely=True) == (4, 2)
    assert seen == [{"v": 2}, {"v": 3}]
    assert tally.conflicts == conflicts
    assert mine.get("a") == {"v": 4}
    # A key first read inside the function is guessed as last seen too, and checked.
    put(other, "stop", {"why": "operator"})

    def guarded(snap: Snapshot) -> Plan[str]:
        if snap.get("stop") is not None:
            return Plan("stopped", {})
        return Plan("written", {"a": Write({"v": 0})})

    assert mine.transact(["a"], guarded, recent_likely=True) == "stopped"
    assert mine.get("a") == {"v": 4}
    mine.close()
    other.close()


def test_a_fresh_postgres_database_gets_its_schema(postgres_server: PostgresServer) -> None:
    """What the tests' reset (a ``TRUNCATE``) keeps: on a database without loopstop's
    tables ``ensure_schema`` creates them and their functions and stamps the version."""
    import psycopg

    postgres_server.drop()
    store = PostgresStore(postgres_server.url)
    try:
        assert store.ensure_schema() == SCHEMA_VERSION
        with psycopg.connect(postgres_server.url) as pg:
            tables = pg.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'loopstop_%' ORDER BY 1"
            ).fetchall()
            functions = pg.execute(
                "SELECT proname FROM pg_proc WHERE proname LIKE 'loopstop_%' ORDER BY 1"
            ).fetchall()
        assert tables == [("loopstop_idx",), ("loopstop_kv",), ("loopstop_meta",)]
        assert functions == [
            ("loopstop_bound",),
            ("loopstop_check",),
            ("loopstop_fence",),
            ("loopstop_increment",),
        ]
        assert store._read_schema_version() == SCHEMA_VERSION
        put(store, "a", {"n": 1})
        assert store.get("a") == {"n": 1}
    finally:
        store.close()


def _postgres(
    server: PostgresServer, query: str = "", timeout_s: float = 2.0, tally: Tally | None = None
) -> PostgresStore:
    """A PostgresStore on an emptied database (``query``: the store's URL parameters),
    reporting to ``tally``."""
    server.reset()
    events = None if tally is None else tally.events
    store = PostgresStore(server.url + query, timeout_s=timeout_s, events=events)
    store.ensure_schema()
    return store


def test_postgres_lost_compare_and_set_logs_nothing(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A lost compare-and-set (a duplicate racing its twin) is an ordinary outcome: it is
    counted, the transaction re-runs and lands, and no logger (psycopg's included) writes a
    warning or a traceback. Each losing plan also indexes 100 members, so the server's
    refusal comes back while the pipeline is still sending; then 16 threads bumping one
    key log nothing either."""
    import logging

    tally = Tally()
    store = _postgres(postgres_server, "?pool_size=4", timeout_s=10.0, tally=tally)
    caplog.set_level(logging.DEBUG)  # the root logger: every logger propagates to it
    conflicts = tally.conflicts
    for round_ in range(5):
        key = f"k{round_}"
        put(store, key, {"n": 1})
        calls: list[int] = []

        def fn(snap: Snapshot, key: str = key, calls: list[int] = calls) -> Plan[int]:
            seen = snap.get(key) or {"n": 0}
            calls.append(seen["n"])
            if len(calls) == 1:  # its twin lands between this read and this commit
                put(store, key, {"n": seen["n"] * 10})
            members = [IndexEntry("ix", f"{key}:{i}", 1.0) for i in range(100)]
            return Plan(seen["n"], {key: Write({"n": seen["n"] + 1})}, members)

        assert store.transact([key], fn) == 10
        assert calls == [1, 10] and store.get(key) == {"n": 11}
    assert tally.conflicts - conflicts == 5
    _hammer_one_key(store, bumps_per_thread=10, threads=16)
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert noisy == [], [f"{r.name}: {r.getMessage()}" for r in noisy]
    store.close()


def test_postgres_a_pooled_connection_the_server_closed_is_replaced(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends loopstop's idle sessions (``idle_session_timeout``, a restart, a
    proxy): the next decision gets a fresh connection instead of a 503, because a
    connection idle past ``IDLE_CHECK_S`` is checked before it is used."""
    import psycopg

    from sidecar.store.postgres import connection

    store = _postgres(postgres_server)
    put(store, "k", {"n": 1})
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'loopstop' AND pid <> pg_backend_pid()"
        ).fetchone()
    assert ended is not None and ended[0] >= 1
    monkeypatch.setattr(connection, "IDLE_CHECK_S", 0.0)
    assert store.get("k") == {"n": 1}
    put(store, "k", {"n": 2})
    assert store.get("k") == {"n": 2}
    store.close()


def _advisory_locks(url: str) -> list[str]:
    """The modes of the key locks (this store's lock class) held right now."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT mode FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
            "AND objsubid = 2 AND granted",
            (LOCK_CLASS,),
        ).fetchall()
    return sorted(str(mode) for (mode,) in rows)


@pytest.mark.parametrize("isolation", ["cas", "serializable"])
def test_postgres_counts_a_conflict_and_retries(
    postgres_server: PostgresServer, isolation: str
) -> None:
    """A document changed between the read and the commit: nothing of the losing
    attempt is written, the decision runs again on a fresh read and lands, and
    one conflict is counted. Compare-and-set (the default): the first attempt
    holds no lock while it decides; its retry runs with the key locked
    exclusively (a hot key queues instead of spinning). ``SERIALIZABLE``: the
    serialization failure is retried the same way."""
    tally = Tally()
    store = _postgres(postgres_server, f"?isolation={isolation}", tally=tally)
    put(store, "k", {"n": 1})
    calls: list[int] = []
    locks: list[list[str]] = []
    losing = _bump_losing(store, calls, races=1)

    def fn(snap: Snapshot) -> Plan[int]:
        locks.append(_advisory_locks(postgres_server.url))
        return losing(snap)

    conflicts = tally.conflicts
    trips = tally.round_trips
    assert store.transact(["k"], fn) == 10
    assert calls == [1, 10]
    assert store.get("k") == {"n": 11}
    assert tally.conflicts - conflicts == 1
    # a read and a commit per attempt (the first commit lost), plus the 2 of the writer it raced
    assert tally.round_trips - trips == 6
    if isolation == "cas":
        assert locks == [[], ["ExclusiveLock"]]
    assert _advisory_locks(postgres_server.url) == []  # released at commit
    store.close()


def test_postgres_hot_key_never_gives_up(postgres_server: PostgresServer) -> None:
    """Thirty-two threads bump one document as fast as they can through eight
    connections: every bump lands (none gives up after its retries) and none is
    lost. The deadline is 10 s, as in the Redis test, for a loaded 2-core machine."""
    store = _postgres(postgres_server, "?pool_size=8", timeout_s=10.0)
    _hammer_one_key(store, bumps_per_thread=25)
    store.close()


def test_postgres_serializable_race_makes_exactly_one_reservation(
    postgres_server: PostgresServer,
) -> None:
    """``?isolation=serializable``: 32 threads reserve one key at once; exactly one creates it
    (the others' serialization failures and duplicate inserts are retried, then read it)."""
    store = _postgres(postgres_server, "?isolation=serializable&pool_size=8")
    assert store.ping()["isolation"] == "serializable"
    test_race_exactly_one_reservation(store)
    store.close()


def _put_raw(store: Store, store_url: str, key: str, text: str) -> None:
    """Write ``text`` under ``key`` behind the store's back (damage, another writer)."""
    if isinstance(store, RedisStore):
        store.client.set(store.key(key), text)
    elif store_url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as db:
            db.execute("INSERT INTO kv (key, doc, expires_at) VALUES (?, ?, NULL)", (key, text))
    else:
        import psycopg

        with psycopg.connect(store_url) as db:
            db.execute(
                "INSERT INTO loopstop_kv (key, doc, expires_at) VALUES (%s, %s, NULL)",
                (key, text),
            )


def test_a_stored_document_that_is_not_json_fails_closed(store: Store, store_url: str) -> None:
    """A damaged record is a store failure (503, nothing decided), never a crash."""
    _put_raw(store, store_url, "t:damaged", "{not json")
    with pytest.raises(StoreUnavailable, match="not JSON"):
        store.get_many(["t:damaged"])
    calls: list[Snapshot] = []

    def fn(snap: Snapshot) -> Plan[None]:
        calls.append(snap)
        return Plan(None, writes={"t:damaged": Write({"a": 1})})

    with pytest.raises(StoreUnavailable, match="not JSON"):
        store.transact(["t:damaged"], fn)
    assert calls == []  # nothing was decided on it

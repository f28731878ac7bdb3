"""The PostgreSQL store's commit pipeline (lock, compare, write, ``COMMIT`` in
one round trip) and a decision on a guess sent through it at once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import psycopg

from sidecar.store.base import (
    META_ID,
    Bound,
    Doc,
    Plan,
    Snapshot,
    StoreEvents,
    T,
    TxnFn,
    decode_doc,
)
from sidecar.store.plan import written_text
from sidecar.store.postgres import sql
from sidecar.store.postgres.connection import PooledConnection


class Source(Protocol):
    """What a pipeline runs with and reports to (the PostgreSQL store)."""

    serializable: bool
    identity: str | None
    events: StoreEvents
    clock: Callable[[], float]

    def fence(self, deadline: float) -> float | None: ...


def rollback(conn: PooledConnection) -> None:
    """End the connection's transaction; a connection that cannot is closed
    (the pool discards it)."""
    if conn.closed:
        return
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        conn.close()


def texts_of(plan: Plan[Any]) -> dict[str, str | None]:
    """The text of every document the plan writes (None: deleted), encoded once:
    the statements send it and the map of recent values keeps it."""
    return {k: None if w.doc is None else written_text(w.doc) for k, w in plan.writes.items()}


def write(
    store: Source,
    conn: PooledConnection,
    plan: Plan[Any],
    now: float,
    raw: Mapping[str, str | None],
    compared: list[str],
    exclusive: list[int],
    shared: list[int],
    begin: bool,
    texts: Mapping[str, str | None],
    read: list[Any] | None = None,
    bounds: Sequence[Bound] = (),
    fence: float | None = None,
) -> psycopg.Error | None:
    """Lock, compare ``compared`` with ``raw``, check ``bounds`` and apply
    ``plan`` (its documents' ``texts``) in one pipeline, after ``BEGIN`` when
    ``begin`` (under ``serializable`` nothing is compared: the isolation
    level does it). The error that refused it, or None once committed.
    ``read`` gets the cursors of the identity and of ``raw``'s keys, read
    first (their rows outlive a refusal). ``fence``: the server time (epoch
    seconds) past which nothing is written (``LS408``): a server that paused
    with the pipeline queued and runs it after its caller gave up writes
    nothing (None: no fence)."""
    # The server's refusal may come back while the pipeline is still sending: it is
    # caught inside the block, so the pipeline ends quietly (psycopg logs a warning
    # for an error that leaves the block), and returned once the pipeline is closed.
    failure: psycopg.Error | None = None
    try:
        with conn.pipeline():
            try:
                if not store.serializable:
                    if begin:
                        conn.execute("BEGIN")
                    if read is not None:
                        read.append(conn.execute(sql.IDENTITY, (META_ID,)))
                        read.append(conn.execute(sql.SELECT, (list(raw), now)))
                    if exclusive or shared:
                        conn.execute(sql.LOCKS, {"c": sql.LOCK_CLASS, "x": exclusive, "s": shared})
                    conn.execute(
                        sql.CHECK, (compared, [raw[k] for k in compared], now, store.identity)
                    )
                    for b in bounds:
                        conn.execute(
                            sql.BOUND,
                            (list(b.keys), list(b.weights), b.field, b.below, b.at_least, now),
                        )
                if fence is not None:
                    conn.execute(sql.FENCE, (fence,))
                sql.apply(conn, plan, now, texts)
                conn.execute("COMMIT")
            except psycopg.Error as exc:
                failure = exc
    except psycopg.Error as exc:  # at the pipeline's end: the refusal, or "aborted" after it
        failure = failure or exc
    finally:
        store.events.round_trip()  # a pipeline that lost was a round trip too
    return failure


def guess(
    store: Source,
    conn: PooledConnection,
    declared: list[str],
    fn: TxnFn[T],
    known: Mapping[str, str | None],
    recall: Callable[[str], str | None],
    deadline: float,
) -> tuple[Plan[T] | None, list[Any] | None, dict[str, str | None], dict[str, str | None]]:
    """Decide on ``known`` (the declared keys' values as guessed: absent, or
    as this process last saw them; a key first read inside ``fn`` as
    ``recall`` gives it), then lock, compare every key read (the plan's
    unchecked ones too: a guess stands only on what was compared; those a
    bound covers against it) and write in one pipeline: one round trip.

    :returns: ``(plan, seed, raw, texts)``: the plan once committed, else None
        with nothing written (the guess did not hold, ``fn`` raised on it, its
        plan writes nothing, or the server refused the pipeline), and then
        ``seed``, the read that pipeline made first when it held (the caller
        decides on it: a replay, which writes nothing, is answered in that
        one trip); the values guessed and the texts written.
    :raises psycopg.Error: the server did not answer (a commit unknown).
    """
    now = store.clock()
    raw: dict[str, str | None] = dict(known)
    docs: dict[str, Doc | None] = {
        k: None if v is None else decode_doc(k, v) for k, v in raw.items()
    }

    def load(more: list[str]) -> None:
        for key in more:
            raw[key] = value = recall(key)
            docs[key] = None if value is None else decode_doc(key, value)

    try:
        plan = fn(Snapshot(docs, load))
    except Exception:
        return None, None, raw, {}  # raised on a guess: not the answer
    plan.check()
    for key in plan.writes:
        if key not in raw:
            raise RuntimeError(f"transaction wrote {key!r} without reading it")
    if not (plan.writes or plan.index or plan.trims or plan.increments):
        return None, None, raw, {}  # a read answers a decision that writes nothing
    exclusive = sorted({sql.lock_id(k) for k in plan.writes})
    shared = sorted({sql.lock_id(k) for k in raw} - set(exclusive))
    seed: list[Any] = []
    texts = texts_of(plan)
    # Every key compared whole, but those a bound covers: checked against it.
    bounded = {k for b in plan.bounds for k in b.keys}
    if not bounded <= raw.keys():
        raise RuntimeError("a bound on a key the transaction did not read")
    compared = [k for k in raw if k not in bounded]
    fence = store.fence(deadline)
    failure = write(
        store,
        conn,
        plan,
        now,
        raw,
        compared,
        exclusive,
        shared,
        True,
        texts,
        seed,
        plan.bounds,
        fence,
    )
    if failure is None:
        return plan, None, raw, texts
    rollback(conn)
    if failure.sqlstate is None:
        raise failure  # no answer from the server: whether it committed is unknown
    # The server refused a statement, so the transaction wrote nothing: a
    # wrong guess (no conflict), or an error the read path names as usual.
    return None, seed if failure.sqlstate == "LS409" and len(seed) == 2 else None, raw, {}

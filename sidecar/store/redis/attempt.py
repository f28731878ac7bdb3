"""One attempt of a Redis transaction: what it read (or guessed), and the
plan the function decided on it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, cast

import redis

from sidecar.store.base import META_ID, Doc, Plan, Snapshot, StoreEvents, T, TxnFn, decode_doc
from sidecar.store.plan import LARGE_DOC_CHARS, WrittenText
from sidecar.store.recent import RecentValues
from sidecar.store.redis.connection import command


class Source(Protocol):
    """What an attempt reads through and reports to (the Redis store)."""

    identity: str | None
    client: redis.Redis
    prefix: str
    events: StoreEvents
    recent: RecentValues

    def _verify_identity(self, found: str | None) -> None: ...


def decide(fn: TxnFn[T], reads: Reads) -> Plan[T] | None:
    """``fn`` on what the attempt read; None when that was a guess the plan
    cannot stand on: ``fn`` raised on it (the error may not be the answer).
    A plan decided on a guess has every key it read compared, those it
    leaves unchecked too (``script_call(..., compare_unchecked=True)``).

    :raises Exception: what ``fn`` raised on values actually read.
    """
    try:
        return fn(Snapshot(reads.docs, reads.load))
    except Exception:
        if reads.guessing:
            return None
        raise


class Reads:
    """The raw values one transaction attempt read, and how many instants they
    were read at (each ``MGET`` is one; a seed from a compare-and-set is one).

    :param seed: values known without reading (the attempt starts from them).
    :param guessing: the seed is a guess: keys not in it are assumed absent
        (or, with ``recall``, as recalled) too, never read; the
        compare-and-set checks every one of them.
    :param recall: the guess for a key first read inside the function.
    """

    def __init__(
        self,
        store: Source,
        seed: dict[str, str | None] | None,
        guessing: bool,
        recall: Callable[[str], str | None] | None = None,
    ) -> None:
        self.store = store
        self.guessing = guessing
        self.recall = recall
        self.raw: dict[str, str | None] = {}
        self.docs: dict[str, Doc | None] = {}
        self.snapshots = 0
        # The identity is compared like a document: read with the first
        # MGET, or (on a guess) taken as the one seen, which the
        # compare-and-set then checks.
        self._identity_pending = store.identity is not None and seed is None
        if seed is not None:
            self.snapshots = 0 if guessing else 1
            self._keep(seed.keys(), seed.values())
            if store.identity is not None and META_ID not in self.raw:
                self.raw[META_ID] = store.identity

    def check_identity(self) -> None:
        """Refuse a store whose identity is not the one seen (read with the documents)."""
        if self.store.identity is not None and self.raw.get(META_ID) != self.store.identity:
            self.store._verify_identity(self.raw.get(META_ID))

    def _keep(self, keys: Iterable[str], values: Iterable[str | None]) -> None:
        raw, docs = self.raw, self.docs
        for k, v in zip(keys, values, strict=True):
            raw[k] = v
            if k != META_ID:
                docs[k] = None if v is None else decode_doc(k, v)

    def load(self, keys: list[str]) -> None:
        fresh = [k for k in keys if k not in self.raw]
        if self._identity_pending:
            self._identity_pending = False
            fresh.append(META_ID)
        if not fresh:
            return
        if self.guessing:
            recall = self.recall
            self._keep(fresh, [None if recall is None else recall(k) for k in fresh])
            return
        self.snapshots += 1
        store = self.store
        store.events.round_trip()
        prefix = store.prefix
        values = cast(list[str | None], command(store.client, "MGET", *[prefix + k for k in fresh]))
        for i, value in enumerate(values):
            if value is not None and len(value) >= LARGE_DOC_CHARS:
                # This process's own text, unchanged since it wrote it: read
                # back with no check, or not at all (see decode_doc).
                known = store.recent.get(fresh[i])
                if type(known) is WrittenText and known == value:
                    values[i] = known
        self._keep(fresh, values)
        store.recent.remember(zip(fresh, values, strict=True))

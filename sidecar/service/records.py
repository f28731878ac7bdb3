"""The services' one transaction seam: record mappers, :class:`Txn` and :func:`update`.

A *record mapper* knows how one record type is kept: its key, how a stored
document decodes into the core's record and encodes back (with its time to
live), and the index upkeep a change needs. Every service decision is one
store transaction run by :func:`run` over a :class:`Txn`: the decision
reads typed records through mappers, calls the pure core, and saves what
the core returned; a save writes only a record that changed. :func:`update`
is the common case (one scoped record: load, authorise, step, write if
changed); a decision over several records composes mappers in its step.

The store's rules are kept here, once, instead of in every decision:

- a written key must have been read in the transaction (so the store's
  compare-and-set covers it): :meth:`Txn.save` and :meth:`Txn.delete` read
  it first (no round trip when it was declared up front);
- keys the decision reads but tolerates changing meanwhile (counters that
  only increments change) are :meth:`Txn.tolerate`-d, and counters are
  :meth:`Txn.increment`-ed at commit (see :class:`sidecar.store.Increment`).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from sidecar.auth import Principal
from sidecar.errors import StoreUnavailable
from sidecar.store import Bound, Increment, IndexEntry, Plan, Snapshot, Store, Write

R = TypeVar("R")
I = TypeVar("I")  # noqa: E741 - the identity a scoped mapper addresses records by
T = TypeVar("T")
Doc = dict[str, Any]


class Txn:
    """One decision's view of the store: typed reads, writes of what changed.

    :ivar now: the request's clock reading (epoch seconds), read once before
        the transaction.
    :ivar plan: what the decision will apply (its ``result`` is set by :func:`run`).
    """

    def __init__(self, snap: Snapshot, now: float) -> None:
        self.snap = snap
        self.now = now
        self.plan: Plan[Any] = Plan(None)

    @classmethod
    def reading(cls, docs: Mapping[str, Doc | None], now: float) -> Txn:
        """A view over documents read outside any transaction (``get_many``),
        to locate and decode records with the same mappers; it writes nothing."""

        def more(keys: list[str]) -> None:
            raise KeyError(f"not read: {keys}")

        return cls(Snapshot(docs, more), now)

    def doc(self, key: str) -> Doc | None:
        """The raw document at ``key`` as read in this transaction."""
        return self.snap.get(key)

    def count(self, key: str, field: str) -> int:
        """The counter at ``field`` of the document at ``key`` (0 when absent):
        a whole number from 0 to 2**53 (what a float holds exactly), as
        increments leave it.

        :raises StoreUnavailable: the stored value is anything else (a damaged
            or foreign document): fail closed, as for a document that is not JSON.
        """
        doc = self.snap.get(key)
        if doc is None:
            return 0
        value = doc.get(field, 0) if isinstance(doc, dict) else None
        if type(value) is float and math.isfinite(value) and value.is_integer():
            value = int(value)  # past 10^14 Redis's script writes an exponent
        if type(value) is not int or not 0 <= value <= 2**53:
            raise StoreUnavailable(f"the counter stored at {key!r} is not a count")
        return value

    def has_read(self, key: str) -> bool:
        return self.snap.has_read(key)

    def prefetch(self, keys: Iterable[str]) -> None:
        """Read every key of ``keys`` not read yet, in one round trip (a decision
        that learns several keys at once from what it read)."""
        self.snap.prefetch(keys)

    def read(self, mapper: Mapper[R], key: str) -> R | None:
        """The record at ``key``, decoded by ``mapper``; None when absent."""
        return mapper.decode(self.snap.get(key))

    def save(
        self, mapper: Mapper[R], ns: str, key: str, after: R | None, before: R | None = None
    ) -> None:
        """Store ``after`` at ``key`` unless it is None or equal to ``before``
        (nothing changed), with the mapper's TTL and index upkeep."""
        if after is None or (before is not None and after == before):
            return
        self.refresh(mapper, ns, key, after, before)

    def refresh(
        self, mapper: Mapper[R], ns: str, key: str, record: R, before: R | None = None
    ) -> None:
        """Store ``record`` at ``key`` even when unchanged (its TTL starts again)."""
        self.snap.get(key)
        self.plan.writes[key] = mapper.encode(self, ns, record)
        mapper.upkeep(self, ns, key, before, record)

    def put(self, key: str, doc: Doc | None, ttl_s: float | None = None) -> None:
        """Write a raw document (None deletes it) at ``key``."""
        self.snap.get(key)
        self.plan.writes[key] = Write(doc, ttl_s)

    def delete(self, key: str) -> None:
        """Delete the document at ``key``."""
        self.put(key, None)

    def index(self, index: str, member: str, score: float | None) -> None:
        """Add ``member`` to ``index`` at ``score`` (None removes it)."""
        self.plan.index.append(IndexEntry(index, member, score))

    def trim(self, index: str, below: float) -> None:
        """Remove every member of ``index`` scored below ``below``."""
        self.plan.trims.append((index, below))

    def increment(self, key: str, increment: Increment) -> None:
        """Add to a counter at commit (the key need not have been read)."""
        self.plan.increments[key] = increment

    def tolerate(self, keys: Iterable[str]) -> None:
        """Leave ``keys`` (read, never written) out of the compare-and-set."""
        self.plan.unchecked.update(keys)

    def bound(self, bound: Bound) -> None:
        """Leave ``bound.keys`` out of the compare, and have a plan decided on
        a guess checked against ``bound`` instead (:class:`~sidecar.store.Bound`)."""
        self.plan.unchecked.update(bound.keys)
        self.plan.bounds.append(bound)

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the plan committed (counters of what happened)."""
        self.plan.on_commit.append(callback)


class Mapper(abc.ABC, Generic[R]):
    """How one record type is stored: decode, encode (document and TTL), upkeep."""

    @abc.abstractmethod
    def decode(self, doc: Mapping[str, Any] | None) -> R | None:
        """The record of a stored document; None when absent."""

    @abc.abstractmethod
    def encode(self, txn: Txn, ns: str, record: R) -> Write:
        """The document to store and its TTL (seconds from ``txn.now``)."""

    def upkeep(self, txn: Txn, ns: str, key: str, before: R | None, after: R) -> None:
        """Index entries, pointers and counters that follow a saved change."""


class Scoped(Mapper[R], Generic[I, R]):
    """A mapper whose records are addressed by an identity and guarded by a principal."""

    @abc.abstractmethod
    def keys(self, ns: str, ident: I) -> list[str]:
        """The keys to read up front for the record ``ident`` (its own first)."""

    def locate(self, txn: Txn, ns: str, ident: I) -> tuple[str, R | None]:
        """Where ``ident`` is kept and its record (None: absent)."""
        key = self.keys(ns, ident)[0]
        return key, txn.read(self, key)

    @abc.abstractmethod
    def authorize(self, principal: Principal, record: R | None, ident: I) -> R:
        """The record, when ``principal`` may act on it.

        :raises NotFound: the record is absent (or hidden from the principal).
        :raises Forbidden: the record belongs to a workflow outside the scope.
        """


def run(
    store: Store,
    declared: Iterable[str],
    step: Callable[[Txn], T],
    now: float,
    *,
    absent_likely: bool = False,
    recent_likely: bool = False,
) -> T:
    """Run ``step`` as one store transaction over the ``declared`` keys.

    ``step`` may run more than once (a store retries on a concurrent change),
    so it must decide only from what it reads through the :class:`Txn`.

    :param absent_likely: the keys are probably absent (a new id);
    :param recent_likely: they probably hold what this process last read or
        wrote: the store's modes, documented in :meth:`sidecar.store.Store.transact`
        (a hint never changes a result).
    :returns: what ``step`` returned, once its changes committed.
    :raises StoreUnavailable: fail closed; exceptions of ``step`` propagate
        and nothing is written.
    """

    def decide(snap: Snapshot) -> Plan[T]:
        txn = Txn(snap, now)
        txn.plan.result = step(txn)
        return txn.plan

    return store.transact(
        list(declared), decide, absent_likely=absent_likely, recent_likely=recent_likely
    )


def update(
    store: Store,
    mapper: Scoped[I, R],
    ns: str,
    ident: I,
    principal: Principal,
    step: Callable[[R, Txn], tuple[R | None, T]],
    now: float,
    *,
    also: Iterable[str] = (),
    recent_likely: bool = False,
) -> T:
    """Load the record ``ident``, authorise ``principal``, run the core ``step``,
    write the record only when it changed.

    :param step: ``(record, txn) -> (record to store or None, result)``; it
        may read (and compose) other records through ``txn``.
    :param also: more keys the step reads, declared up front (one round trip).
    :param recent_likely: see :func:`run`.
    :returns: the step's result.
    :raises NotFound, Forbidden: from :meth:`Scoped.authorize`.
    :raises StoreUnavailable: fail closed.
    """

    def body(txn: Txn) -> T:
        key, found = mapper.locate(txn, ns, ident)
        record = mapper.authorize(principal, found, ident)
        after, result = step(record, txn)
        txn.save(mapper, ns, key, after, record)
        return result

    return run(store, [*mapper.keys(ns, ident), *also], body, now, recent_likely=recent_likely)

"""One record mapper per record type: key, decode, encode, TTL and index upkeep.

The key patterns themselves are in :mod:`sidecar.service.keys`; this module
says, for each record the services keep, how its document maps to the
core's record, how long the store keeps it and which indexes follow it.
Every mapper is used through :class:`sidecar.service.records.Txn`.

====================  ==============================  ================================
mapper                record (core)                   TTL
====================  ==============================  ================================
``Operations``        ``core.operations.Operation``   the core's retention
``Tasks``             ``core.tasks.Task``             deadline + retention, or
                                                      retention after the task ended
``Chains``            ``core.chains.Chain``             until the chain expires
``STOPS``             ``core.stops.Stop``             none: sticky until resumed
``chain_stop()``      ``core.stops.Stop``             the chain's life
``EFFECTS``           ``core.chains.Effect``            until the effect expires
``LINKS``             ``core.chains.Link``              until the effect expires
``window()``          ``core.chains.Seen``              the dedupe window
``subject_rate()``    ``core.chains.RateLog``           the rate window
``lineages()``        ``core.lineage.Lineage``        the checks' retention
====================  ==============================  ================================

A workflow's activation counters are not records: they are incremented at
commit (:meth:`Txn.increment`) and read without being compared
(:meth:`Txn.tolerate`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sidecar.auth import Principal
from sidecar.canonical import Fingerprinter
from sidecar.core import operations as ops_core
from sidecar.core.chains import Chain, Effect, Link, RateLog, Seen
from sidecar.core.frozen import evolve, shallow_doc
from sidecar.core.lineage import Lineage
from sidecar.core.operations import OPEN_STATES, Operation, OperationPolicy
from sidecar.core.outliers import Exceeded
from sidecar.core.stops import Stop, StopScope, covering
from sidecar.core.tasks import Task
from sidecar.errors import NotFound
from sidecar.metrics import Metrics
from sidecar.service import keys
from sidecar.service.records import Mapper, Scoped, Txn
from sidecar.service.task_watch import TaskWatch
from sidecar.store import Write

R = TypeVar("R")

#: An operation's identity: its id and the workflow a route acts for (None: shared).
OperationId = tuple[str, str | None]


def ttl_until(until: float, now: float) -> float:
    """Seconds from ``now`` to ``until``, at least one (a store refuses zero)."""
    return max(1.0, until - now)


# -- operations ------------------------------------------------------------------


class Operations(Scoped[OperationId, Operation]):
    """The ledger's operations, each in its workflow's namespace (DESIGN §1).

    Upkeep: the open index (all workflows, and the record's workflow) holds
    an open operation scored by its lease end, and drops it once settled.
    """

    def __init__(self, policy: OperationPolicy) -> None:
        self.policy = policy

    def decode(self, doc: Mapping[str, Any] | None) -> Operation | None:
        return Operation.from_doc(doc)

    def encode(self, txn: Txn, ns: str, record: Operation) -> Write:
        return Write(record.to_doc(), ops_core.retention_s(record, self.policy))

    def upkeep(
        self, txn: Txn, ns: str, key: str, before: Operation | None, after: Operation
    ) -> None:
        indexes = [keys.open_operations(ns)]
        if after.workflow is not None:
            indexes.append(keys.open_operations(ns, after.workflow))
        score = after.lease_expires_at if after.state in OPEN_STATES else None
        member = key.removeprefix(f"{ns}:op:")
        for ix in indexes:
            txn.index(ix, member, score)

    def keys(self, ns: str, ident: OperationId) -> list[str]:
        """The workflow's key, then the shared one (a route naming no workflow: shared only)."""
        operation_id, workflow = ident
        shared = keys.operation(ns, operation_id, None)
        return (
            [shared] if workflow is None else [keys.operation(ns, operation_id, workflow), shared]
        )

    def locate(self, txn: Txn, ns: str, ident: OperationId) -> tuple[str, Operation | None]:
        """Where the operation is (or would be) kept.

        ``workflow``'s namespace first, then the shared one when it holds a
        record of that same workflow; None looks in the shared one only.
        """
        operation_id, workflow = ident
        shared_key = keys.operation(ns, operation_id, None)
        if workflow is None:
            return shared_key, txn.read(self, shared_key)
        own_key = keys.operation(ns, operation_id, workflow)
        own = txn.read(self, own_key)
        if own is not None:
            return own_key, own
        shared = txn.read(self, shared_key)
        if shared is not None and shared.workflow == workflow:
            return shared_key, shared
        return own_key, None

    def authorize(
        self, principal: Principal, record: Operation | None, ident: OperationId
    ) -> Operation:
        """:raises NotFound: absent from the workflow's namespace, or (shared) of
        a workflow outside the scope: one answer for both."""
        if record is None or not principal.allows(record.workflow):
            operation_id, workflow = ident
            where = f" in workflow {workflow!r}" if workflow is not None else ""
            raise NotFound(f"no operation {operation_id!r}{where}")
        return record


# -- tasks -----------------------------------------------------------------------


@dataclass(frozen=True)
class Tasks(Scoped[str, Task]):
    """Guarded agent tasks (DESIGN §3).

    Upkeep: the index of recent tasks; the task's watch document, running
    index and workflow totals (:class:`TaskWatch`); its ``task_key``
    pointer when created, ended or resumed (the moments its retention
    changes); the envelope counter when it ends.

    :ivar metrics: counts the tasks ended (``task_envelopes``).
    :ivar execution_id: the n8n execution acting (remembered for a task
        stop); bind it with :meth:`acting`.
    :ivar exceeded: the measures on which the task is an outlier now.
    """

    fp: Fingerprinter
    watch: TaskWatch
    retention_s: float
    deadline_s: float
    metrics: Metrics
    execution_id: str | None = None
    exceeded: tuple[Exceeded, ...] = ()

    def acting(self, execution_id: str | None, exceeded: list[Exceeded] | None = None) -> Tasks:
        """This mapper, saving on behalf of ``execution_id`` with ``exceeded`` measures."""
        return evolve(self, execution_id=execution_id, exceeded=tuple(exceeded or ()))

    def keys(self, ns: str, ident: str) -> list[str]:
        return [keys.task(ns, ident)]

    def decode(self, doc: Mapping[str, Any] | None) -> Task | None:
        return Task.from_doc(doc)

    def ttl_s(self, task: Task, now: float) -> float:
        """Until the task's retention ends (counted from its end, else from its deadline)."""
        if task.ended_at is not None:
            return max(1.0, task.ended_at + self.retention_s - now)
        return max(1.0, task.created_at + task.limits.deadline_s + self.retention_s - now)

    def encode(self, txn: Txn, ns: str, record: Task) -> Write:
        return Write(record.to_doc(), self.ttl_s(record, txn.now))

    def upkeep(self, txn: Txn, ns: str, key: str, before: Task | None, after: Task) -> None:
        now = txn.now
        ttl = self.ttl_s(after, now)
        mode: keys.ExecutionMode = "test" if ns == "t" else "production"
        exceeded = list(self.exceeded) or None
        self.watch.plan(txn, ns, before, after, now, ttl, self.execution_id, mode, exceeded)
        txn.index(keys.recent_tasks(ns), after.task_id, now)
        txn.trim(keys.recent_tasks(ns), now - self.retention_s - self.deadline_s)
        if after.envelope is not None and (before is None or before.envelope is None):
            status, reason = str(after.envelope.status), str(after.envelope.reason)
            envelopes = self.metrics.task_envelopes
            txn.on_commit(lambda: envelopes.labels(status, reason).inc())
        moved = before is None or (before.envelope is None) != (after.envelope is None)
        if after.task_key is not None and moved:
            txn.put(
                self.pointer(ns, after.workflow, after.task_key), {"task_id": after.task_id}, ttl
            )

    def pointer(self, ns: str, workflow: str | None, task_key: str) -> str:
        """The key of the pointer to the task made under ``task_key``."""
        return keys.task_key(ns, workflow, self.fp.key_hash("task", task_key))

    def authorize(self, principal: Principal, record: Task | None, ident: str) -> Task:
        """:raises NotFound: no such task. :raises Forbidden: of a workflow outside the scope."""
        if record is None:
            raise NotFound(f"no task {ident!r}")
        principal.require(record.workflow, of_record=True)
        return record


# -- chains and what hangs off them --------------------------------------------------


class Chains(Scoped[str, Chain]):
    """Causal chains of activations (DESIGN §2); kept until they expire.

    Upkeep: the index of live chains (for the operator page), scored by
    last activity and trimmed past the longest chain life.
    """

    def __init__(self, longest_chain_s: float) -> None:
        self.longest_chain_s = longest_chain_s

    def keys(self, ns: str, ident: str) -> list[str]:
        return [keys.chain(ns, ident)]

    def decode(self, doc: Mapping[str, Any] | None) -> Chain | None:
        return Chain.from_doc(doc)

    def encode(self, txn: Txn, ns: str, record: Chain) -> Write:
        return Write(record.to_doc(), ttl_until(record.expires_at, txn.now))

    def upkeep(self, txn: Txn, ns: str, key: str, before: Chain | None, after: Chain) -> None:
        txn.index(keys.recent_chains(ns), after.chain_id, txn.now)
        txn.trim(keys.recent_chains(ns), txn.now - self.longest_chain_s)

    @staticmethod
    def present(record: Chain | None, ident: str) -> Chain:
        """:raises NotFound: no such chain (or it expired and was collected)."""
        if record is None:
            raise NotFound(f"no chain {ident!r}")
        return record

    def authorize(self, principal: Principal, record: Chain | None, ident: str) -> Chain:
        """:raises NotFound: no such chain. :raises Forbidden: of a workflow outside the scope."""
        chain = self.present(record, ident)
        principal.require(chain.workflow, of_record=True)
        return chain


#: Chains as read (a TTL only matters to a write, which goes through ChainService's).
_ANY_CHAIN = Chains(0.0)


class Plain(Mapper[R], Generic[R]):
    """A record stored as its dataclass fields, with a TTL the record gives."""

    def __init__(
        self,
        decode: Callable[[Mapping[str, Any]], R],
        encode: Callable[[R], dict[str, Any]],
        ttl_s: Callable[[R, float], float | None],
    ) -> None:
        self._decode, self._encode, self._ttl_s = decode, encode, ttl_s

    def decode(self, doc: Mapping[str, Any] | None) -> R | None:
        return None if doc is None else self._decode(doc)

    def encode(self, txn: Txn, ns: str, record: R) -> Write:
        return Write(self._encode(record), self._ttl_s(record, txn.now))


#: Sticky stops of a workflow or a chain; no TTL of their own (a chain stop is
#: saved with its chain's life by :func:`chain_stop`).
STOPS: Plain[Stop] = Plain(lambda d: Stop(**d), shallow_doc, lambda _s, _now: None)

#: A workflow's effect under one target key, kept until it expires.
EFFECTS: Plain[Effect] = Plain(
    lambda d: Effect(**d), Effect.to_doc, lambda e, now: ttl_until(e.expires_at, now)
)

#: The chain the last effect on a target belongs to, kept as long as that effect.
LINKS: Plain[Link] = Plain(
    lambda d: Link(**d), shallow_doc, lambda lk, now: ttl_until(lk.expires_at, now)
)


def chain_stop(chain: Chain) -> Plain[Stop]:
    """The stop mapper for ``chain``'s stop: kept as long as the chain lives."""
    return Plain(lambda d: Stop(**d), shallow_doc, lambda _s, now: ttl_until(chain.expires_at, now))


def window(ttl_s: float) -> Plain[Seen]:
    """The dedupe window of one event identity: the last content seen, for ``ttl_s``."""
    return Plain(lambda d: Seen(**d), shallow_doc, lambda _s, _now: ttl_s)


def subject_rate(ttl_s: float) -> Plain[RateLog]:
    """Proceeded activations of one subject, kept for the rate window ``ttl_s``."""
    return Plain(
        lambda d: RateLog(tuple(d["times"])),
        lambda r: {"times": list(r.times)},
        lambda _r, _now: ttl_s,
    )


def lineages(retention_s: float) -> Plain[Lineage]:
    """What a task has paged through under a cursor check, kept for ``retention_s``."""
    return Plain(Lineage.from_doc, Lineage.to_doc, lambda _lin, _now: retention_s)


def require_chain_in_scope(txn: Txn, principal: Principal, ns: str, chain_id: str) -> None:
    """A request that ties itself to a chain (a task, a begin) may name only a chain
    of a workflow the token covers: else it would learn that chain's stop, and a
    stop scoped to the other workflow would stop it. A chain no longer stored
    (expired) ties nothing and is let through.

    :raises Forbidden: the chain belongs to a workflow outside the token's scope.
    """
    chain = txn.read(_ANY_CHAIN, keys.chain(ns, chain_id))
    if chain is not None:
        principal.require(chain.workflow, of_record=True)


def covering_stop(
    txn: Txn, ns: str, workflow: str | None, chain_id: str | None
) -> StopScope | None:
    """The sticky stop covering a request of ``workflow`` in ``chain_id``
    (:func:`sidecar.core.stops.covering`); the chain's stop is read only when
    the workflow is not stopped."""
    wf_stop = txn.read(STOPS, keys.workflow_stop(workflow)) if workflow is not None else None
    if wf_stop is not None or chain_id is None:
        return covering(wf_stop, None)
    return covering(None, txn.read(STOPS, keys.chain_stop(ns, chain_id)))

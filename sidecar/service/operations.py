"""The operation ledger service: keys, transactions and plans around
:mod:`sidecar.core.operations`.

Namespaces (DESIGN §1): an operation id lives in its workflow's namespace
(``<ns>:op:<wf>/<id>``), so two workflows using one id make two operations
and no workflow can block or probe another's ids. ``scope: "shared"`` on a
begin (and a begin naming no workflow) uses the one shared namespace
(``<ns>:op:<id>``), which needs a token holding every workflow. A route
naming a workflow looks in that workflow's namespace first, then in the
shared one for a record of the same workflow (shared begins, and records
made before namespaces existed), so no committed write is forgotten.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sidecar.auth import Principal
from sidecar.canonical import Fingerprinter
from sidecar.core import operations as core
from sidecar.core.operations import (
    BeginDecision,
    BeginOutcome,
    BeginReason,
    BeginRequest,
    CheckFinding,
    FailOutcome,
    Operation,
    OperationPolicy,
    OperationState,
    ReconcileOutcome,
)
from sidecar.errors import Forbidden, ValidationFailed
from sidecar.service import keys, mappers, records
from sidecar.service.check_service import CheckService
from sidecar.service.mappers import Operations, covering_stop
from sidecar.service.records import Txn
from sidecar.store import Store

log = logging.getLogger("loopstop")


@dataclass(frozen=True)
class BeginInput:
    """The validated ``begin`` body (``payload`` as sent: only its fingerprints are kept)."""

    payload: Any
    workflow: str | None
    task_id: str | None
    chain_id: str | None
    lease_s: float | None
    reconcile: dict[str, Any] | None = None
    shared: bool = False


@dataclass(frozen=True)
class Begun:
    """A decided ``begin`` and its payload's fingerprint prefix, for the decision log."""

    outcome: BeginOutcome
    payload_fp: str


@dataclass(frozen=True)
class Page:
    """One page of a listing; ``next_cursor`` is None on the last page."""

    items: list[Operation]
    next_cursor: str | None


class OperationService:
    """Runs ledger decisions as store transactions.

    :param store: the store every worker shares.
    :param fingerprinter: payload fingerprints (current and previous secrets).
    :param policy: attempts and retention.
    :param default_lease_s: the lease when ``begin`` names none.
    :param clock: epoch seconds; read once per request, before the transaction.
    :param checks: the check service, which runs a begin's reconcile check.
    """

    def __init__(
        self,
        store: Store,
        fingerprinter: Fingerprinter,
        policy: OperationPolicy,
        default_lease_s: float,
        clock: Callable[[], float],
        checks: CheckService | None = None,
    ) -> None:
        self.checks = checks
        self.store = store
        self.fingerprinter = fingerprinter
        self.policy = policy
        self.default_lease_s = default_lease_s
        self.clock = clock
        self.records = Operations(policy)
        self._counts: dict[str, tuple[int, float]] = {}
        self._counts_lock = threading.Lock()

    # -- records -----------------------------------------------------------

    def find(
        self, txn: Txn, ns: str, operation_id: str, workflow: str | None
    ) -> tuple[str, Operation | None]:
        """Where the operation ``operation_id`` of ``workflow`` is (or would be)
        kept, and its record (see :meth:`.mappers.Operations.locate`)."""
        return self.records.locate(txn, ns, (operation_id, workflow))

    def resolve_workflow(self, principal: Principal, workflow: str | None) -> str | None:
        """The workflow a route naming an operation acts for (DESIGN §1).

        Given: it must be in scope. Omitted: the token's only workflow, or
        the shared namespace for a token holding every workflow.

        :raises Forbidden: the workflow is outside the scope, or a token
            scoped to several workflows names none.
        """
        if workflow is None and principal.workflows is not None:
            if len(principal.workflows) == 1:
                (workflow,) = principal.workflows
            else:
                raise Forbidden(
                    f"token {principal.name!r} holds several workflows: name the operation's "
                    "workflow"
                )
        principal.require(workflow)
        return workflow

    def open_count(self, ns: str, workflow: str | None) -> int:
        """Open operations of ``workflow`` (the shared namespace: all of them).

        Read fresh when near the bound; far below it, a count read less than
        a second ago (plus the begins this worker made since) is enough.
        """
        index = keys.open_operations(ns, workflow)
        with self._counts_lock:
            cached = self._counts.get(index)
        now = time.monotonic()
        if cached is not None:
            count, at = cached
            if now - at < 1.0 and count < self.policy.max_open_per_workflow // 2:
                return count
        count = self.store.index_count(index)
        with self._counts_lock:
            if len(self._counts) > 10_000:
                self._counts.clear()
            self._counts[index] = (count, now)
        return count

    def opened(self, ns: str, workflow: str | None) -> None:
        """Count one operation this worker opened in the cached count of ``workflow``."""
        index = keys.open_operations(ns, workflow)
        with self._counts_lock:
            cached = self._counts.get(index)
            if cached is not None:
                self._counts[index] = (cached[0] + 1, cached[1])

    # -- decisions ---------------------------------------------------------

    def begin(self, principal: Principal, ns: str, operation_id: str, body: BeginInput) -> Begun:
        """Decide a ``begin`` atomically (DESIGN §1).

        :raises ValidationFailed: a payload with no RFC 8785 form, or a
            reconcile check that cannot settle a write (:meth:`require_reconcile_check`).
        :raises Forbidden: the token may not act for the request's workflow,
            or a shared begin comes from a token that does not hold every workflow.
        :raises TooManyOpen: the workflow holds ``max_open_per_workflow`` open operations.
        :raises StoreUnavailable: fail closed.
        """
        try:
            fingerprints = self.fingerprinter.fingerprints(body.payload)
        except ValueError as exc:
            raise ValidationFailed([{"loc": ["body", "payload"], "msg": str(exc)}]) from exc
        if body.reconcile is not None:
            self.require_reconcile_check(principal, body.reconcile["check"], body.workflow)
        principal.require(body.workflow)
        if body.shared and principal.workflows is not None:
            raise Forbidden(
                f"token {principal.name!r} does not hold every workflow: it may not use the "
                'shared namespace (scope: "shared")'
            )
        outcome = self._begin(principal, ns, operation_id, body, fingerprints)
        return Begun(outcome, fingerprints[self.fingerprinter.current.id][:16])

    def _begin(
        self,
        principal: Principal,
        ns: str,
        operation_id: str,
        body: BeginInput,
        fingerprints: dict[str, str],
    ) -> BeginOutcome:
        now = self.clock()
        req = BeginRequest(
            operation_id=operation_id,
            fingerprints=fingerprints,
            secret_id=self.fingerprinter.current.id,
            workflow=body.workflow,
            task_id=body.task_id,
            chain_id=body.chain_id,
            lease_s=body.lease_s or self.default_lease_s,
            reconcile_check=body.reconcile,
        )
        space = None if body.shared else body.workflow
        declared = self.records.keys(ns, (operation_id, space))
        if body.workflow is not None:
            declared.append(keys.workflow_stop(body.workflow))
        if body.chain_id is not None:
            declared += [keys.chain_stop(ns, body.chain_id), keys.chain(ns, body.chain_id)]
        open_count = self.open_count(ns, body.workflow)

        def step(txn: Txn, finding: CheckFinding | None = None) -> BeginOutcome:
            key, op = self.find(txn, ns, operation_id, space)
            if op is None and body.chain_id is not None:
                mappers.require_chain_in_scope(txn, principal, ns, body.chain_id)
            workflow = op.workflow if op and op.workflow else body.workflow
            chain_id = op.chain_id if op and op.chain_id else body.chain_id
            stopped = core.stopped_by(covering_stop(txn, ns, workflow, chain_id))
            if stopped is None:
                core.check_open_room(op, body.workflow, open_count, self.policy)
            if finding is None:
                new, outcome = core.begin(op, req, self.policy, txn.now, stopped)
            else:
                new, outcome = core.begin_after_check(
                    op, req, finding, self.policy, txn.now, stopped
                )
            txn.save(self.records, ns, key, new, op)
            return outcome

        # Most begins are of a new id: the store may decide on "absent" and
        # let its compare-and-set check it (one round trip on Redis).
        outcome = records.run(self.store, declared, step, now, absent_likely=True)
        if outcome.decision is BeginDecision.EXECUTE:
            self.opened(ns, body.workflow)
        recorded = outcome.operation if outcome.reason is not BeginReason.NEW else None
        spec, ignored = core.reconcile_check_of(recorded, body.reconcile)
        if ignored:
            log.warning(
                "operation %r: the begin's reconcile check differs from the one recorded by "
                "the begin that reserved it; the recorded one is used",
                operation_id,
            )
        if outcome.decision is BeginDecision.RECONCILE and spec is not None:
            asked_about = outcome.operation
            finding = self.ask_receiver(dict(spec), principal, body.workflow)
            if finding is not None and asked_about is not None:
                finding = replace(
                    finding, attempt=asked_about.attempt, updated_at=asked_about.updated_at
                )
                checked = finding
                outcome = records.run(
                    self.store, declared, lambda txn: step(txn, checked), self.clock()
                )
        return outcome

    def require_reconcile_check(
        self, principal: Principal, name: str, workflow: str | None
    ) -> None:
        """A begin's reconcile check must exist, ask the system of record
        (:func:`sidecar.core.operations.asks_system_of_record`) and be open to
        the begin's workflow.

        :raises ValidationFailed: no such check, or one that asks nothing of
            the system of record (``body.reconcile.check``).
        :raises Forbidden: the check is not open to ``workflow``, or (absent or
            closed alike) not to a scoped token's workflows.
        """
        loc = ["body", "reconcile", "check"]
        scoped = principal.workflows is not None
        if scoped and (self.checks is None or not self.checks.is_open(principal, name)):
            # A scoped token learns nothing of a check outside its workflows, not even
            # whether it exists or what it asks: one answer for absent and closed.
            raise Forbidden(f"check {name!r} is not open to token {principal.name!r}'s workflows")
        if self.checks is None or name not in self.checks:
            raise ValidationFailed([{"loc": loc, "msg": f"no check named {name!r}"}])
        if not self.may_reconcile(name):
            raise ValidationFailed(
                [
                    {
                        "loc": loc,
                        "msg": f"check {name!r} does not ask the system of record: only an "
                        "http check (or all/any holding one) may settle an unknown write",
                    }
                ]
            )
        if not self.checks.is_open(principal, name, workflow):
            raise Forbidden(
                f"check {name!r} is not open to workflow {workflow!r} (its workflows list)"
            )

    def may_reconcile(self, name: str) -> bool:
        """True when check ``name`` asks the system of record (it may settle a write)."""
        if self.checks is None:
            return False
        return core.asks_system_of_record(name, self.checks.shapes)

    def ask_receiver(
        self, spec: dict[str, Any], principal: Principal, workflow: str | None
    ) -> CheckFinding | None:
        """Run a reconcile check through the check service, outside any transaction;
        None when it cannot run here (unknown, reading the store, asking nothing of
        the system of record, or not open to ``workflow``).

        :raises ChecksBusy: too many checks are asking systems of record.
        """
        name = spec.get("check")
        if not isinstance(name, str) or self.checks is None or name not in self.checks:
            return None
        if self.checks.needs_store(name) or not self.may_reconcile(name):
            return None
        if not self.checks.is_open(principal, name, workflow):
            return None
        result = self.checks.run_outside(name, spec.get("input"))
        return CheckFinding.of(name, result.passed, str(result.reason), result.evidence)

    def commit(
        self,
        principal: Principal,
        ns: str,
        operation_id: str,
        attempt: int,
        receipt: Any,
        result: Any,
        workflow: str | None = None,
    ) -> Operation:
        """Record the write of ``attempt`` as committed with ``receipt``.

        :param workflow: the workflow the begin gave (see :meth:`resolve_workflow`).
        :raises NotFound, StaleAttempt, StateConflict, Forbidden, StoreUnavailable:
            see :func:`sidecar.core.operations.commit`.
        """
        # Likely what this process wrote at the begin: decided on that, checked.
        return self._settle(
            principal,
            ns,
            operation_id,
            workflow,
            lambda op, now: core.commit(op, operation_id, attempt, receipt, result, now),
            recent_likely=True,
        )

    def fail(
        self,
        principal: Principal,
        ns: str,
        operation_id: str,
        attempt: int,
        outcome: FailOutcome,
        detail: str | None,
        workflow: str | None = None,
    ) -> Operation:
        """Record that ``attempt`` failed, with what is known of the outcome.

        :raises NotFound, StaleAttempt, StateConflict, Forbidden, StoreUnavailable:
            see :func:`sidecar.core.operations.fail`.
        """
        return self._settle(
            principal,
            ns,
            operation_id,
            workflow,
            lambda op, now: core.fail(op, operation_id, attempt, outcome, detail, now),
        )

    def release(
        self,
        principal: Principal,
        ns: str,
        operation_id: str,
        attempt: int,
        detail: str,
        workflow: str | None = None,
    ) -> Operation:
        """Give back ``attempt``, which nobody was handed (the model gate began a
        write it then did not relay).

        :raises NotFound, StaleAttempt, StateConflict, Forbidden, StoreUnavailable:
            see :func:`sidecar.core.operations.release`.
        """
        return self._settle(
            principal,
            ns,
            operation_id,
            workflow,
            lambda op, now: core.release(op, operation_id, attempt, detail, now),
        )

    def reconcile(
        self,
        principal: Principal,
        ns: str,
        operation_id: str,
        outcome: ReconcileOutcome,
        receipt: Any,
        evidence: Any,
        workflow: str | None = None,
    ) -> Operation:
        """Settle an operation whose outcome was unknown; records evidence and actor.

        :raises NotFound, StateConflict, Forbidden, StoreUnavailable:
            see :func:`sidecar.core.operations.reconcile`.
        """
        return self._settle(
            principal,
            ns,
            operation_id,
            workflow,
            lambda op, now: core.reconcile(
                op, operation_id, outcome, receipt, evidence, principal.name, now
            ),
        )

    def _settle(
        self,
        principal: Principal,
        ns: str,
        operation_id: str,
        workflow: str | None,
        step: Callable[[Operation, float], tuple[Operation | None, Operation]],
        *,
        recent_likely: bool = False,
    ) -> Operation:
        """Commit, fail and reconcile: one scoped record, one core ``step``
        ``(record, now) -> (record to store or None, record to answer)``.

        :param workflow: the workflow the begin gave (see :meth:`resolve_workflow`).
        """
        workflow = self.resolve_workflow(principal, workflow)
        return records.update(
            self.store,
            self.records,
            ns,
            (operation_id, workflow),
            principal,
            lambda op, txn: step(op, txn.now),
            self.clock(),
            recent_likely=recent_likely,
        )

    # -- reads -------------------------------------------------------------

    def get(
        self, principal: Principal, ns: str, operation_id: str, workflow: str | None = None
    ) -> Operation:
        """The record as it stands now (an expired lease shows as ``unknown``).

        :raises NotFound: no such operation in the workflow's namespace (the
            same answer whether it exists elsewhere or nowhere).
        :raises Forbidden: the named workflow is outside the scope.
        """
        workflow = self.resolve_workflow(principal, workflow)
        ident = (operation_id, workflow)
        docs = self.store.get_many(self.records.keys(ns, ident))
        _, found = self.records.locate(records.Txn.reading(docs, self.clock()), ns, ident)
        op = self.records.authorize(principal, found, ident)
        return core.observe(op, self.clock())

    def list_open(
        self,
        principal: Principal,
        ns: str,
        state: OperationState,
        workflow: str | None,
        cursor: str | None,
        limit: int,
    ) -> Page:
        """List ``unknown`` (the reconciliation queue) or ``in_progress`` operations.

        Ordered by when the lease ended (or will end), oldest first.

        :param cursor: the ``next_cursor`` of the previous page.
        :raises Forbidden: ``workflow`` is outside the token's scope.
        :raises ValidationFailed: a scoped token names no workflow while it
            has several, or the cursor is not one this server issued.
        """
        now = self.clock()
        if workflow is None and principal.workflows is not None:
            if len(principal.workflows) != 1:
                raise ValidationFailed(
                    [
                        {
                            "loc": ["query", "workflow"],
                            "msg": "required for a token scoped to several workflows",
                        }
                    ]
                )
            (workflow,) = principal.workflows
        if workflow is not None:
            principal.require(workflow)
        after = decode_cursor(cursor)
        index = keys.open_operations(ns, workflow)
        if state is OperationState.UNKNOWN:
            entries = self.store.index_page(index, max_score=now, after=after, limit=limit)
        else:
            entries = self.store.index_page(index, min_score=now, after=after, limit=limit)
        docs = self.store.get_many([keys.operation_at(ns, m) for m, _ in entries])
        items = []
        for member, _ in entries:
            op = Operation.from_doc(docs[keys.operation_at(ns, member)])
            if op is None:
                continue
            seen = core.observe(op, now)
            if seen.state is state and principal.allows(seen.workflow):
                items.append(seen)
        full = len(entries) == limit
        return Page(items, encode_cursor(entries[-1][1], entries[-1][0]) if full else None)


def encode_cursor(score: float, member: str) -> str:
    """An opaque page cursor: base64url of ``[score, member]``."""
    raw = json.dumps([score, member], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> tuple[float, str] | None:
    """:raises ValidationFailed: when the cursor was not made by :func:`encode_cursor`."""
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        score, member = json.loads(raw)
        if not isinstance(member, str) or not isinstance(score, int | float):
            raise ValueError
        member.encode("utf-8")
        score = float(score)
        if not math.isfinite(score):
            raise ValueError
        return score, member
    except (ValueError, TypeError, OverflowError, binascii.Error, UnicodeError):
        error = {"loc": ["query", "cursor"], "msg": "not a valid cursor"}
        raise ValidationFailed([error]) from None

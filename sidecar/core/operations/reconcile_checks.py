"""Reconcile checks (DESIGN §1): which check a begin that finds an operation
``unknown`` may run (the first begin's), which checks ask the system of record
and so may settle a write, and the begin decided on what the check found."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sidecar.canonical import canonical_json
from sidecar.core.operations.ledger import begin, observe, reconcile, same_payload
from sidecar.core.operations.records import (
    BeginDecision,
    BeginOutcome,
    BeginReason,
    BeginRequest,
    Operation,
    OperationPolicy,
    OperationState,
    ReconcileOutcome,
)


def reconcile_check_of(
    op: Operation | None, requested: Mapping[str, Any] | None
) -> tuple[Mapping[str, Any] | None, bool]:
    """The reconcile check to run for an unknown outcome, and whether the
    request's own was ignored.

    The check and input recorded by the begin that reserved the operation
    are the ones used: a later begin naming another (an input pointing at
    some other record could "prove" the write absent) is never used.

    :returns: ``(spec, ignored)``; ``ignored`` is True when the request named
        a reconcile check that differs from the recorded one.
    """
    if op is None:
        return requested, False
    recorded = op.reconcile_check
    ignored = requested is not None and (
        recorded is None or canonical_json(dict(requested)) != canonical_json(recorded)
    )
    return recorded, ignored


#: Check kinds that ask the system of record (an outside request).
ASKING_KINDS = frozenset({"http"})


def asks_system_of_record(
    name: str, checks: Mapping[str, tuple[str, Sequence[str]]], _depth: int = 0
) -> bool:
    """True when check ``name`` can only pass or prove absence by asking the
    system of record, so that it may settle a write whose outcome is unknown.

    ``http`` asks; ``all`` asks when one of its parts asks (every part must
    pass); ``any`` asks only when every part asks (any one part passing
    decides, so a part that asks nothing could settle the write alone). A
    schema, a cursor or an operations check asks nothing and never may.

    :param checks: name -> ``(kind, parts)`` of every configured check.
    """
    entry = checks.get(name)
    if entry is None or _depth > 32:
        return False
    kind, parts = entry
    if kind in ASKING_KINDS:
        return True
    if kind == "all":
        return any(asks_system_of_record(p, checks, _depth + 1) for p in parts)
    if kind == "any":
        return bool(parts) and all(asks_system_of_record(p, checks, _depth + 1) for p in parts)
    return False


@dataclass(frozen=True)
class CheckFinding:
    """What a reconcile check found at the receiver.

    :ivar found: the record is there as the write would have left it.
    :ivar absent: the receiver proved it is not there (404 / 410).
    :ivar attempt: the attempt the check was asked about, with ``updated_at``
        the version of the record it saw: a finding about an older version
        (another begin settled it, or a newer attempt ran meanwhile) is stale.
    """

    check: str
    found: bool
    absent: bool
    evidence: dict[str, Any]
    attempt: int | None = None
    updated_at: float | None = None

    @classmethod
    def of(cls, check: str, passed: bool, reason: str, evidence: dict[str, Any]) -> CheckFinding:
        """Read a check's verdict: passed means found; the receiver answering
        404 or 410 for the record proves it absent; anything else decides nothing
        (an assertion that failed means the record exists in another state)."""
        absent = reason == "unexpected_status" and evidence.get("status") in (404, 410)
        return cls(check, passed, absent, evidence)


def begin_after_check(
    op: Operation | None,
    req: BeginRequest,
    finding: CheckFinding,
    policy: OperationPolicy,
    now: float,
    stopped: BeginReason | None = None,
) -> tuple[Operation | None, BeginOutcome]:
    """A ``begin`` that found the operation ``unknown`` and asked the receiver.

    Applied with a compare-and-set after the check ran outside the store
    transaction: if the record is no longer the version the check was asked
    about (``finding.attempt`` / ``finding.updated_at``), or no longer
    unknown, the check's finding is ignored and ``begin`` decides on what is
    stored. Found -> committed -> ``replay``; proven absent -> not committed -> ``execute`` (attempt
    + 1, within ``max_attempts``); undecided -> ``reconcile``.
    """
    if op is None or stopped is not None:
        return begin(op, req, policy, now, stopped)
    if (finding.attempt, finding.updated_at) != (op.attempt, op.updated_at):
        # The record changed while the check ran: what it found is about
        # another version (a later attempt may have written since). Decide on
        # what is stored; the next begin asks again.
        return begin(op, req, policy, now, stopped)
    seen = observe(op, now)
    if seen.state is not OperationState.UNKNOWN or not same_payload(op, req.fingerprints):
        return begin(op, req, policy, now, stopped)
    actor = f"check:{finding.check}"
    if finding.found:
        settled, _ = reconcile(
            op,
            op.operation_id,
            ReconcileOutcome.COMMITTED,
            {"check": finding.check, "evidence": finding.evidence},
            finding.evidence,
            actor,
            now,
        )
        assert settled is not None
        return settled, BeginOutcome(
            BeginDecision.REPLAY, BeginReason.RECONCILED_COMMITTED, settled
        )
    if finding.absent:
        settled, _ = reconcile(
            op, op.operation_id, ReconcileOutcome.NOT_COMMITTED, None, finding.evidence, actor, now
        )
        assert settled is not None
        new, out = begin(settled, req, policy, now)
        if out.decision is BeginDecision.EXECUTE:
            return new, replace(out, reason=BeginReason.RECONCILED_NOT_COMMITTED)
        return new or settled, out
    return begin(op, req, policy, now)

"""The operation ledger's state machine (DESIGN §1), as pure functions.

An *operation* is one business action ("confirm order 42 version 3"), named
by the caller's idempotency key (``operation_id``), never one attempt. The
ledger guarantees that a write which happened is never repeated: a retry of
a committed operation is answered with the recorded receipt (``replay``),
and a write whose outcome is unknown (a timeout, a lost response, a worker
that died holding the lease) is never re-executed automatically: it waits
for reconciliation. This follows the IETF draft "The Idempotency-Key HTTP
Header Field" (a key names the operation; a reuse with another payload is a
conflict) and fencing tokens (the ``attempt`` number: a late answer from a
superseded attempt changes nothing).

Every function takes the current record (or None), the request, the
policy and ``now`` (epoch seconds), and returns ``(new_record, outcome)``
where ``new_record`` is None when nothing changes. No I/O, no clock.

States::

    (none) --begin--> in_progress --commit--> committed
    in_progress --fail not_committed--> not_committed --begin--> in_progress (attempt + 1)
    in_progress --release (an attempt never handed out)--> not_committed (attempt - 1)
    in_progress --fail unknown, or lease expiry (seen by begin or a read)--> unknown
    unknown --reconcile committed--> committed
    unknown --reconcile not_committed--> not_committed

Once ``unknown``, an operation leaves only through reconciliation (evidence,
or a reconcile check that asked the system of record): a later ``fail`` is
a conflict, whatever it claims. The reconcile check recorded by the begin
that reserved the operation is the one used; only a check that asks the
system of record (:func:`asks_system_of_record`) may settle a write.

Where each part lives:

- :mod:`~sidecar.core.operations.records`: states, decisions, reasons, the
  record, a begin request, the policy (and :func:`stopped_by`);
- :mod:`~sidecar.core.operations.ledger`: :func:`begin`, :func:`commit`,
  :func:`fail`, :func:`release`, :func:`reconcile`, :func:`observe`, :func:`check_open_room`,
  :func:`retention_s`;
- :mod:`~sidecar.core.operations.reconcile_checks`: :func:`reconcile_check_of`,
  :func:`asks_system_of_record`, :class:`CheckFinding`, :func:`begin_after_check`.

Every public name is importable from this package.
"""

from sidecar.core.operations.ledger import (
    begin,
    check_open_room,
    commit,
    fail,
    observe,
    reconcile,
    release,
    retention_s,
    same_payload,
)
from sidecar.core.operations.reconcile_checks import (
    ASKING_KINDS,
    CheckFinding,
    asks_system_of_record,
    begin_after_check,
    reconcile_check_of,
)
from sidecar.core.operations.records import (
    DEFAULT_LEASE_S,
    OPEN_STATES,
    BeginDecision,
    BeginOutcome,
    BeginReason,
    BeginRequest,
    FailOutcome,
    Operation,
    OperationPolicy,
    OperationState,
    ReconcileOutcome,
    stopped_by,
)

__all__ = [
    "ASKING_KINDS",
    "DEFAULT_LEASE_S",
    "OPEN_STATES",
    "BeginDecision",
    "BeginOutcome",
    "BeginReason",
    "BeginRequest",
    "CheckFinding",
    "FailOutcome",
    "Operation",
    "OperationPolicy",
    "OperationState",
    "ReconcileOutcome",
    "asks_system_of_record",
    "begin",
    "begin_after_check",
    "check_open_room",
    "commit",
    "fail",
    "observe",
    "reconcile",
    "reconcile_check_of",
    "release",
    "retention_s",
    "same_payload",
    "stopped_by",
]

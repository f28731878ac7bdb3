"""What a task decision can answer (DESIGN §3): statuses, end reasons, the
actions an envelope allows next, and one closed enum per route's decision.

Every decision and reason a task route answers is a member of an enum here,
so metrics, logs and responses share one vocabulary and a typo is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.core.operations import Operation


class TaskStatus(StrEnum):
    """A task's status: ``running`` until it has an envelope, then the envelope's."""

    RUNNING = "running"
    COMPLETED = "completed"
    PARTIAL = "partial"
    STOPPED = "stopped"
    BLOCKED = "blocked"
    NEEDS_HUMAN = "needs_human"
    NEEDS_RECONCILIATION = "needs_reconciliation"


class EndReason(StrEnum):
    """Why a task ended (DESIGN §3 envelope table)."""

    VERIFIED_DONE = "verified_done"
    DEADLINE = "deadline"
    MODEL_BUDGET = "model_budget"
    TOOL_BUDGET = "tool_budget"
    TOKEN_BUDGET = "token_budget"
    COST_BUDGET = "cost_budget"
    POLL_BUDGET = "poll_budget"
    POLL_STALLED = "poll_stalled"
    RETRY_BUDGET = "retry_budget"
    SAME_CALL = "same_call"
    CYCLE = "cycle"
    NO_PROGRESS = "no_progress"
    OPERATOR_STOP = "operator_stop"
    CHAIN_STOPPED = "chain_stopped"
    WORKFLOW_STOPPED = "workflow_stopped"
    OUTLIER = "outlier"
    POLICY_DENIED = "policy_denied"
    OPERATION_CONFLICT = "operation_conflict"
    FATAL_RESULT = "fatal_result"
    UNVERIFIED_RESULT = "unverified_result"
    INVALID_EVIDENCE = "invalid_evidence"
    INVALID_CALL = "invalid_call"
    HUMAN_INPUT = "human_input"
    UNKNOWN_COMMIT = "unknown_commit"
    RETRY_AFTER_COMMIT = "retry_after_commit"


_BY_STATUS: dict[TaskStatus, tuple[EndReason, ...]] = {
    TaskStatus.COMPLETED: (EndReason.VERIFIED_DONE,),
    TaskStatus.PARTIAL: (
        EndReason.DEADLINE,
        EndReason.MODEL_BUDGET,
        EndReason.TOOL_BUDGET,
        EndReason.TOKEN_BUDGET,
        EndReason.COST_BUDGET,
        EndReason.POLL_BUDGET,
        EndReason.POLL_STALLED,
        EndReason.RETRY_BUDGET,
        EndReason.SAME_CALL,
        EndReason.CYCLE,
        EndReason.NO_PROGRESS,
    ),
    TaskStatus.STOPPED: (
        EndReason.OPERATOR_STOP,
        EndReason.CHAIN_STOPPED,
        EndReason.WORKFLOW_STOPPED,
        EndReason.OUTLIER,
    ),
    TaskStatus.BLOCKED: (
        EndReason.POLICY_DENIED,
        EndReason.OPERATION_CONFLICT,
        EndReason.FATAL_RESULT,
        EndReason.UNVERIFIED_RESULT,
        EndReason.INVALID_EVIDENCE,
        EndReason.INVALID_CALL,
    ),
    TaskStatus.NEEDS_HUMAN: (EndReason.HUMAN_INPUT,),
    TaskStatus.NEEDS_RECONCILIATION: (EndReason.UNKNOWN_COMMIT, EndReason.RETRY_AFTER_COMMIT),
}

#: The terminal status of each end reason.
STATUS_OF: dict[EndReason, TaskStatus] = {
    reason: status for status, reasons in _BY_STATUS.items() for reason in reasons
}


class NextAction(StrEnum):
    """What the caller may do with an ended task (``allowed_next_actions``)."""

    RETURN_RESULT = "return_result"
    RETURN_PARTIAL = "return_partial"
    CHANGE_STRATEGY = "change_strategy"
    HUMAN_REVIEW = "human_review"
    REQUEST_APPROVAL = "request_approval"
    QUERY_OPERATION_STATUS = "query_operation_status"
    RECONCILE = "reconcile"


_A = NextAction
#: Allowed next actions by status; never a blind retry of an uncertain write.
NEXT_ACTIONS: dict[TaskStatus, tuple[NextAction, ...]] = {
    TaskStatus.COMPLETED: (_A.RETURN_RESULT,),
    TaskStatus.PARTIAL: (_A.RETURN_PARTIAL, _A.CHANGE_STRATEGY, _A.HUMAN_REVIEW),
    TaskStatus.STOPPED: (_A.RETURN_PARTIAL, _A.HUMAN_REVIEW),
    TaskStatus.BLOCKED: (_A.RETURN_PARTIAL, _A.CHANGE_STRATEGY, _A.HUMAN_REVIEW),
    TaskStatus.NEEDS_HUMAN: (_A.REQUEST_APPROVAL, _A.HUMAN_REVIEW),
    TaskStatus.NEEDS_RECONCILIATION: (_A.QUERY_OPERATION_STATUS, _A.RECONCILE, _A.HUMAN_REVIEW),
}


class ModelDecision(StrEnum):
    """``POST /v1/tasks/{id}/model-calls``: the turn may call the model, or not."""

    ADMIT = "admit"
    DENY = "deny"


class TurnDecision(StrEnum):
    """How the model gate decided a turn it relayed (DESIGN §5): admitted or
    denied as a task's model call, ``untracked`` (no task named: relayed,
    counted nowhere), a proposed tool call denied, or the upstream failed."""

    ADMIT = "admit"
    DENY = "deny"
    UNTRACKED = "untracked"
    DENY_TOOL_CALL = "deny_tool_call"
    UPSTREAM_ERROR = "upstream_error"


class TurnReason(StrEnum):
    """Reasons of a model-gate turn that are not a task's: an admitted turn
    nears a budget (``wrap_up``), or how the upstream failed."""

    WRAP_UP = "wrap_up"
    ERROR_EVENT = "error_event"
    BAD_UPSTREAM_RESPONSE = "bad_upstream_response"
    TIMEOUT = "timeout"
    UPSTREAM_STREAM_CUT = "upstream_stream_cut"
    ANSWER_TOO_LARGE = "answer_too_large"  # past model_gate.max_answer_bytes
    STORE_UNAVAILABLE = "store_unavailable"  # the store failed once the stream had begun
    GATE_ERROR = "gate_error"  # anything else failed once the stream had begun


class ToolDecision(StrEnum):
    """``POST /v1/tasks/{id}/tool-calls``."""

    EXECUTE = "execute"
    REPLAY = "replay"
    DENY = "deny"


class DenyReason(StrEnum):
    """A denial that does not end the task."""

    IN_PROGRESS = "in_progress"  # another worker is writing the same operation
    DUPLICATE_CALL = "duplicate_call"  # a call id given twice in one proposal, or still pending


class ResultDecision(StrEnum):
    """``POST .../tool-calls/{call_id}/result``: recorded, or the task has ended."""

    RECORDED = "recorded"
    ENDED = "ended"


class CompleteDecision(StrEnum):
    """``POST /v1/tasks/{id}/complete``."""

    COMPLETED = "completed"
    CONTINUE = "continue"
    ENDED = "ended"


class CompleteReason(StrEnum):
    """The reason of a ``continue`` answer to ``complete``."""

    CHECK_FAILED = "check_failed"


class LifecycleDecision(StrEnum):
    """What the create, stop and resume routes log."""

    CREATED = "created"
    EXISTING = "existing"
    STOPPED = "stopped"
    RESUMED = "resumed"


@dataclass(frozen=True)
class ModelOutcome:
    """A model turn's admission. ``reason`` is set when denied."""

    decision: ModelDecision
    wrap_up: bool
    reason: EndReason | None

    @property
    def admitted(self) -> bool:
        return self.decision is ModelDecision.ADMIT


@dataclass(frozen=True)
class ToolOutcome:
    """A tool call's admission.

    :ivar operation: the write's ledger record (a replay's receipt and result).
    """

    decision: ToolDecision
    reason: EndReason | DenyReason | None
    call_id: str | None = None
    operation: Operation | None = None


@dataclass(frozen=True)
class ResultOutcome:
    """What recording a result did.

    :ivar reason: the task's end reason when it has ended.
    :ivar ended_now: this result ended it (not an earlier decision).
    """

    decision: ResultDecision
    reason: EndReason | None
    ended_now: bool = True


@dataclass(frozen=True)
class CompleteOutcome:
    decision: CompleteDecision
    reason: EndReason | CompleteReason | None

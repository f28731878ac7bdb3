"""Request and response models of the task guard (DESIGN §3)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from sidecar.api.models import Name, OperationId, RequestBody, rfc3339, whole
from sidecar.config import LimitsOverride
from sidecar.core.check_verdicts import CheckResult
from sidecar.core.tasks import (
    CallKind,
    CompleteDecision,
    CompleteOutcome,
    Effect,
    Evidence,
    ModelDecision,
    ModelOutcome,
    ResultDecision,
    ResultOutcome,
    ResultStatus,
    Task,
    TaskStatus,
    ToolDecision,
    ToolOutcome,
    elapsed_s,
)
from sidecar.service.messages import message

TASK_ID_PATTERN = r"^t[0-9a-f]{20}$"
_CHAIN = r"^c[0-9a-f]{20}$"
#: A call id: generated (``k`` and 16 hex digits) or the caller's own.
CALL_ID_PATTERN = r"^[A-Za-z0-9._:@-]{1,200}$"


class TaskBody(RequestBody):
    """``POST /v1/tasks``: the same ``task_key`` returns the same task (200, not 201)."""

    task_key: Name | None = None  # whole string, NFC, no control characters
    workflow: Name | None = None
    chain_id: Annotated[str, Field(json_schema_extra={"pattern": _CHAIN}), whole(_CHAIN)] | None = (
        None
    )
    policy: Name | None = None
    limits: LimitsOverride = LimitsOverride()
    initial_revision: Annotated[int, Field(ge=0, le=2**53)] = Field(
        default=0, description="The validated revision the task starts at (default 0)."
    )


class ModelCallBody(RequestBody):
    tokens_used: Annotated[int, Field(ge=0, le=10**9)] | None = Field(
        default=None, description="Tokens the previous model turn used."
    )


class ToolCallBody(RequestBody):
    tool: Name
    kind: CallKind
    args: JsonValue = Field(default=None, description="Fingerprinted, never stored.")
    operation_id: OperationId | None = Field(default=None, description="Required for writes.")
    call_id: Annotated[str, Field(pattern=CALL_ID_PATTERN)] | None = Field(
        default=None,
        description="The caller's own id for this call: admitting the same id again answers "
        "the recorded decision and counts nothing.",
    )


class EvidenceBody(BaseModel):
    """Trusted evidence from the flow's own nodes (never the model's claim)."""

    model_config = ConfigDict(extra="forbid")

    revision: Annotated[int, Field(ge=0, le=2**53)] | None = None
    done: bool | None = None
    effect: Effect | None = Field(
        default=None, description="none (a read), committed, not_committed or unknown."
    )

    def core(self) -> Evidence:
        return Evidence(self.revision, self.done, self.effect)


class ResultBody(RequestBody):
    status: ResultStatus
    result: JsonValue = None
    receipt: JsonValue = None
    evidence: EvidenceBody | None = None


class CompleteBody(RequestBody):
    """With ``check`` (or the policy's ``exit_check``) the sidecar runs it on
    ``input``; without one, trusted ``evidence`` with ``done: true`` completes."""

    check: Name | None = None
    input: JsonValue = None
    evidence: EvidenceBody | None = None


class TaskStopBody(RequestBody):
    reason: Annotated[str, Field(min_length=1, max_length=500)]


class TaskResumeBody(RequestBody):
    reason: Annotated[str, Field(min_length=1, max_length=500)]
    extend: LimitsOverride | None = Field(default=None, description="Raise budgets (admin).")


class UsedView(BaseModel):
    model_calls: int
    tool_calls: int
    tokens: int
    polls: int
    replays: int
    retries: int
    idle: int
    cost: float
    reserved_cost: float
    per_tool: dict[str, int]
    elapsed_s: float


class TaskView(BaseModel):
    task_id: str
    task_key: str | None
    workflow: str | None
    chain_id: str | None
    policy: str | None
    attempt: int
    status: TaskStatus
    initial_revision: int
    validated_revision: int
    activations: int
    limits: dict[str, Any]
    used: UsedView
    created_at: str
    updated_at: str

    @classmethod
    def of(cls, task: Task, now: float) -> TaskView:
        """The task as shown at ``now`` (one validation, its ``used`` included)."""
        u = task.used
        return cls.model_validate(
            {
                "task_id": task.task_id,
                "task_key": task.task_key,
                "workflow": task.workflow,
                "chain_id": task.chain_id,
                "policy": task.policy,
                "attempt": task.attempt,
                "status": task.status,
                "initial_revision": task.initial_revision,
                "validated_revision": task.validated_revision,
                "activations": task.activations,
                "limits": task.limits.to_doc(),
                "used": {
                    "model_calls": u.model_calls,
                    "tool_calls": u.tool_calls,
                    "tokens": u.tokens,
                    "polls": u.polls,
                    "replays": u.replays,
                    "retries": u.retries,
                    "idle": u.idle,
                    "cost": u.cost,
                    "reserved_cost": u.reserved_cost,
                    "per_tool": dict(u.per_tool),
                    "elapsed_s": elapsed_s(task, now),
                },
                "created_at": rfc3339(task.created_at) or "",
                "updated_at": rfc3339(task.updated_at) or "",
            }
        )


class TaskResponse(BaseModel):
    task: TaskView
    envelope: dict[str, JsonValue] | None
    outlier: dict[str, JsonValue] | None = Field(
        default=None,
        description="Set once the task was flagged as a runaway (GET and stop answers).",
    )
    cancellation: dict[str, JsonValue] | None = Field(
        default=None,
        description="What the last task stop asked n8n and saw (GET and stop answers).",
    )
    gate_exchanges: list[dict[str, JsonValue]] = Field(
        default=[],
        description="The writes the model gate answered itself, without relaying them "
        "(`replay`: committed before, `in_progress`: another execution was writing it), "
        "put back into every later model request of the task (DESIGN §5.1; GET answers).",
    )
    executions: list[dict[str, JsonValue]] = Field(
        default=[],
        description="The n8n executions that acted for the task, as far as loopstop was "
        "told (`execution_id` of a request, a `loopstop-execution` line): a stop stops them.",
    )


class ModelCallResponse(TaskResponse):
    decision: ModelDecision
    wrap_up: bool
    reason: str | None
    message: str | None


class ToolCallResponse(TaskResponse):
    decision: ToolDecision
    call_id: str | None
    result: JsonValue
    receipt: JsonValue
    reason: str | None
    message: str | None


class CheckView(BaseModel):
    """A check's verdict: never passes by default."""

    passed: bool
    reason: str
    revision: int | None
    evidence: dict[str, JsonValue]


class ResultResponse(TaskResponse):
    decision: ResultDecision
    reason: str | None
    message: str | None
    check: CheckView | None = None


class CompleteResponse(TaskResponse):
    decision: CompleteDecision
    reason: str | None
    check: CheckView | None = None


#: What a task route decided: nothing but the task (create, get, stop, resume)
#: or one route's outcome.
TaskOutcome = ModelOutcome | ToolOutcome | ResultOutcome | CompleteOutcome | None


def check_view(checked: CheckResult | None) -> CheckView | None:
    """A check's verdict as shown, None when no check ran."""
    if checked is None:
        return None
    return CheckView(
        passed=checked.passed,
        reason=str(checked.reason),
        revision=checked.revision,
        evidence=checked.evidence,
    )


def render(
    task: Task,
    now: float,
    outcome: TaskOutcome = None,
    checked: CheckResult | None = None,
    **shown: Any,
) -> TaskResponse:
    """The one renderer of the task routes: the task (and its envelope once
    it ended) with what the route decided.

    A denial or an end carries its ``message`` (a result's only when it ended
    the task now); a replayed write carries the ledger's result and receipt.

    :param shown: ``outlier`` and ``cancellation`` (GET and stop answers).
    """
    envelope = None if task.envelope is None else task.envelope.to_doc()
    base: dict[str, Any] = {
        "task": TaskView.of(task, now),
        "envelope": envelope,
        # Given, not defaulted: pydantic deep-copies a list default on every answer.
        "gate_exchanges": [],
        "executions": [],
        **shown,
    }
    if outcome is None:
        return TaskResponse(**base)
    reason = None if outcome.reason is None else str(outcome.reason)
    match outcome:
        case ModelOutcome():
            return ModelCallResponse(
                **base,
                decision=outcome.decision,
                wrap_up=outcome.wrap_up,
                reason=reason,
                message=message(outcome.reason),
            )
        case ToolOutcome():
            op = outcome.operation if outcome.decision is ToolDecision.REPLAY else None
            return ToolCallResponse(
                **base,
                decision=outcome.decision,
                call_id=outcome.call_id,
                result=op.result if op else None,
                receipt=op.receipt if op else None,
                reason=reason,
                message=message(outcome.reason),
            )
        case ResultOutcome():
            ended_now = outcome.decision is ResultDecision.ENDED and outcome.ended_now
            return ResultResponse(
                **base,
                decision=outcome.decision,
                reason=reason,
                message=message(outcome.reason) if ended_now else None,
                check=check_view(checked),
            )
        case CompleteOutcome():
            return CompleteResponse(
                **base, decision=outcome.decision, reason=reason, check=check_view(checked)
            )

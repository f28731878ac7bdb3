"""Request and response models of the task guard (DESIGN §3)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from sidecar.api.models import Name, OperationId, RequestBody, rfc3339
from sidecar.config import LimitsOverride
from sidecar.core.guard import (
    CallKind,
    Evidence,
    ResultStatus,
    Task,
    TaskStatus,
    ToolDecision,
)

TASK_ID_PATTERN = r"^t[0-9a-f]{20}$"
CALL_ID_PATTERN = r"^k[0-9a-f]{16}$"


class TaskBody(RequestBody):
    """``POST /v1/tasks``: the same ``task_key`` returns the same task (200, not 201)."""

    task_key: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    workflow: Name | None = None
    chain_id: Annotated[str, Field(pattern=r"^c[0-9a-f]{20}$")] | None = None
    policy: Name | None = None
    limits: LimitsOverride = LimitsOverride()


class ModelCallBody(RequestBody):
    tokens_used: Annotated[int, Field(ge=0, le=10**9)] | None = Field(
        default=None, description="Tokens the previous model turn used."
    )


class ToolCallBody(RequestBody):
    tool: Name
    kind: CallKind
    args: JsonValue = Field(default=None, description="Fingerprinted, never stored.")
    operation_id: OperationId | None = Field(default=None, description="Required for writes.")


class EvidenceBody(BaseModel):
    """Trusted evidence from the flow's own nodes (never the model's claim)."""

    model_config = ConfigDict(extra="forbid")

    revision: Annotated[int, Field(ge=0, le=2**53)] | None = None
    done: bool | None = None
    effect: Literal["committed", "not_committed"] | None = None

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
    retries: int
    idle: int
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
    validated_revision: int | None
    limits: dict[str, Any]
    used: UsedView
    created_at: str
    updated_at: str

    @classmethod
    def of(cls, task: Task, now: float) -> TaskView:
        u = task.used
        return cls(
            task_id=task.task_id,
            task_key=task.task_key,
            workflow=task.workflow,
            chain_id=task.chain_id,
            policy=task.policy,
            attempt=task.attempt,
            status=task.status,
            validated_revision=task.validated_revision,
            limits=task.limits.to_doc(),
            used=UsedView(
                model_calls=u.model_calls,
                tool_calls=u.tool_calls,
                tokens=u.tokens,
                polls=u.polls,
                retries=u.retries,
                idle=u.idle,
                per_tool=dict(u.per_tool),
                elapsed_s=_elapsed(task, now),
            ),
            created_at=rfc3339(task.created_at) or "",
            updated_at=rfc3339(task.updated_at) or "",
        )


def _elapsed(task: Task, now: float) -> float:
    from sidecar.core.guard import elapsed_s

    return elapsed_s(task, now)


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


class ModelCallResponse(TaskResponse):
    decision: Literal["admit", "deny"]
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
    decision: Literal["recorded", "ended"]
    reason: str | None
    message: str | None
    check: CheckView | None = None


class CompleteResponse(TaskResponse):
    decision: Literal["completed", "continue", "ended"]
    reason: str | None
    check: CheckView | None = None

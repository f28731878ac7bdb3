"""Request and response models (pydantic v2): the HTTP contract in code.

Request bodies reject unknown fields (``extra="forbid"``) so that a typo in
a flow (``lease`` for ``lease_s``) is a 422, not a silently ignored setting.
The OpenAPI document at ``/openapi.json`` is generated from these models.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from sidecar.core.operations import (
    BeginDecision,
    BeginOutcome,
    BeginReason,
    FailOutcome,
    Operation,
    OperationState,
    ReconcileOutcome,
)

OPERATION_ID_PATTERN = r"^(?!\.{1,2}$)[A-Za-z0-9._:@-]{1,200}$"

OperationId = Annotated[str, Field(pattern=OPERATION_ID_PATTERN)]
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]
ExecutionModeField = Annotated[
    Literal["test", "production"],
    Field(description="n8n's `$execution.mode`; `test` requests live in their own namespace."),
]


ExecutionIdField = Annotated[
    str | None,
    Field(
        default=None,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="n8n's `$execution.id`: a chain or task stop stops the executions "
        "that acted for it.",
    ),
]


class RequestBody(BaseModel):
    """Base of every request body: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", regex_engine="python-re")

    execution_mode: ExecutionModeField = "production"
    execution_id: ExecutionIdField = None


class ReconcileSpec(BaseModel):
    """How a later ``begin`` asks the receiver when the outcome is unknown."""

    model_config = ConfigDict(extra="forbid")

    check: Name
    input: JsonValue = None


class BeginBody(RequestBody):
    """``POST /v1/operations/{operation_id}/begin``."""

    payload: JsonValue = Field(
        description="What the write sends; only its RFC 8785 fingerprint is kept."
    )
    workflow: Name | None = None
    task_id: Name | None = None
    chain_id: Name | None = None
    lease_s: Annotated[float, Field(gt=0, le=86_400)] | None = Field(
        default=None, description="Seconds this attempt holds the operation (default 60)."
    )
    reconcile: ReconcileSpec | None = Field(
        default=None,
        description="A configured check (and its input) a later begin runs when the "
        "outcome is unknown: found -> replay, proven absent -> execute.",
    )


class CommitBody(RequestBody):
    """``POST .../commit``: the attempt's write happened."""

    attempt: Annotated[int, Field(ge=1)]
    receipt: JsonValue = Field(description="The receiver's proof (an id, a Message-ID).")
    result: JsonValue = None


class FailBody(RequestBody):
    """``POST .../fail``: the attempt failed; ``unknown`` when nobody can tell."""

    attempt: Annotated[int, Field(ge=1)]
    outcome: FailOutcome
    detail: Annotated[str, Field(max_length=2000)] | None = None


class ReconcileBody(RequestBody):
    """``POST .../reconcile``: what the receiver says happened."""

    outcome: ReconcileOutcome
    receipt: JsonValue = None
    evidence: Annotated[
        JsonValue, Field(description="Required: what proves the outcome (recorded).")
    ]


class OperationListQuery(BaseModel):
    """``GET /v1/operations`` query string."""

    model_config = ConfigDict(extra="forbid")

    state: Literal["unknown", "in_progress"] = "unknown"
    workflow: Name | None = None
    cursor: Annotated[str, Field(max_length=2000)] | None = None
    limit: Annotated[int, Field(ge=1, le=500)] = 50
    execution_mode: ExecutionModeField = "production"


class ModeQuery(BaseModel):
    """Query string of single-record reads."""

    model_config = ConfigDict(extra="forbid")

    execution_mode: ExecutionModeField = "production"


# -- responses ---------------------------------------------------------------


def rfc3339(ts: float | None) -> str | None:
    """Epoch seconds -> RFC 3339 UTC with milliseconds (``2026-11-30T12:00:00.000Z``)."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class OperationView(BaseModel):
    """An operation record as the API shows it (never the payload)."""

    operation_id: str
    state: OperationState
    attempt: int
    receipt: JsonValue
    result: JsonValue
    workflow: str | None
    task_id: str | None
    chain_id: str | None
    execution_mode: Literal["test", "production"]
    created_at: str
    updated_at: str
    lease_expires_at: str | None
    last_failure: dict[str, JsonValue] | None
    reconciliation: dict[str, JsonValue] | None

    @classmethod
    def of(cls, op: Operation, ns: str) -> OperationView:
        def stamped(d: dict[str, Any] | None) -> dict[str, Any] | None:
            return None if d is None else {**d, "at": rfc3339(d.get("at"))}

        return cls(
            operation_id=op.operation_id,
            state=op.state,
            attempt=op.attempt,
            receipt=op.receipt,
            result=op.result,
            workflow=op.workflow,
            task_id=op.task_id,
            chain_id=op.chain_id,
            execution_mode="test" if ns == "t" else "production",
            created_at=rfc3339(op.created_at) or "",
            updated_at=rfc3339(op.updated_at) or "",
            lease_expires_at=rfc3339(op.lease_expires_at),
            last_failure=stamped(op.last_failure),
            reconciliation=stamped(op.reconciliation),
        )


class BeginResponse(BaseModel):
    """The decision of ``begin``; route on ``decision`` with a Switch node."""

    decision: BeginDecision
    reason: BeginReason
    operation: OperationView | None

    @classmethod
    def of(cls, outcome: BeginOutcome, ns: str) -> BeginResponse:
        op = outcome.operation
        return cls(
            decision=outcome.decision,
            reason=outcome.reason,
            operation=None if op is None else OperationView.of(op, ns),
        )


class OperationResponse(BaseModel):
    operation: OperationView


class OperationPage(BaseModel):
    items: list[OperationView]
    next_cursor: str | None


class WhoAmI(BaseModel):
    """The token's name and scope (what the n8n credential test calls)."""

    name: str
    workflows: list[str]
    admin: bool
    authenticated: bool


class Health(BaseModel):
    status: Literal["ok"]


class Ready(BaseModel):
    status: Literal["ready"]
    store: dict[str, JsonValue]
    n8n: dict[str, JsonValue] = Field(
        default={}, description="Whether n8n's API answers (a warning only, never not ready)."
    )


class ProblemError(BaseModel):
    loc: list[str | int]
    msg: str


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[ProblemError] | None = None

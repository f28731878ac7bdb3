"""Request and response models (pydantic v2): the HTTP contract in code.

Request bodies reject unknown fields (``extra="forbid"``) so that a typo in
a flow (``lease`` for ``lease_s``) is a 422, not a silently ignored setting.
The OpenAPI document at ``/openapi.json`` is generated from these models.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, StrictInt

from sidecar.api.answer import built
from sidecar.core.executions import EXECUTION_ID_PATTERN
from sidecar.core.operations import (
    BeginDecision,
    BeginOutcome,
    BeginReason,
    FailOutcome,
    Operation,
    OperationState,
    ReconcileOutcome,
)

#: Patterns as JSON Schema (ECMA-262) reads them, where ``$`` ends the input.
#: Python's ``$`` also matches before a final newline (``"A\n"`` would pass
#: ``re.match``), so every value is checked with ``fullmatch`` instead.
OPERATION_ID_PATTERN = r"^(?!\.{1,2}$)[A-Za-z0-9._:@-]{1,200}$"
NAME_PATTERN = r"^[^\x00-\x1f\x7f]{1,200}$"

_OPERATION_ID = re.compile(OPERATION_ID_PATTERN)
_NAME = re.compile(NAME_PATTERN)


def whole(pattern: str) -> AfterValidator:
    """A validator that ``pattern`` match the whole string (``fullmatch``).

    :raises ValueError: (a 422) when it does not.
    """
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"must match {pattern}")
        return value

    return AfterValidator(check)


def _operation_id(value: str) -> str:
    if not _OPERATION_ID.fullmatch(value):
        raise ValueError(f"must match {OPERATION_ID_PATTERN}")
    return value


def nfc_name(value: str) -> str:
    """A name (workflow, tool, policy...) in Unicode NFC, checked whole.

    ``"Caf\u00e9"`` and ``"Cafe\u0301"`` are one workflow: both become the
    first (Unicode UAX #15). Control characters anywhere, a final newline
    included, are refused.

    :raises ValueError: empty, over 200 characters, or holding a control character.
    """
    value = unicodedata.normalize("NFC", value)
    if not _NAME.fullmatch(value):
        raise ValueError("must be 1 to 200 characters, none of them a control character")
    return value


# The checks run in Python (fullmatch) whatever regex engine a model uses; the
# pattern is kept for the OpenAPI document.
OperationId = Annotated[
    str, Field(json_schema_extra={"pattern": OPERATION_ID_PATTERN}), AfterValidator(_operation_id)
]
Name = Annotated[
    str,
    Field(min_length=1, max_length=200, json_schema_extra={"pattern": NAME_PATTERN}),
    AfterValidator(nfc_name),
]
#: ``attempt``: a JSON integer only (``"1"``, ``true`` and ``1.0`` are refused).
Attempt = Annotated[StrictInt, Field(ge=1, le=1_000_000)]
ExecutionModeField = Annotated[
    Literal["test", "production"],
    Field(description="n8n's `$execution.mode`; `test` requests live in their own namespace."),
]


#: ``execution_id``, checked whole (``fullmatch``: ``"123\n"`` is refused).
ExecutionId = Annotated[
    str, Field(json_schema_extra={"pattern": EXECUTION_ID_PATTERN}), whole(EXECUTION_ID_PATTERN)
]
ExecutionIdField = Annotated[
    ExecutionId | None,
    Field(
        default=None,
        description="n8n's `$execution.id`: a chain or task stop stops the executions "
        "that acted for it (those n8n runs for the record's workflow and mode).",
    ),
]


class RequestBody(BaseModel):
    """Base of every request body: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", regex_engine="python-re")

    execution_mode: ExecutionModeField = "production"
    execution_id: ExecutionIdField = None


class ReconcileSpec(BaseModel):
    """How a later ``begin`` asks the receiver when the outcome is unknown: a check
    that asks the system of record (``http``, or ``all``/``any`` holding one)."""

    model_config = ConfigDict(extra="forbid", regex_engine="python-re")

    check: Name
    input: JsonValue = None


class BeginBody(RequestBody):
    """``POST /v1/operations/{operation_id}/begin``."""

    payload: JsonValue = Field(
        description="What the write sends; only its RFC 8785 fingerprint is kept."
    )
    workflow: Name | None = None
    scope: Literal["workflow", "shared"] = Field(
        default="workflow",
        description="`shared`: the id lives in one namespace shared by every workflow "
        "(needs a token holding every workflow); default: the workflow's own.",
    )
    task_id: Name | None = None
    chain_id: Name | None = None
    lease_s: Annotated[float, Field(gt=0, le=86_400, strict=True)] | None = Field(
        default=None, description="Seconds this attempt holds the operation (default 60)."
    )
    reconcile: ReconcileSpec | None = Field(
        default=None,
        description="A configured check (and its input) a later begin runs when the "
        "outcome is unknown: found -> replay, proven absent -> execute.",
    )


_OP_WORKFLOW = Field(
    default=None,
    description="The workflow the begin gave (the operation's namespace); may be omitted "
    "when the begin gave none or the token holds a single workflow.",
)


class CommitBody(RequestBody):
    """``POST .../commit``: the attempt's write happened."""

    workflow: Name | None = _OP_WORKFLOW
    attempt: Attempt
    receipt: JsonValue = Field(description="The receiver's proof (an id, a Message-ID).")
    result: JsonValue = None


class FailBody(RequestBody):
    """``POST .../fail``: the attempt failed; ``unknown`` when nobody can tell."""

    workflow: Name | None = _OP_WORKFLOW
    attempt: Attempt
    outcome: FailOutcome
    detail: Annotated[str, Field(max_length=2000)] | None = None


class ReconcileBody(RequestBody):
    """``POST .../reconcile``: what the receiver says happened."""

    workflow: Name | None = _OP_WORKFLOW
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


class OperationQuery(ModeQuery):
    """Query string of ``GET /v1/operations/{operation_id}``."""

    workflow: Name | None = _OP_WORKFLOW


# -- responses ---------------------------------------------------------------


def rfc3339(ts: float | None) -> str | None:
    """Epoch seconds -> RFC 3339 UTC with milliseconds (``2026-11-30T12:00:00.000Z``)."""
    return None if ts is None else _rfc3339(ts)


@functools.lru_cache(maxsize=1024)
def _rfc3339(ts: float) -> str:
    """:func:`rfc3339`'s text, kept for the last timestamps written (a record's
    ``created_at`` and ``updated_at`` are often one instant, and a replay
    answers the same record again)."""
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
        """The view of a stored record: built without validation (:func:`built`),
        as every field already has its type (the record's own, read by its mapper)."""

        def stamped(d: dict[str, Any] | None) -> dict[str, Any] | None:
            return None if d is None else {**d, "at": rfc3339(d.get("at"))}

        return built(
            cls,
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
        return built(
            cls,
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

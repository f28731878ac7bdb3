"""A task's typed state (DESIGN §3) and its stored document.

A :class:`Task` holds the limits, what was used, the validated revision, the
recent call history (:class:`CallRecord`), the identical-call counts and,
once ended, its :class:`Envelope`. Documents written before a field existed
read back with that field's default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from sidecar.core.frozen import build, known_items, shallow_doc
from sidecar.core.tasks.limits import TaskLimits, from_micros
from sidecar.core.tasks.outcomes import EndReason, NextAction, TaskStatus

#: How many calls a task remembers (cycle detection and call ids look back this far).
CALL_HISTORY = 200

#: How many identical-call keys a task keeps at most (the oldest go first). A
#: task that makes more distinct calls than this at one revision forgets the
#: oldest; a task that progresses drops lower revisions' keys anyway.
IDENTICAL_CALLS_KEPT = 500

#: How many settled model turns a task remembers by id (a settle the store
#: may have applied is applied again later, before the turns that follow it).
SETTLED_TURNS = 64

#: Fingerprint digits kept in a task's history (64 bits: distinct calls of one
#: task never collide in practice, and the task document stays small).
PRINT_DIGITS = 16


class CallKind(StrEnum):
    READ = "read"
    WRITE = "write"
    POLL = "poll"


class ResultStatus(StrEnum):
    """A tool result's status as the flow reports it."""

    OK = "ok"
    RETRYABLE = "retryable"
    FATAL = "fatal"
    NEEDS_HUMAN = "needs_human"
    UNKNOWN = "unknown"  # the response was lost: a timeout, a dropped connection


class CallStatus(StrEnum):
    """A call in the history: waiting for its result, replayed, or its result's status."""

    PENDING = "pending"
    REPLAYED = "replayed"
    OK = "ok"
    RETRYABLE = "retryable"
    FATAL = "fatal"
    NEEDS_HUMAN = "needs_human"
    UNKNOWN = "unknown"


class Effect(StrEnum):
    """What a result did to the system of record (the reference runners' vocabulary)."""

    NONE = "none"  # a read
    COMMITTED = "committed"
    NOT_COMMITTED = "not_committed"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Evidence:
    """Trusted evidence about a result: never the model's own claim.

    :ivar revision: the validated revision (a non-decreasing integer).
    :ivar effect: what the result did (:class:`Effect`).
    """

    revision: int | None = None
    done: bool | None = None
    effect: Effect | None = None


_KINDS: dict[str, CallKind] = {str(k): k for k in CallKind}
_STATUSES: dict[str, CallStatus] = {str(s): s for s in CallStatus}


def identity(tool: str, args_fp: str, revision: int) -> str:
    """The identical-call key: tool and argument fingerprint at a revision
    (the reference runners' ``payload@revision``)."""
    return f"{tool}|{args_fp[:PRINT_DIGITS]}@{revision}"


def identity_revision(key: str) -> int:
    return int(key.rpartition("@")[2])


class CallRecord(NamedTuple):
    """One admitted call in a task's history (a named tuple: a task reads back
    up to :data:`CALL_HISTORY` of them on every call).

    :ivar fp: the first :data:`PRINT_DIGITS` of the arguments' fingerprint.
    :ivar rev: the validated revision the call was admitted at.
    :ivar attempt: the task attempt (run) it was admitted in.
    """

    call_id: str
    tool: str
    kind: CallKind
    fp: str
    rev: int
    status: CallStatus
    at: float
    attempt: int = 1
    operation_id: str | None = None

    @property
    def key(self) -> str:
        return identity(self.tool, self.fp, self.rev)

    @property
    def replayed(self) -> bool:
        return self.status is CallStatus.REPLAYED

    def to_doc(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "tool": self.tool,
            "kind": str(self.kind),
            "fp": self.fp,
            "rev": self.rev,
            "status": str(self.status),
            "at": self.at,
            "attempt": self.attempt,
            "operation_id": self.operation_id,
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], attempt: int) -> CallRecord:
        """A history entry; older entries carried ``sig`` (``tool|fp|rev``) instead of ``fp``."""
        fp = doc.get("fp") or str(doc.get("sig", "||")).split("|")[1]
        # Enum lookups by value map, not by calling the enum: this runs for every entry.
        return cls(
            doc["call_id"],
            doc["tool"],
            _KINDS[doc["kind"]],
            fp,
            doc.get("rev") or 0,
            _STATUSES[doc["status"]],
            doc["at"],
            doc.get("attempt", attempt),
            doc.get("operation_id"),
        )


@dataclass(frozen=True)
class Used:
    """What a task consumed. Budgets count when a call is admitted, not when
    its result arrives; money in micro-units (settled, and reserved for
    turns in flight)."""

    model_calls: int = 0
    tool_calls: int = 0
    tokens: int = 0
    polls: int = 0
    replays: int = 0
    retries: int = 0
    idle: int = 0
    unchanged_polls: int = 0
    cost_micros: int = 0
    reserved_micros: int = 0
    per_tool: Mapping[str, int] = field(default_factory=dict)

    @property
    def cost(self) -> float:
        """Money settled, in the configured currency."""
        return from_micros(self.cost_micros)

    @property
    def reserved_cost(self) -> float:
        return from_micros(self.reserved_micros)

    def to_doc(self) -> dict[str, Any]:
        doc = shallow_doc(self)
        doc["per_tool"] = dict(self.per_tool)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Used:
        return build(cls, known_items(cls, doc))


@dataclass(frozen=True)
class Envelope:
    """The terminal result a caller cannot ignore (DESIGN §3 "The envelope").

    ``used`` is ``{model_calls, tool_calls, tokens, polls, cost, elapsed_s}``.
    """

    task_id: str
    attempt: int
    status: TaskStatus
    reason: EndReason
    validated_revision: int
    used: Mapping[str, Any]
    last_good: Any
    uncertain_operations: tuple[str, ...]
    allowed_next_actions: tuple[NextAction, ...]

    def to_doc(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "attempt": self.attempt,
            "status": str(self.status),
            "reason": str(self.reason),
            "validated_revision": self.validated_revision,
            "used": dict(self.used),
            "last_good": self.last_good,
            "uncertain_operations": list(self.uncertain_operations),
            "allowed_next_actions": [str(a) for a in self.allowed_next_actions],
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Envelope:
        return cls(
            task_id=doc["task_id"],
            attempt=int(doc["attempt"]),
            status=TaskStatus(doc["status"]),
            reason=EndReason(doc["reason"]),
            validated_revision=int(doc.get("validated_revision") or 0),
            used=dict(doc.get("used") or {}),
            last_good=doc.get("last_good"),
            uncertain_operations=tuple(doc.get("uncertain_operations") or ()),
            allowed_next_actions=tuple(NextAction(a) for a in doc["allowed_next_actions"]),
        )


@dataclass(frozen=True)
class Task:
    """The guarded task.

    :ivar calls: the recent call history, oldest first (at most :data:`CALL_HISTORY`),
        as stored: read it typed with :meth:`call` and :meth:`history`, change
        it through :meth:`calls_with` and :meth:`calls_with_status` (a task reads
        back its whole history on every call; only what a rule looks at is
        parsed).
    :ivar identical_calls: executions per identical call (:func:`identity`), over
        the whole task; keys below the validated revision are dropped (they
        can never match again: revisions only rise).
    :ivar results_seen: fingerprints of recent results (a result seen before
        brings no new information).
    :ivar activations: how many times the task was created (1, then one more
        per re-activation under its ``task_key``).
    :ivar exchanges: the exchanges the model gate answered itself (a write
        already committed or being written, DESIGN §5.1), as
        :class:`sidecar.core.gate_writes.KeptExchange` documents, oldest first.
    :ivar settled_turns: the ids of the model turns settled last (at most
        :data:`SETTLED_TURNS`), oldest first: a settle applied again is
        applied once.
    """

    task_id: str
    task_key: str | None
    workflow: str | None
    chain_id: str | None
    policy: str | None
    attempt: int
    limits: TaskLimits
    allowed_tools: tuple[str, ...] | None
    created_at: float
    updated_at: float
    used: Used = Used()
    initial_revision: int = 0
    validated_revision: int = 0
    last_good: Any = None
    calls: tuple[Mapping[str, Any], ...] = ()
    identical_calls: Mapping[str, int] = field(default_factory=dict)
    results_seen: tuple[str, ...] = ()
    last_poll: str | None = None
    first_poll_at: float | None = None
    operations: tuple[str, ...] = ()
    envelope: Envelope | None = None
    ended_at: float | None = None
    resumes: tuple[Mapping[str, Any], ...] = ()
    activations: int = 1
    exchanges: tuple[Mapping[str, Any], ...] = ()
    settled_turns: tuple[str, ...] = ()

    @property
    def status(self) -> TaskStatus:
        return self.envelope.status if self.envelope else TaskStatus.RUNNING

    def call(self, call_id: str) -> CallRecord | None:
        """The call ``call_id`` of the history, if it is there."""
        for doc in reversed(self.calls):
            if doc["call_id"] == call_id:
                return CallRecord.from_doc(doc, self.attempt)
        return None

    def history(self) -> tuple[CallRecord, ...]:
        """The call history, oldest first."""
        return tuple(CallRecord.from_doc(doc, self.attempt) for doc in self.calls)

    def calls_with(self, record: CallRecord) -> tuple[Mapping[str, Any], ...]:
        """The history with ``record`` appended (the oldest dropped past
        :data:`CALL_HISTORY`)."""
        return (*self.calls, record.to_doc())[-CALL_HISTORY:]

    def calls_with_status(self, call_id: str, status: CallStatus) -> tuple[Mapping[str, Any], ...]:
        """The history with the status of call ``call_id`` changed (its latest
        entry: an id an upstream reused names a new call after the old one's result)."""
        calls = list(self.calls)
        for i in range(len(calls) - 1, -1, -1):
            if calls[i]["call_id"] == call_id:
                calls[i] = {**calls[i], "status": str(status)}
                break
        return tuple(calls)

    def to_doc(self) -> dict[str, Any]:
        """The stored document (JSON types only)."""
        doc = shallow_doc(self)
        doc["limits"] = self.limits.to_doc()
        doc["used"] = self.used.to_doc()
        doc["calls"] = list(self.calls)
        doc["identical_calls"] = dict(self.identical_calls)
        for name in ("results_seen", "operations", "resumes", "exchanges", "settled_turns"):
            doc[name] = list(getattr(self, name))
        doc["allowed_tools"] = None if self.allowed_tools is None else list(self.allowed_tools)
        doc["envelope"] = None if self.envelope is None else self.envelope.to_doc()
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> Task | None:
        """The task of a stored document (None for None)."""
        if doc is None:
            return None
        d = known_items(cls, doc)
        d["limits"] = TaskLimits.from_doc(d["limits"])
        d["used"] = Used.from_doc(d["used"])
        d["calls"] = tuple(d.get("calls", ()))
        d["identical_calls"] = dict(d.get("identical_calls") or {})
        d["validated_revision"] = int(d.get("validated_revision") or 0)
        for name in ("results_seen", "operations", "resumes", "exchanges", "settled_turns"):
            d[name] = tuple(d.get(name, ()))
        if d.get("allowed_tools") is not None:
            d["allowed_tools"] = tuple(d["allowed_tools"])
        if d.get("envelope") is not None:
            d["envelope"] = Envelope.from_doc(d["envelope"])
        return build(cls, d)

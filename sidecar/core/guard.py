"""The task guard (DESIGN §3): bounded agent runs, as pure functions.

A *task* is one job an AI Agent works on across executions, workers and
restarts. Before each model turn and each tool call the flow asks for
admission; the guard reserves the budget first (so concurrent calls cannot
overshoot), refuses identical calls, cycles, calls past a budget or a
deadline, routes writes through the operation ledger, and records each
result with its evidence. When a rule ends the task it gets a terminal
*envelope*; from then on every call returns that same envelope and nothing
executes (sticky). Only validated evidence completes a task: a budget or a
loop stop is never ``completed``.

Progress is a validated revision that increases (evidence from the tool's
check or the flow's trusted nodes, never from the model). A result that
brings evidence without an increase is idle, and so is a result with no
evidence that repeats a result seen before in the task (no new
information); ``max_idle`` idle results in a row end the task
``no_progress``. A result with no evidence and new content is neither
progress nor idle: budgets, identical calls and cycles bound it.

Times are epoch seconds; every function takes ``now``; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from sidecar.core import operations as ledger
from sidecar.core.operations import (
    BeginDecision,
    BeginRequest,
    FailOutcome,
    Operation,
    OperationPolicy,
    OperationState,
)
from sidecar.errors import NotFound, StaleAttempt, StateConflict

#: How many calls a task remembers (identical-call and cycle detection look back this far).
CALL_HISTORY = 200


class TaskStatus(StrEnum):
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
    HUMAN_INPUT = "human_input"
    UNKNOWN_COMMIT = "unknown_commit"
    RETRY_AFTER_COMMIT = "retry_after_commit"


STATUS_OF: dict[EndReason, TaskStatus] = {
    EndReason.VERIFIED_DONE: TaskStatus.COMPLETED,
    **{
        r: TaskStatus.PARTIAL
        for r in (
            EndReason.DEADLINE,
            EndReason.MODEL_BUDGET,
            EndReason.TOOL_BUDGET,
            EndReason.TOKEN_BUDGET,
            EndReason.POLL_BUDGET,
            EndReason.POLL_STALLED,
            EndReason.RETRY_BUDGET,
            EndReason.SAME_CALL,
            EndReason.CYCLE,
            EndReason.NO_PROGRESS,
        )
    },
    **{
        r: TaskStatus.STOPPED
        for r in (
            EndReason.OPERATOR_STOP,
            EndReason.CHAIN_STOPPED,
            EndReason.WORKFLOW_STOPPED,
            EndReason.OUTLIER,
        )
    },
    **{
        r: TaskStatus.BLOCKED
        for r in (
            EndReason.POLICY_DENIED,
            EndReason.OPERATION_CONFLICT,
            EndReason.FATAL_RESULT,
            EndReason.UNVERIFIED_RESULT,
            EndReason.INVALID_EVIDENCE,
        )
    },
    EndReason.HUMAN_INPUT: TaskStatus.NEEDS_HUMAN,
    EndReason.UNKNOWN_COMMIT: TaskStatus.NEEDS_RECONCILIATION,
    EndReason.RETRY_AFTER_COMMIT: TaskStatus.NEEDS_RECONCILIATION,
}

NEXT_ACTIONS: dict[TaskStatus, list[str]] = {
    TaskStatus.COMPLETED: ["return_result"],
    TaskStatus.PARTIAL: ["return_partial", "change_strategy", "human_review"],
    TaskStatus.STOPPED: ["return_partial", "human_review"],
    TaskStatus.BLOCKED: ["return_partial", "change_strategy", "human_review"],
    TaskStatus.NEEDS_HUMAN: ["request_approval", "human_review"],
    # Never a blind retry of an uncertain write.
    TaskStatus.NEEDS_RECONCILIATION: ["query_operation_status", "reconcile", "human_review"],
}

MESSAGES: dict[EndReason, str] = {
    EndReason.DEADLINE: "The task's time is up: give your final answer now with what you have.",
    EndReason.MODEL_BUDGET: "The task used all its model turns: answer now with what you have.",
    EndReason.TOOL_BUDGET: "The task used its tool budget: do not call tools again; "
    "answer with what you have.",
    EndReason.TOKEN_BUDGET: "The task used its token budget: answer now with what you have.",
    EndReason.POLL_BUDGET: "The job did not finish within the polling allowance: stop polling "
    "and report its last known state.",
    EndReason.POLL_STALLED: "The job's status has not changed for many polls: stop polling and "
    "report that it is stalled.",
    EndReason.RETRY_BUDGET: "The tool kept failing: stop retrying it; answer with what you have "
    "or use another source.",
    EndReason.SAME_CALL: "You already made this exact call and nothing changed since: do not "
    "repeat it; use the result you have or give your final answer.",
    EndReason.CYCLE: "You are repeating the same sequence of calls without progress: stop and "
    "give your final answer with what you have.",
    EndReason.NO_PROGRESS: "Your last calls brought no progress: stop and give your final answer "
    "with what you have.",
    EndReason.OPERATOR_STOP: "An operator stopped this task: do not call tools; end your answer.",
    EndReason.CHAIN_STOPPED: "This automation chain was stopped: do not call tools; end your "
    "answer.",
    EndReason.WORKFLOW_STOPPED: "This workflow was stopped: do not call tools; end your answer.",
    EndReason.POLICY_DENIED: "This tool is not allowed for this task: use an allowed tool or "
    "give your final answer.",
    EndReason.OPERATION_CONFLICT: "That write conflicts with one already recorded under the same "
    "operation id: do not retry it; report the conflict.",
    EndReason.FATAL_RESULT: "The tool failed for good: do not retry it; report the failure.",
    EndReason.UNVERIFIED_RESULT: "The tool's result could not be verified: do not rely on it; "
    "report what is known.",
    EndReason.INVALID_EVIDENCE: "The tool's result contradicted the task's state: stop and "
    "report it.",
    EndReason.HUMAN_INPUT: "This action needs a person's approval: do not retry; say that "
    "approval is required.",
    EndReason.UNKNOWN_COMMIT: "It is unknown whether that write happened: do not retry it; "
    "say it must be checked.",
    EndReason.RETRY_AFTER_COMMIT: "That write may already have happened: do not retry it; say "
    "it must be checked.",
    EndReason.VERIFIED_DONE: "The task is complete: give your final answer.",
}

IN_PROGRESS_MESSAGE = (
    "The same write is being made by another worker right now: do not repeat it; wait for its "
    "result or continue with something else."
)


class CallKind(StrEnum):
    READ = "read"
    WRITE = "write"
    POLL = "poll"


class ResultStatus(StrEnum):
    OK = "ok"
    RETRYABLE = "retryable"
    FATAL = "fatal"
    NEEDS_HUMAN = "needs_human"
    UNKNOWN = "unknown"


class ToolDecision(StrEnum):
    EXECUTE = "execute"
    REPLAY = "replay"
    DENY = "deny"


def _flat_doc(obj: TaskLimits | Used) -> dict[str, Any]:
    """The fields of a dataclass of scalars plus its ``per_tool`` mapping (copied)."""
    doc = {f.name: getattr(obj, f.name) for f in fields(obj)}
    doc["per_tool"] = dict(obj.per_tool)
    return doc


@dataclass(frozen=True)
class TaskLimits:
    """Resolved limits of one task (configuration, then policy, then the request)."""

    max_model_calls: int = 20
    max_tool_calls: int = 30
    per_tool: Mapping[str, int] = field(default_factory=dict)
    max_same_call: int = 2
    max_idle: int = 3
    max_cycle_repeats: int = 3
    max_polls: int = 30
    max_unchanged_polls: int = 5
    max_retries: int = 3
    deadline_s: float = 900
    poll_deadline_s: float = 600
    max_tokens: int = 200_000
    wrap_up_ratio: float = 0.8

    def to_doc(self) -> dict[str, Any]:
        return _flat_doc(self)


@dataclass(frozen=True)
class Used:
    """Budgets consumed; reservations count when admitted, not when results arrive."""

    model_calls: int = 0
    tool_calls: int = 0
    tokens: int = 0
    polls: int = 0
    retries: int = 0
    idle: int = 0
    unchanged_polls: int = 0
    per_tool: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """The guarded task. ``calls`` is the recent call history, oldest first:
    ``{call_id, tool, kind, sig, rev, status, at, run, operation_id?}``."""

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
    validated_revision: int | None = None
    last_good: Any = None
    calls: tuple[dict[str, Any], ...] = ()
    results_seen: tuple[str, ...] = ()
    last_poll: str | None = None
    first_poll_at: float | None = None
    operations: tuple[str, ...] = ()
    envelope: dict[str, Any] | None = None
    ended_at: float | None = None
    resumes: tuple[dict[str, Any], ...] = ()
    #: The current run: 0, then one more each time a re-run execution creates
    #: the task again under its ``task_key`` or it is resumed. Identical calls
    #: and cycles are counted within a run, budgets across all of them.
    run: int = 0

    @property
    def status(self) -> TaskStatus:
        return TaskStatus(self.envelope["status"]) if self.envelope else TaskStatus.RUNNING

    def to_doc(self) -> dict[str, Any]:
        """The stored document. Shallow: the history's entries are shared, not
        copied (a deep ``asdict`` of 200 entries cost most of a tool call)."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["limits"] = self.limits.to_doc()
        doc["used"] = _flat_doc(self.used)
        for name in ("calls", "results_seen", "operations", "resumes"):
            doc[name] = list(getattr(self, name))
        doc["allowed_tools"] = None if self.allowed_tools is None else list(self.allowed_tools)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> Task | None:
        if doc is None:
            return None
        d = dict(doc)
        d["limits"] = TaskLimits(**d["limits"])
        d["used"] = Used(**d["used"])
        for name in ("calls", "results_seen", "operations", "resumes"):
            d[name] = tuple(d.get(name, ()))
        if d.get("allowed_tools") is not None:
            d["allowed_tools"] = tuple(d["allowed_tools"])
        return cls(**d)


def new_task(
    task_id: str,
    task_key: str | None,
    workflow: str | None,
    chain_id: str | None,
    policy: str | None,
    limits: TaskLimits,
    allowed_tools: Sequence[str] | None,
    now: float,
) -> Task:
    """A running task, attempt 1, nothing used."""
    return Task(
        task_id=task_id,
        task_key=task_key,
        workflow=workflow,
        chain_id=chain_id,
        policy=policy,
        attempt=1,
        limits=limits,
        allowed_tools=None if allowed_tools is None else tuple(allowed_tools),
        created_at=now,
        updated_at=now,
    )


def new_run(task: Task, now: float) -> Task:
    """The task as a new run of it begins: a re-run execution created it again
    under its ``task_key``. Budgets go on; identical calls and cycles are
    counted afresh, so a committed write that each run asks for once is
    replayed every time instead of ending the task ``same_call``. An ended
    task is returned unchanged.
    """
    if task.envelope is not None:
        return task
    return replace(task, run=task.run + 1, updated_at=now)


def elapsed_s(task: Task, now: float) -> float:
    return round(max(0.0, (task.ended_at or now) - task.created_at), 3)


def end(task: Task, reason: EndReason, now: float, uncertain: Sequence[str] = ()) -> Task:
    """The task with its terminal envelope (DESIGN §3 "The envelope"). Sticky:
    a task that already has one keeps it."""
    if task.envelope is not None:
        return task
    status = STATUS_OF[reason]
    ended = replace(task, ended_at=now, updated_at=now)
    envelope = {
        "task_id": task.task_id,
        "attempt": task.attempt,
        "status": str(status),
        "reason": str(reason),
        "validated_revision": task.validated_revision,
        "used": {
            "model_calls": task.used.model_calls,
            "tool_calls": task.used.tool_calls,
            "tokens": task.used.tokens,
            "polls": task.used.polls,
            "elapsed_s": elapsed_s(ended, now),
        },
        "last_good": task.last_good,
        "uncertain_operations": sorted(set(uncertain)),
        "allowed_next_actions": NEXT_ACTIONS[status],
    }
    return replace(ended, envelope=envelope)


# -- model turns ----------------------------------------------------------------


@dataclass(frozen=True)
class ModelOutcome:
    admitted: bool
    wrap_up: bool
    reason: EndReason | None


def admit_model_call(
    task: Task, tokens_used: int | None, now: float, stopped: EndReason | None = None
) -> tuple[Task, ModelOutcome]:
    """Reserve one model turn; ``tokens_used`` reports the previous turn.

    ``wrap_up`` turns true once tokens (or model turns) reach
    ``wrap_up_ratio`` of their budget: the model should conclude.
    """
    if task.envelope is not None:
        return task, ModelOutcome(False, True, EndReason(task.envelope["reason"]))
    limits = task.limits
    used = replace(task.used, tokens=task.used.tokens + max(0, tokens_used or 0))
    task = replace(task, used=used, updated_at=now)
    reason = _ended_by(task, now, stopped)
    if reason is None and used.tokens >= limits.max_tokens:
        reason = EndReason.TOKEN_BUDGET
    if reason is None and used.model_calls >= limits.max_model_calls:
        reason = EndReason.MODEL_BUDGET
    if reason is not None:
        return end(task, reason, now), ModelOutcome(False, True, reason)
    used = replace(used, model_calls=used.model_calls + 1)
    wrap_up = (
        used.tokens >= limits.wrap_up_ratio * limits.max_tokens
        or used.model_calls >= limits.wrap_up_ratio * limits.max_model_calls
    )
    return replace(task, used=used), ModelOutcome(True, wrap_up, None)


def record_tokens(task: Task, tokens: int, now: float) -> Task:
    """Add the tokens a model turn reported (the model gate learns them after the
    turn). Crossing the budget ends nothing here: the next admission does."""
    if tokens <= 0:
        return task
    return replace(task, used=replace(task.used, tokens=task.used.tokens + tokens), updated_at=now)


def final_message(task: Task) -> str:
    """What the model gate answers for an ended task: a plain final assistant message."""
    envelope = task.envelope or {}
    reason = envelope.get("reason", "")
    try:
        why = MESSAGES[EndReason(reason)]
    except ValueError:
        why = ""
    return (
        f"[loopstop] This task has ended: {envelope.get('status')} ({reason}). {why} "
        f"The workflow can read the full result with GET /v1/tasks/{task.task_id}."
    ).replace("  ", " ")


WRAP_UP_MESSAGE = (
    "[loopstop] The task is close to its budget. Conclude now: give your final answer "
    "with what you have, and do not call more tools."
)


def _ended_by(task: Task, now: float, stopped: EndReason | None) -> EndReason | None:
    if stopped is not None:
        return stopped
    if now - task.created_at > task.limits.deadline_s:
        return EndReason.DEADLINE
    return None


# -- tool calls -----------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A tool call as the core sees it: ``args_fp`` is the RFC 8785 fingerprint."""

    call_id: str
    tool: str
    kind: CallKind
    args_fp: str
    operation: BeginRequest | None = None


@dataclass(frozen=True)
class ToolOutcome:
    decision: ToolDecision
    reason: EndReason | str | None
    call_id: str | None = None
    operation: Operation | None = None


#: Fingerprint digits kept in a task's history (64 bits: distinct calls of one
#: task never collide in practice, and the task document stays small).
PRINT_DIGITS = 16


def _signature(tool: str, args_fp: str, revision: int | None) -> str:
    return f"{tool}|{args_fp[:PRINT_DIGITS]}|{revision}"


def _in_run(task: Task, call: Mapping[str, Any]) -> bool:
    """True when ``call`` was made in the task's current run."""
    return bool(call.get("run", 0) == task.run)


def _same_calls_in_a_row(task: Task, sig: str) -> int:
    count = 0
    for call in reversed(task.calls):
        if not _in_run(task, call):
            break
        if call["kind"] == CallKind.POLL:
            continue
        if call["sig"] != sig:
            break
        count += 1
    return count


def _cycle(task: Task, sig: str, repeats: int) -> bool:
    """True when ``sig`` completes a block of 2+ calls repeated ``repeats`` times
    in a row at the same validated revision (A,B,A,B,A,B or A,B,C,A,B,C,...)."""
    if repeats < 2:
        return False
    seq = [
        c["sig"]
        for c in task.calls
        if c["kind"] != CallKind.POLL and c["rev"] == task.validated_revision and _in_run(task, c)
    ]
    seq.append(sig)
    for period in range(2, len(seq) // repeats + 1):
        block = seq[-period:]
        if len(set(block)) > 1 and seq[-period * repeats :] == block * repeats:
            return True
    return False


def admit_tool_call(
    task: Task,
    call: ToolCall,
    op: Operation | None,
    op_policy: OperationPolicy,
    now: float,
    stopped: EndReason | None = None,
) -> tuple[Task, Operation | None, ToolOutcome]:
    """Decide a tool call before anything executes (DESIGN §3).

    :param op: the ledger record of ``call.operation`` (writes only).
    :returns: the task and operation to store, and the outcome.
    """
    if task.envelope is not None:
        return task, None, ToolOutcome(ToolDecision.DENY, EndReason(task.envelope["reason"]))
    limits = task.limits

    def ended(
        reason: EndReason, uncertain: Sequence[str] = ()
    ) -> tuple[Task, Operation | None, ToolOutcome]:
        return end(task, reason, now, uncertain), None, ToolOutcome(ToolDecision.DENY, reason)

    reason = _ended_by(task, now, stopped)
    if reason is not None:
        return ended(reason)
    if task.allowed_tools is not None and call.tool not in task.allowed_tools:
        return ended(EndReason.POLICY_DENIED)
    if task.used.tool_calls >= limits.max_tool_calls:
        return ended(EndReason.TOOL_BUDGET)
    per_tool_max = limits.per_tool.get(call.tool)
    if per_tool_max is not None and task.used.per_tool.get(call.tool, 0) >= per_tool_max:
        return ended(EndReason.TOOL_BUDGET)
    sig = _signature(call.tool, call.args_fp, task.validated_revision)
    if call.kind is CallKind.POLL:
        if task.used.polls >= limits.max_polls:
            return ended(EndReason.POLL_BUDGET)
        if task.first_poll_at is not None and now - task.first_poll_at > limits.poll_deadline_s:
            return ended(EndReason.POLL_BUDGET)
    else:  # a replay executes nothing, but a model that keeps asking for it is looping
        if _same_calls_in_a_row(task, sig) >= limits.max_same_call:
            return ended(EndReason.SAME_CALL)
        if _cycle(task, sig, limits.max_cycle_repeats):
            return ended(EndReason.CYCLE)

    new_op: Operation | None = None
    decision = ToolDecision.EXECUTE
    record: Operation | None = None
    if call.kind is CallKind.WRITE:
        assert call.operation is not None
        new_op, began = ledger.begin(op, call.operation, op_policy, now)
        record = began.operation
        d = began.decision
        if d is BeginDecision.REPLAY:
            decision = ToolDecision.REPLAY
        elif d is BeginDecision.IN_PROGRESS:
            return task, None, ToolOutcome(ToolDecision.DENY, "in_progress", None, record)
        elif d is BeginDecision.CONFLICT:
            return ended(EndReason.OPERATION_CONFLICT)
        elif d is BeginDecision.EXHAUSTED:
            return ended(EndReason.RETRY_BUDGET)
        elif d is BeginDecision.RECONCILE:
            t, _, out = ended(EndReason.UNKNOWN_COMMIT, [call.operation.operation_id])
            return t, new_op, ToolOutcome(out.decision, out.reason, None, record)
        elif d is BeginDecision.STOPPED:
            return ended(EndReason.WORKFLOW_STOPPED)

    per_tool = {**task.used.per_tool, call.tool: task.used.per_tool.get(call.tool, 0) + 1}
    used = replace(
        task.used,
        tool_calls=task.used.tool_calls + 1,
        polls=task.used.polls + (1 if call.kind is CallKind.POLL else 0),
        per_tool=per_tool,
    )
    entry: dict[str, Any] = {
        "call_id": call.call_id,
        "tool": call.tool,
        "kind": str(call.kind),
        "sig": sig,
        "rev": task.validated_revision,
        "status": "replayed" if decision is ToolDecision.REPLAY else "pending",
        "at": now,
        "run": task.run,
    }
    operations = task.operations
    if call.operation is not None:
        entry["operation_id"] = call.operation.operation_id
        operations = tuple(dict.fromkeys((*task.operations, call.operation.operation_id)))
    task = replace(
        task,
        used=used,
        calls=(*task.calls, entry)[-CALL_HISTORY:],
        first_poll_at=(task.first_poll_at or now)
        if call.kind is CallKind.POLL
        else task.first_poll_at,
        operations=operations,
        updated_at=now,
    )
    return task, new_op, ToolOutcome(decision, None, call.call_id, record)


# -- results -----------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """Trusted evidence about a result: never the model's own claim.

    :ivar effect: for writes, ``committed`` / ``not_committed`` when proven.
    """

    revision: int | None = None
    done: bool | None = None
    effect: str | None = None


@dataclass(frozen=True)
class CheckVerdict:
    """What a tool's configured check said of its result.

    :ivar cannot_run: the system of record could not answer (unreachable,
        timeout, bad response): nothing was learned.
    :ivar revision: the revision the check read (a cursor check: records seen).
    """

    passed: bool
    reason: str
    revision: int | None = None
    cannot_run: bool = False


@dataclass(frozen=True)
class ToolResult:
    """A result as reported; with ``check``, the sidecar's own verdict replaces
    the caller's evidence."""

    status: ResultStatus
    result_fp: str
    result: Any = None
    receipt: Any = None
    evidence: Evidence | None = None
    check: CheckVerdict | None = None


@dataclass(frozen=True)
class ResultOutcome:
    reason: EndReason | None


def record_result(
    task: Task,
    call_id: str,
    res: ToolResult,
    op: Operation | None,
    now: float,
) -> tuple[Task, Operation | None, ResultOutcome]:
    """Record a call's result and decide what it means for the task.

    The ledger is always brought up to date (a write that succeeded while
    the task was being stopped is still committed); the task's own rules
    apply only while it runs.

    :raises NotFound: no such call in the task.
    :raises StateConflict: the call already has a result.
    """
    index = next((i for i, c in enumerate(task.calls) if c["call_id"] == call_id), None)
    if index is None:
        raise NotFound(f"no call {call_id!r} in task {task.task_id!r}")
    call = task.calls[index]
    if call["status"] != "pending":
        raise StateConflict(f"call {call_id!r} already has a result ({call['status']})")
    kind = CallKind(call["kind"])
    calls = list(task.calls)
    calls[index] = {**call, "status": str(res.status)}
    task = replace(task, calls=tuple(calls), updated_at=now)

    check = res.check
    if check is not None and not check.cannot_run:
        # The tool's check is the evidence; the caller's is ignored. A check that
        # reads no revision validates the result without measuring progress.
        if check.revision is None:
            res = replace(res, evidence=None)
        else:
            res = replace(res, evidence=Evidence(revision=check.revision))

    # The ledger first: what happened to the write is a fact whatever the task's fate.
    new_op: Operation | None = None
    uncertain: list[str] = []
    write_reason: EndReason | None = None
    if kind is CallKind.WRITE and op is not None:
        new_op, write_reason, uncertain = _settle_write(op, call, res, now)

    if task.envelope is not None:
        return task, new_op, ResultOutcome(None)

    def ended(reason: EndReason) -> tuple[Task, Operation | None, ResultOutcome]:
        return end(task, reason, now, uncertain), new_op, ResultOutcome(reason)

    ev = res.evidence
    if ev is not None:
        if (
            ev.revision is not None
            and task.validated_revision is not None
            and (ev.revision < task.validated_revision)
        ):
            return ended(EndReason.INVALID_EVIDENCE)
        if ev.done and res.status is not ResultStatus.OK:
            return ended(EndReason.INVALID_EVIDENCE)
    if check is not None and check.cannot_run:
        return ended(
            EndReason.UNKNOWN_COMMIT if kind is CallKind.WRITE else EndReason.UNVERIFIED_RESULT
        )
    if write_reason is not None:
        return ended(write_reason)
    if check is not None and not check.passed and check.reason == "cycle":
        return ended(EndReason.CYCLE)

    limits = task.limits
    if res.status is ResultStatus.FATAL:
        return ended(EndReason.FATAL_RESULT)
    if res.status is ResultStatus.NEEDS_HUMAN:
        return ended(EndReason.HUMAN_INPUT)
    if res.status in (ResultStatus.RETRYABLE, ResultStatus.UNKNOWN):
        retries = task.used.retries + 1
        task = replace(task, used=replace(task.used, retries=retries))
        if retries > limits.max_retries:
            return ended(EndReason.RETRY_BUDGET)
        return task, new_op, ResultOutcome(None)

    # ok: a success ends the run of transient failures
    if task.used.retries:
        task = replace(task, used=replace(task.used, retries=0))
    if kind is CallKind.POLL:
        result_print = res.result_fp[:PRINT_DIGITS]
        unchanged = task.used.unchanged_polls + 1 if result_print == task.last_poll else 0
        task = replace(
            task, last_poll=result_print, used=replace(task.used, unchanged_polls=unchanged)
        )
        if ev is not None and ev.revision is not None:
            task = _progress(task, ev.revision, res.result)
        if ev is not None and ev.done:
            return ended(EndReason.VERIFIED_DONE)
        if unchanged >= limits.max_unchanged_polls:
            return ended(EndReason.POLL_STALLED)
        return task, new_op, ResultOutcome(None)

    failed_check = check is not None and not check.passed
    progressed = (
        ev is not None
        and ev.revision is not None
        and (task.validated_revision is None or ev.revision > task.validated_revision)
        and not failed_check
    )
    if progressed and ev is not None and ev.revision is not None:
        task = _progress(task, ev.revision, res.result)
    else:
        repeated = res.result_fp[:PRINT_DIGITS] in task.results_seen
        if (ev is not None and ev.revision is not None) or repeated or failed_check:
            idle = task.used.idle + 1
            task = replace(task, used=replace(task.used, idle=idle))
            if idle >= limits.max_idle:
                return ended(EndReason.NO_PROGRESS)
    task = replace(
        task, results_seen=(*task.results_seen, res.result_fp[:PRINT_DIGITS])[-CALL_HISTORY:]
    )
    if ev is not None and ev.done:
        return ended(EndReason.VERIFIED_DONE)
    return task, new_op, ResultOutcome(None)


def _progress(task: Task, revision: int, result: Any) -> Task:
    return replace(
        task, validated_revision=revision, last_good=result, used=replace(task.used, idle=0)
    )


def _settle_write(
    op: Operation, call: Mapping[str, Any], res: ToolResult, now: float
) -> tuple[Operation | None, EndReason | None, list[str]]:
    """Bring the write's operation up to date from its result.

    :returns: the operation to store, the reason the task must end (if the
        write's outcome is uncertain), and the uncertain operation ids.
    """
    attempt = op.attempt
    oid = op.operation_id
    proven_absent = res.evidence is not None and res.evidence.effect == "not_committed"
    try:
        if res.check is not None and (res.check.cannot_run or not res.check.passed):
            # The system of record could not confirm the write: nobody knows.
            new, _ = ledger.fail(
                op, oid, attempt, FailOutcome.UNKNOWN, f"check: {res.check.reason}", now
            )
            return new, EndReason.UNKNOWN_COMMIT, [oid]
        if res.status is ResultStatus.OK:
            if res.receipt is None:
                new, _ = ledger.fail(
                    op, oid, attempt, FailOutcome.UNKNOWN, "ok without a receipt", now
                )
                return new, EndReason.UNKNOWN_COMMIT, [oid]
            new, _ = ledger.commit(op, oid, attempt, res.receipt, res.result, now)
            return new, None, []
        if res.status is ResultStatus.UNKNOWN:
            new, _ = ledger.fail(op, oid, attempt, FailOutcome.UNKNOWN, "result unknown", now)
            return new, EndReason.UNKNOWN_COMMIT, [oid]
        if proven_absent:
            new, _ = ledger.fail(op, oid, attempt, FailOutcome.NOT_COMMITTED, str(res.status), now)
            return new, None, []
        if res.status is ResultStatus.NEEDS_HUMAN:
            # Waiting for approval may mean queued: not proven absent, so never re-run blindly.
            new, _ = ledger.fail(op, oid, attempt, FailOutcome.UNKNOWN, "needs_human", now)
            return new, None, [oid]
        new, _ = ledger.fail(op, oid, attempt, FailOutcome.UNKNOWN, str(res.status), now)
        if res.status is ResultStatus.RETRYABLE:
            return new, EndReason.RETRY_AFTER_COMMIT, [oid]
        return new, None, [oid]  # fatal, effect not proven: blocked, and the write is uncertain
    except (StaleAttempt, StateConflict):  # superseded or settled: the ledger keeps what it knows
        seen = ledger.observe(op, now)
        return None, None, [oid] if seen.state is OperationState.UNKNOWN else []


# -- complete, stop, resume ---------------------------------------------------------


def complete(
    task: Task, evidence: Evidence | None, passed: bool | None, now: float
) -> tuple[Task, str]:
    """Validate an exit. ``passed`` is a check's verdict (None: use ``evidence.done``).

    :returns: the task and ``completed`` / ``continue`` / ``ended``.
    """
    if task.envelope is not None:
        return task, "ended"
    done = passed if passed is not None else bool(evidence and evidence.done)
    if done:
        if evidence is not None and evidence.revision is not None:
            task = replace(
                task, validated_revision=max(evidence.revision, task.validated_revision or 0)
            )
        return end(task, EndReason.VERIFIED_DONE, now), "completed"
    idle = task.used.idle + 1
    task = replace(task, used=replace(task.used, idle=idle), updated_at=now)
    if idle >= task.limits.max_idle:
        return end(task, EndReason.NO_PROGRESS, now), "ended"
    return task, "continue"


def stop(task: Task, now: float) -> Task:
    """Operator stop: sticky ``stopped``, ``operator_stop`` (an ended task keeps its envelope)."""
    return end(task, EndReason.OPERATOR_STOP, now)


def resume(
    task: Task,
    reason: str,
    extend: Mapping[str, Any] | None,
    actor: str,
    unknown_operations: Sequence[str],
    now: float,
) -> Task:
    """A linked attempt that keeps counters, ledger and history.

    :raises StateConflict: the task is running or completed, or an operation
        of the task is still ``unknown`` (reconcile it first).
    """
    if task.envelope is None:
        raise StateConflict(f"task {task.task_id!r} is running; nothing to resume")
    if task.status is TaskStatus.COMPLETED:
        raise StateConflict(f"task {task.task_id!r} is completed; start a new task")
    if unknown_operations:
        raise StateConflict(
            f"task {task.task_id!r} has operations in an unknown state: "
            f"{', '.join(sorted(unknown_operations))}; reconcile them first",
            uncertain_operations=sorted(unknown_operations),
        )
    limits = task.limits
    if extend:
        merged = {**limits.to_doc(), **{k: v for k, v in extend.items() if k != "per_tool"}}
        merged["per_tool"] = {**limits.per_tool, **(extend.get("per_tool") or {})}
        limits = TaskLimits(**merged)
    record = {
        "attempt": task.attempt + 1,
        "at": now,
        "reason": reason,
        "actor": actor,
        "extend": dict(extend) if extend else None,
        "previous": {k: task.envelope[k] for k in ("status", "reason")},
    }
    return replace(
        task,
        attempt=task.attempt + 1,
        limits=limits,
        run=task.run + 1,
        envelope=None,
        ended_at=None,
        used=replace(task.used, idle=0, unchanged_polls=0),
        resumes=(*task.resumes, record),
        updated_at=now,
    )

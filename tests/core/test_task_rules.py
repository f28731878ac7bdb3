"""The task guard's rules as pure functions, with no app and no store.

Each rule of :mod:`sidecar.core.tasks` (DESIGN §3) is a row: a trajectory,
the step at which the rule fires, and an honest neighbour that must not be
stopped. A trajectory is a list of steps run by :class:`Agent`, which holds
one task and its ledger records the way a store would.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from conftest import REPO
from sidecar.canonical import canonical_json
from sidecar.config import Limits, LimitsOverride
from sidecar.core import tasks as core
from sidecar.core.operations import (
    OPEN_STATES,
    BeginRequest,
    Operation,
    OperationPolicy,
    OperationState,
)
from sidecar.core.tasks import (
    LIMITS,
    CallKind,
    CheckVerdict,
    CompleteDecision,
    Effect,
    EndReason,
    Evidence,
    ResultStatus,
    Task,
    TaskLimits,
    TaskStatus,
    ToolCall,
    ToolDecision,
    ToolResult,
)
from sidecar.core.tasks import state as core_state
from sidecar.errors import NotFound, StateConflict, TooManyOpen

NOW = 1_800_000_000.0
POLICY = OperationPolicy(max_attempts=3, retention_s=3600)


def fp(value: Any) -> str:
    """A stand-in fingerprint of a JSON value (the service HMACs its RFC 8785 text)."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


@dataclass
class Agent:
    """One task driven step by step: admissions, results, completes, resumes."""

    limits: TaskLimits = field(default_factory=TaskLimits)
    allowed: tuple[str, ...] | None = None
    initial_revision: int = 0
    now: float = NOW
    ops: dict[str, Operation] = field(default_factory=dict)
    policy: OperationPolicy = POLICY
    calls: int = 0
    executions: int = 0
    last: Any = None

    def __post_init__(self) -> None:
        self.task = core.new_task(
            "t1", "key", "wf", None, None, self.limits, self.allowed, self.now,
            self.initial_revision,
        )  # fmt: skip

    # -- steps ------------------------------------------------------------------

    def call(
        self, tool: str, args: Any = None, kind: str = "read", op: str | None = None,
        call_id: str | None = None, flaw: core.CallFlaw | None = None,
    ) -> core.ToolOutcome:  # fmt: skip
        self.calls += 1
        begin = None
        if op is not None:
            begin = BeginRequest(op, {"s1": fp(args)}, "s1", "wf", "t1", None, 60.0)
        given = call_id is not None
        call = ToolCall(
            call_id or f"k{self.calls:016x}", tool, CallKind(kind), fp(args), begin, given, flaw
        )
        record, opens = self.ops.get(op or ""), self.open_ops()
        self.task, new_op, out = core.admit_tool_call(
            self.task, call, record, self.policy, self.now, open_count=opens
        )
        if new_op is not None:
            self.ops[new_op.operation_id] = new_op
        if out.decision is ToolDecision.EXECUTE:
            self.executions += 1
        self.last = out
        return out

    def open_ops(self) -> int:
        """The workflow's open operations (in progress or unknown) as the ledger holds them."""
        return sum(o.state in OPEN_STATES for o in self.ops.values())

    def result(
        self, status: str = "ok", result: Any = None, receipt: Any = None,
        check: CheckVerdict | None = None, call_id: str | None = None, **evidence: Any,
    ) -> core.ResultOutcome:  # fmt: skip
        call_id = call_id or self.last.call_id
        record = self.task.call(call_id)
        op = self.ops.get(record.operation_id or "") if record is not None else None
        ev = None
        if evidence:
            if "effect" in evidence:
                evidence["effect"] = Effect(evidence["effect"])
            ev = Evidence(**evidence)
        res = ToolResult(ResultStatus(status), fp(result), result, receipt, ev, check)
        self.task, new_op, out = core.record_result(self.task, call_id, res, op, self.now)
        if new_op is not None:
            self.ops[new_op.operation_id] = new_op
        return out

    def model(self, tokens: int | None = None, reserve: float | None = None) -> core.ModelOutcome:
        self.task, out = core.admit_model_call(self.task, tokens, self.now, None, reserve)
        return out

    def run(self, steps: list[tuple[Any, ...]]) -> tuple[int | None, EndReason | None]:
        """Run ``steps``; returns the index of the step that ended the task and why."""
        for i, (verb, *args) in enumerate(steps):
            if verb == "advance":
                self.now += args[0]
            elif verb == "again":
                self.task = core.reactivate(self.task, self.now)
            elif verb == "resume":
                self.task = core.resume(self.task, "changed", None, "ops", [], self.now)
            elif verb == "complete":
                self.task, _ = core.complete(self.task, Evidence(done=args[0]), None, self.now)
            else:
                kw = args[-1] if args and isinstance(args[-1], dict) and verb != "call" else {}
                if verb == "call":
                    self.call(*args)
                elif verb == "write":
                    tool, a, op = args
                    self.call(tool, a, "write", op)
                elif verb == "poll":
                    self.call(args[0], args[1], "poll")
                elif verb == "model":
                    self.model(*args)
                else:  # a result: ("ok" | "retryable" | ..., {fields})
                    self.result(verb, **kw)
            if self.task.envelope is not None:
                return i, self.task.envelope.reason
        return None, None


def read(tool: str, q: Any = 1) -> tuple[Any, ...]:
    return ("call", tool, {"q": q})


def ok(result: Any = None, **evidence: Any) -> tuple[Any, ...]:
    return ("ok", {"result": result, **evidence})


L = TaskLimits
R = EndReason

# -- every rule: the step at which it fires ---------------------------------------

#: (name, limits, steps, index of the step that ends the task, reason)
FIRES: list[tuple[str, TaskLimits, list[tuple[Any, ...]], int, EndReason]] = [
    (
        "same call: N executions, the N+1-th denied",
        L(max_same_call=2),
        [read("A"), ok(1), read("A"), ok(1), read("A")],
        4,
        R.SAME_CALL,
    ),
    (
        "same call wherever it falls: A,B,A,B,A with a changing B",
        L(max_same_call=2, max_idle=50),
        [
            read("A"),
            ok("a"),
            read("B", 1),
            ok("b1"),
            read("A"),
            ok("a"),
            read("B", 2),
            ok("b2"),
            read("A"),
        ],
        8,
        R.SAME_CALL,
    ),
    (
        "same call: a read alternating with a write at revision 0",
        L(max_same_call=2, max_idle=50),
        [
            read("file"),
            ok("x"),
            ("write", "save", {"v": 1}, "w1"),
            ("ok", {"receipt": 1}),
            read("file"),
            ok("x"),
            ("write", "save", {"v": 2}, "w2"),
            ("ok", {"receipt": 2}),
            read("file"),
        ],
        8,
        R.SAME_CALL,
    ),
    (
        "same call across activations of one task key",
        L(max_same_call=2),
        [
            read("A"),
            ("retryable", {}),
            ("again",),
            read("A"),
            ("retryable", {}),
            ("again",),
            read("A"),
        ],
        6,
        R.SAME_CALL,
    ),
    (
        "idle: the first evidence at revision 0 is not progress",
        L(max_idle=2),
        [read("A", 1), ok(1, revision=0), read("A", 2), ok(2, revision=0)],
        3,
        R.NO_PROGRESS,
    ),
    (
        "idle: a result seen before brings nothing new",
        L(max_idle=2),
        [read("A", 1), ok("same"), read("A", 2), ok("same"), read("A", 3), ok("same")],
        5,
        R.NO_PROGRESS,
    ),
    (
        "idle across activations",
        L(max_idle=2),
        [read("A", 1), ok(1, revision=0), ("again",), read("A", 2), ok(2, revision=0)],
        4,
        R.NO_PROGRESS,
    ),
    (
        "idle: a failed exit costs one idle step",
        L(max_idle=2),
        [read("A", 1), ok(1, revision=0), ("complete", False)],
        2,
        R.NO_PROGRESS,
    ),
    (
        "cycle: a block of two repeated (identical calls allowed)",
        L(max_same_call=10, max_idle=50, max_cycle_repeats=3),
        [
            read("A"),
            ok("a1"),
            read("B"),
            ok("b1"),
            read("A"),
            ok("a2"),
            read("B"),
            ok("b2"),
            read("A"),
            ok("a3"),
            read("B"),
        ],
        10,
        R.CYCLE,
    ),
    (
        "retries: N failures in a row allowed, the N+1-th ends",
        L(max_retries=2, max_same_call=10, max_idle=10),
        [read("A"), ("retryable", {}), read("A"), ("unknown", {}), read("A"), ("retryable", {})],
        5,
        R.RETRY_BUDGET,
    ),
    (
        "retries are idle results: timeouts across activations end at max_idle first",
        L(max_idle=3, max_retries=3),
        [
            read("A", 1),
            ("retryable", {}),
            ("again",),
            read("A", 2),
            ("unknown", {}),
            ("again",),
            read("A", 3),
            ("retryable", {"revision": 0}),
        ],
        7,
        R.NO_PROGRESS,
    ),
    (
        "max_idle and max_retries reached at one result: no_progress (the runners' stop)",
        L(max_idle=2, max_retries=1),
        [read("A", 1), ("retryable", {}), read("A", 2), ("unknown", {})],
        3,
        R.NO_PROGRESS,
    ),
    (
        "idle: an unchanged result and a failing retry count together",
        L(max_idle=2),
        [read("A", 1), ok(1, revision=0), read("A", 2), ("retryable", {})],
        3,
        R.NO_PROGRESS,
    ),
    (
        "tool budget: N calls, the N+1-th denied",
        L(max_tool_calls=2),
        [read("A", 1), ok(1), read("A", 2), ok(2), read("A", 3)],
        4,
        R.TOOL_BUDGET,
    ),
    (
        "per-tool budget",
        L(per_tool={"A": 1}),
        [read("A", 1), ok(1), read("B", 2), ok(2), read("A", 3)],
        4,
        R.TOOL_BUDGET,
    ),
    (
        "polls: N allowed, the N+1-th denied",
        L(max_polls=2),
        [("poll", "job", {}), ok(1), ("poll", "job", {}), ok(2), ("poll", "job", {})],
        4,
        R.POLL_BUDGET,
    ),
    (
        "polls: N unchanged results in a row end it",
        L(max_unchanged_polls=2),
        [("poll", "job", {}), ok(40), ("poll", "job", {}), ok(40), ("poll", "job", {}), ok(40)],
        5,
        R.POLL_STALLED,
    ),
    (
        "poll deadline",
        L(poll_deadline_s=100),
        [("poll", "job", {}), ok(1), ("advance", 100), ("poll", "job", {})],
        3,
        R.POLL_BUDGET,
    ),
    ("deadline", L(deadline_s=60), [read("A"), ok(1), ("advance", 60), read("B")], 3, R.DEADLINE),
    (
        "deadline: a result recorded at the deadline ends the task",
        L(deadline_s=60),
        [read("A"), ("advance", 60), ok(1, revision=1)],
        2,
        R.DEADLINE,
    ),
    (
        "deadline: a late done does not complete the task (as runner 000)",
        L(deadline_s=60),
        [read("A"), ("advance", 61), ok(1, revision=1, done=True)],
        2,
        R.DEADLINE,
    ),
    (
        "deadline: a late fatal result ends at the deadline (as runner 000)",
        L(deadline_s=60),
        [read("A"), ("advance", 60), ("fatal", {})],
        2,
        R.DEADLINE,
    ),
    (
        "deadline: a late lost write still ends needs_reconciliation",
        L(deadline_s=60),
        [("write", "save", {"v": 1}, "w1"), ("advance", 60), ("unknown", {})],
        2,
        R.UNKNOWN_COMMIT,
    ),
    (
        "deadline: a late retryable write not proven absent still ends needs_reconciliation",
        L(deadline_s=60),
        [("write", "save", {"v": 1}, "w1"), ("advance", 60), ("retryable", {})],
        2,
        R.RETRY_AFTER_COMMIT,
    ),
    (
        "deadline: late evidence that contradicts the task is still invalid",
        L(deadline_s=60),
        [read("A", 1), ok(1, revision=3), read("A", 2), ("advance", 60), ok(2, revision=2)],
        4,
        R.INVALID_EVIDENCE,
    ),
    (
        "done just before the deadline completes",
        L(deadline_s=60),
        [read("A"), ("advance", 59.999), ok(1, revision=1, done=True)],
        2,
        R.VERIFIED_DONE,
    ),
    ("model budget", L(max_model_calls=2), [("model",), ("model",), ("model",)], 2, R.MODEL_BUDGET),
    (
        "token budget",
        L(max_tokens=100),
        [("model",), ("model", 60), ("model", 40)],
        2,
        R.TOKEN_BUDGET,
    ),
    (
        "cost budget: a reservation that would pass max_cost",
        L(max_cost=1.0),
        [("model", None, 0.6), ("model", None, 0.5)],
        1,
        R.COST_BUDGET,
    ),
    (
        "invalid evidence: a revision going down",
        L(),
        [read("A", 1), ok(1, revision=3), read("A", 2), ok(2, revision=2)],
        3,
        R.INVALID_EVIDENCE,
    ),
    (
        "invalid evidence: done on a result that is not ok",
        L(),
        [read("A"), ("retryable", {"done": True})],
        1,
        R.INVALID_EVIDENCE,
    ),
    (
        "invalid evidence: an effect on a read",
        L(),
        [read("A"), ok(1, effect="committed")],
        1,
        R.INVALID_EVIDENCE,
    ),
    (
        "invalid evidence: effect none on a write",
        L(),
        [("write", "save", {"v": 1}, "w1"), ("ok", {"receipt": 1, "effect": "none"})],
        1,
        R.INVALID_EVIDENCE,
    ),
    (
        "unknown commit: effect unknown on a write",
        L(),
        [("write", "save", {"v": 1}, "w1"), ("ok", {"receipt": 1, "effect": "unknown"})],
        1,
        R.UNKNOWN_COMMIT,
    ),
    (
        "unknown commit: a lost response",
        L(),
        [("write", "save", {"v": 1}, "w1"), ("unknown", {})],
        1,
        R.UNKNOWN_COMMIT,
    ),
    (
        "unknown commit: ok without a receipt",
        L(),
        [("write", "save", {"v": 1}, "w1"), ("ok", {})],
        1,
        R.UNKNOWN_COMMIT,
    ),
    (
        "unknown commit: done by a write that did not happen",
        L(),
        [("write", "save", {"v": 1}, "w1"), ("ok", {"done": True, "effect": "not_committed"})],
        1,
        R.UNKNOWN_COMMIT,
    ),
    (
        "retry after commit: a retryable write not proven absent",
        L(),
        [("write", "save", {"v": 1}, "w1"), ("retryable", {})],
        1,
        R.RETRY_AFTER_COMMIT,
    ),
    (
        "operation conflict: the same id with other arguments",
        L(),
        [
            ("write", "save", {"v": 1}, "w1"),
            ("ok", {"receipt": 1}),
            ("write", "save", {"v": 2}, "w1"),
        ],
        2,
        R.OPERATION_CONFLICT,
    ),
    ("fatal result", L(), [read("A"), ("fatal", {})], 1, R.FATAL_RESULT),
    ("needs human", L(), [read("A"), ("needs_human", {})], 1, R.HUMAN_INPUT),
    ("verified done", L(), [read("A"), ok(1, revision=1, done=True)], 1, R.VERIFIED_DONE),
    (
        "done wins over the idle count (as the reference runners decide)",
        L(max_idle=1),
        [read("A"), ok(1, revision=0, done=True)],
        1,
        R.VERIFIED_DONE,
    ),
]


#: Where each reason is decided, by the kind of step that fires it: the numbered
#: rules of :mod:`sidecar.core.tasks.admission` (model turns, tool calls) and the
#: steps of :mod:`sidecar.core.tasks.results`. A row's id cites it ("call rule 11").
RULE_OF: dict[str, dict[EndReason, int]] = {
    "model": {R.DEADLINE: 3, R.TOKEN_BUDGET: 4, R.COST_BUDGET: 5, R.MODEL_BUDGET: 6},
    "call": {
        R.WORKFLOW_STOPPED: 2,
        R.CHAIN_STOPPED: 2,
        R.DEADLINE: 3,
        R.POLL_BUDGET: 10,
        R.INVALID_CALL: 4,
        R.POLICY_DENIED: 6,
        R.OPERATION_CONFLICT: 7,
        R.UNKNOWN_COMMIT: 7,
        R.RETRY_BUDGET: 7,
        R.TOOL_BUDGET: 8,
        R.SAME_CALL: 11,
        R.CYCLE: 12,
    },
    "result": {
        R.INVALID_EVIDENCE: 5,
        R.UNVERIFIED_RESULT: 6,
        R.UNKNOWN_COMMIT: 7,
        R.RETRY_AFTER_COMMIT: 7,
        R.DEADLINE: 8,
        R.CYCLE: 9,
        R.FATAL_RESULT: 10,
        R.HUMAN_INPUT: 10,
        R.RETRY_BUDGET: 11,
        R.VERIFIED_DONE: 13,
        R.POLL_STALLED: 14,
    },
}


def rule_id(name: str, limits: TaskLimits, steps: list[tuple[Any, ...]], at: int, reason: R) -> str:
    """``<kind> rule <n>: <name>``: the rule of DESIGN §3 the row fires (a tool
    call's or a model turn's admission rule, a result's step, or complete)."""
    verb = steps[at][0]
    if verb == "complete":  # core.tasks.lifecycle.complete: a failed exit is one idle step
        return f"complete: {name}"
    kind = {"model": "model", "call": "call", "write": "call", "poll": "call"}.get(verb, "result")
    if reason is R.NO_PROGRESS:  # a failing result (step 11) or an idle ok (step 14)
        number = 14 if verb == "ok" else 11
    elif reason is R.TOOL_BUDGET and limits.per_tool:
        number = 9
    else:
        number = RULE_OF[kind][reason]
    return f"{kind} {'step' if kind == 'result' else 'rule'} {number}: {name}"


@pytest.mark.parametrize(
    ("limits", "steps", "at", "reason"),
    [row[1:] for row in FIRES],
    ids=[rule_id(*row) for row in FIRES],
)
def test_rule_fires_at_its_step(
    limits: TaskLimits, steps: list[tuple[Any, ...]], at: int, reason: EndReason
) -> None:
    agent = Agent(limits)
    assert agent.run(steps) == (at, reason)
    # Sticky: every later call is denied with the same envelope, nothing executes.
    envelope = agent.task.envelope
    before = agent.executions
    assert agent.call("Z", {"z": 1}).decision is ToolDecision.DENY
    assert agent.executions == before and agent.task.envelope == envelope


def test_a_task_starts_at_its_initial_revision() -> None:
    agent = Agent(L(max_idle=1), initial_revision=5)
    assert agent.task.validated_revision == 5
    assert agent.run([read("A", 1), ok(1, revision=5)]) == (1, R.NO_PROGRESS)
    agent = Agent(L(max_idle=1), initial_revision=5)
    assert agent.run([read("A", 1), ok(1, revision=6)]) == (None, None)


# -- honest neighbours: patterns that must never be stopped -------------------------

#: (name, limits, steps) that run to the end without an envelope
HONEST: list[tuple[str, TaskLimits, list[tuple[Any, ...]]]] = [
    (
        "polling that changes (5%, 20%, 27%, ...)",
        L(max_unchanged_polls=2, max_same_call=1),
        [step for pct in (5, 20, 27, 27, 60, 85) for step in (("poll", "job", {"id": 1}), ok(pct))],
    ),
    (
        "pagination with new records (the revision counts records seen)",
        L(max_same_call=1, max_idle=1),
        [step for n in range(1, 6) for step in (read("list", f"c{n}"), ok(n, revision=2 * n))],
    ),
    (
        "a constant cursor that keeps bringing new records",
        L(max_same_call=1, max_idle=1),
        [step for n in range(1, 6) for step in (read("list", "same"), ok(n, revision=n))],
    ),
    (
        "distinct reads without evidence",
        L(max_same_call=1, max_idle=1),
        [step for n in range(8) for step in (read("get", n), ok({"n": n}))],
    ),
    (
        "a read re-done after a write at a new revision",
        L(max_same_call=1, max_idle=1),
        [
            read("get"),
            ok("v1", revision=1),
            ("write", "set", {"v": 2}, "w2"),
            ("ok", {"receipt": 2, "revision": 2, "effect": "committed"}),
            read("get"),
            ok("v2", revision=3),
        ],
    ),
    (
        "a re-run served by replays of committed writes",
        L(max_same_call=1, max_tool_calls=2, max_idle=1),
        [
            ("write", "a", {"v": 1}, "wa"),
            ("ok", {"receipt": 1, "result": "a"}),
            ("write", "b", {"v": 2}, "wb"),
            ("ok", {"receipt": 2, "result": "b"}),
            ("again",),
            ("write", "a", {"v": 1}, "wa"),
            ("write", "b", {"v": 2}, "wb"),
            ("again",),
            ("write", "a", {"v": 1}, "wa"),
            ("write", "b", {"v": 2}, "wb"),
        ],
    ),
    (
        "a read that times out twice and then brings progress, twice over",
        L(),
        [
            read("A", 1),
            ("unknown", {}),
            read("A", 2),
            ("retryable", {}),
            read("A", 3),
            ok(1, revision=1),
            read("A", 4),
            ("unknown", {}),
            read("A", 5),
            ("unknown", {}),
            read("A", 6),
            ok(2, revision=2),
        ],
    ),
    (
        "a retryable result whose revision rises is progress (as both runners count it)",
        L(max_idle=2, max_same_call=5),
        [
            read("A"),
            ("retryable", {}),
            read("A"),
            ("retryable", {"revision": 1}),
            read("A"),
            ("retryable", {}),
        ],
    ),
    (
        "results just before the deadline",
        L(deadline_s=60),
        [
            read("A", 1),
            ("advance", 30),
            ok(1, revision=1),
            read("A", 2),
            ("advance", 29.999),
            ok(2),
        ],
    ),
    (
        "a transient failure, then success, in a row below max_retries",
        L(max_retries=1, max_same_call=5),
        [
            read("A"),
            ("retryable", {}),
            read("A"),
            ok(1),
            read("A"),
            ("retryable", {}),
            read("A"),
            ok(1, revision=1),
        ],
    ),
]


@pytest.mark.parametrize(
    ("limits", "steps"), [row[1:] for row in HONEST], ids=[row[0] for row in HONEST]
)
def test_honest_pattern_is_not_stopped(limits: TaskLimits, steps: list[tuple[Any, ...]]) -> None:
    agent = Agent(limits)
    assert agent.run(steps) == (None, None)
    assert agent.task.status is TaskStatus.RUNNING


# -- writes: never executed twice ---------------------------------------------------


def test_a_committed_write_is_replayed_never_executed_again() -> None:
    agent = Agent(L(max_same_call=1, max_tool_calls=1))
    assert agent.call("save", {"v": 1}, "write", "w1").decision is ToolDecision.EXECUTE
    agent.result(receipt={"id": 1}, result={"ok": True})
    for _ in range(5):
        out = agent.call("save", {"v": 1}, "write", "w1")
        assert out.decision is ToolDecision.REPLAY and out.operation is not None
        assert out.operation.receipt == {"id": 1}
    assert agent.executions == 1
    assert (agent.task.used.tool_calls, agent.task.used.replays) == (1, 5)
    assert agent.task.envelope is None
    with pytest.raises(StateConflict):  # a replay has no result to record
        agent.result()


def test_an_unknown_write_is_never_re_executed() -> None:
    agent = Agent()
    agent.call("save", {"v": 1}, "write", "w1")
    agent.result("unknown")
    assert agent.ops["w1"].state is OperationState.UNKNOWN
    other = Agent(ops=dict(agent.ops))  # a new task plans the same write
    out = other.call("save", {"v": 1}, "write", "w1")
    assert out.decision is ToolDecision.DENY and out.reason is R.UNKNOWN_COMMIT
    assert other.task.envelope is not None
    assert other.task.envelope.uncertain_operations == ("w1",)


def test_another_workers_write_is_denied_without_ending() -> None:
    first = Agent()
    first.call("save", {"v": 1}, "write", "w1")
    second = Agent(ops=dict(first.ops))
    out = second.call("save", {"v": 1}, "write", "w1")
    assert (out.decision, out.reason) == (ToolDecision.DENY, core.DenyReason.IN_PROGRESS)
    assert second.task.envelope is None and second.executions == 0


def test_a_write_past_the_open_bound_is_refused_and_nothing_is_recorded() -> None:
    """operations.max_open_per_workflow bounds a task's writes as it bounds begins."""
    agent = Agent(policy=OperationPolicy(max_open_per_workflow=2))
    agent.call("save", {"v": 1}, "write", "w1")
    agent.call("save", {"v": 2}, "write", "w2")
    before = agent.task
    with pytest.raises(TooManyOpen, match="max_open_per_workflow is 2"):
        agent.call("save", {"v": 3}, "write", "w3")
    assert agent.task == before and "w3" not in agent.ops  # refused: nothing recorded
    # Calls that open nothing still pass: a read, and the open write itself.
    assert agent.call("look", {"q": 1}).decision is ToolDecision.EXECUTE
    out = agent.call("save", {"v": 1}, "write", "w1")
    assert (out.decision, out.reason) == (ToolDecision.DENY, core.DenyReason.IN_PROGRESS)
    # Once one settles, there is room again.
    agent.result(receipt={"id": 2}, result={"ok": True}, call_id=f"k{2:016x}")  # w2's call
    assert agent.ops["w2"].state is OperationState.COMMITTED
    assert agent.call("save", {"v": 3}, "write", "w3").decision is ToolDecision.EXECUTE


def test_a_not_committed_write_may_run_again_and_is_still_counted() -> None:
    agent = Agent(L(max_same_call=2))
    agent.call("send", {"to": "x"}, "write", "m1")
    assert agent.result("retryable", effect="not_committed").reason is None
    assert agent.ops["m1"].state is OperationState.NOT_COMMITTED
    assert agent.call("send", {"to": "x"}, "write", "m1").decision is ToolDecision.EXECUTE
    agent.result("retryable", effect="not_committed")
    out = agent.call("send", {"to": "x"}, "write", "m1")
    assert out.reason is R.SAME_CALL  # two executions at revision 0: the third is a loop


def test_a_stopped_task_still_settles_its_write() -> None:
    agent = Agent()
    agent.call("send", {"to": "x"}, "write", "m1")
    agent.task = core.stop(agent.task, agent.now)
    out = agent.result(receipt={"id": 9})
    assert out.decision is core.ResultDecision.ENDED and not out.ended_now
    assert out.reason is R.OPERATOR_STOP
    assert agent.ops["m1"].state is OperationState.COMMITTED


def test_a_late_result_is_recorded_and_its_write_settled_before_the_deadline_ends_it() -> None:
    """Reference runner 000 settles the ledger, then checks the clock: a committed
    write keeps its receipt; the late result is not counted as progress."""
    agent = Agent(L(deadline_s=60))
    agent.run([read("get"), ok("v1", revision=1)])
    agent.call("send", {"to": "x"}, "write", "m1")
    agent.now += 60
    out = agent.result(receipt={"id": 9}, result="sent", revision=2, effect="committed")
    assert (out.decision, out.reason, out.ended_now) == (
        core.ResultDecision.ENDED,
        R.DEADLINE,
        True,
    )
    assert agent.ops["m1"].state is OperationState.COMMITTED
    assert agent.ops["m1"].receipt == {"id": 9}
    envelope = agent.task.envelope
    assert envelope is not None and envelope.status is TaskStatus.PARTIAL
    assert (envelope.validated_revision, envelope.last_good) == (1, "v1")
    assert envelope.uncertain_operations == ()
    assert agent.task.call(agent.last.call_id).status is core.CallStatus.OK
    # Resumed with more time, the committed write is replayed, never executed again.
    agent.task = core.resume(agent.task, "more time", {"deadline_s": 600}, "ops", [], agent.now)
    assert agent.call("send", {"to": "x"}, "write", "m1").decision is ToolDecision.REPLAY


def test_a_late_lost_write_ends_needs_reconciliation_naming_it() -> None:
    agent = Agent(L(deadline_s=60))
    agent.call("send", {"to": "x"}, "write", "m1")
    agent.now += 90
    assert agent.result("unknown").reason is R.UNKNOWN_COMMIT
    envelope = agent.task.envelope
    assert envelope is not None and envelope.status is TaskStatus.NEEDS_RECONCILIATION
    assert envelope.uncertain_operations == ("m1",)
    assert agent.ops["m1"].state is OperationState.UNKNOWN


# -- caller-given call ids -----------------------------------------------------------


def test_a_caller_given_call_id_is_admitted_once() -> None:
    agent = Agent(L(max_same_call=1))
    first = agent.call("get", {"q": 1}, call_id="call_1")
    again = agent.call("get", {"q": 1}, call_id="call_1")
    assert first.decision is again.decision is ToolDecision.EXECUTE
    assert again.call_id == "call_1" and agent.task.used.tool_calls == 1
    assert len(agent.task.calls) == 1
    with pytest.raises(StateConflict):
        agent.call("get", {"q": 2}, call_id="call_1")
    agent.result(call_id="call_1", result=1)
    with pytest.raises(StateConflict):
        agent.result(call_id="call_1")
    with pytest.raises(NotFound):
        agent.result(call_id="nope")


def test_a_write_admitted_twice_under_one_id_executes_once_then_replays() -> None:
    """The second admission under one id goes through the ledger: the write is in
    progress, so it is denied, never executed a second time."""
    agent = Agent()
    assert (
        agent.call("save", {"v": 1}, "write", "w1", call_id="g1").decision is ToolDecision.EXECUTE
    )
    again = agent.call("save", {"v": 1}, "write", "w1", call_id="g1")
    assert again.decision is ToolDecision.DENY and agent.task.envelope is None
    assert agent.ops["w1"].attempt == 1 and agent.task.used.tool_calls == 1
    agent.result(call_id="g1", receipt="r1")
    out = agent.call("save", {"v": 1}, "write", "w1", call_id="g1")
    assert out.decision is ToolDecision.REPLAY and out.operation is not None
    assert out.operation.receipt == "r1"


@pytest.mark.security
def test_item3_a_call_id_repeated_in_one_proposal_is_one_call_its_copies_denied_and_counted() -> (
    None
):
    """Attack item 3: five copies of one call (same id, same arguments) in one
    proposal: the first executes, the next is a denied duplicate that counts as a
    call, and the third copy passes max_same_call 2 and ends the task."""
    agent = Agent(L(max_tool_calls=3, max_same_call=2))
    flaws = core.screen_proposal([("c1", "get")] * 5, frozenset({"get"}))
    assert flaws == [None, *[core.CallFlaw.REPEAT] * 4]
    outs = [agent.call("get", {"q": 1}, call_id="c1", flaw=f) for f in flaws[:3]]
    assert [o.decision for o in outs] == [ToolDecision.EXECUTE] + [ToolDecision.DENY] * 2
    assert outs[1].reason is core.DenyReason.DUPLICATE_CALL
    assert outs[2].reason is R.SAME_CALL
    assert agent.task.used.tool_calls == 2 and len(agent.task.calls) == 1
    # other arguments under the repeated id: a duplicate as well, never a conflict
    other = Agent(L(max_tool_calls=3, max_same_call=2))
    other.call("get", {"q": 1}, call_id="c1")
    out = other.call("get", {"q": 2}, call_id="c1", flaw=core.CallFlaw.REPEAT)
    assert (out.decision, out.reason) == (ToolDecision.DENY, core.DenyReason.DUPLICATE_CALL)
    assert other.task.used.tool_calls == 2 and other.task.envelope is None


@pytest.mark.security
def test_item4_an_id_reused_with_new_arguments_after_its_result_is_a_new_call() -> None:
    """Attack item 4: an upstream that numbers its calls afresh each turn (call_0
    every turn, new arguments) makes a new call each time, counted; the result of
    the new call is recorded on it, the old one keeps its own."""
    agent = Agent(L(max_tool_calls=5))
    assert agent.call("get", {"q": 1}, call_id="call_0").decision is ToolDecision.EXECUTE
    agent.result(call_id="call_0", result="first")
    out = agent.call("get", {"q": 2}, call_id="call_0")
    assert out.decision is ToolDecision.EXECUTE and agent.task.used.tool_calls == 2
    assert [c.status for c in agent.task.history()] == [core.CallStatus.OK, core.CallStatus.PENDING]
    agent.result(call_id="call_0", result="second")
    assert [c.status for c in agent.task.history()] == [core.CallStatus.OK, core.CallStatus.OK]
    # still pending: other arguments under that id are a conflict (the flow's own id)
    agent.call("get", {"q": 3}, call_id="call_9")
    with pytest.raises(StateConflict):
        agent.call("get", {"q": 4}, call_id="call_9")


@pytest.mark.security
def test_item14_a_proposal_without_call_id_or_naming_a_tool_not_offered_is_invalid() -> None:
    """Attack item 14 and DESIGN §5: an empty call id, or a tool the request did not
    offer, ends the task blocked, invalid_call, and nothing executes."""
    offered = frozenset({"get"})
    assert core.screen_proposal([("", "get")], offered) == [core.CallFlaw.INVALID]
    assert core.screen_proposal([("c1", "rm")], offered) == [core.CallFlaw.INVALID]
    assert core.screen_proposal([("c1", "get")], None) == [core.CallFlaw.INVALID]
    agent = Agent()
    out = agent.call("get", {"q": 1}, call_id="", flaw=core.CallFlaw.INVALID)
    assert (out.decision, out.reason) == (ToolDecision.DENY, R.INVALID_CALL)
    envelope = agent.task.envelope
    assert envelope is not None and envelope.status is TaskStatus.BLOCKED
    assert agent.executions == 0 and agent.task.calls == ()


# -- activations and resume ----------------------------------------------------------


def test_a_re_activation_continues_every_count() -> None:
    agent = Agent(L(max_same_call=2, max_idle=3))
    agent.run([read("A"), ok(1, revision=0), ("again",)])
    task = agent.task
    assert task.activations == 2 and task.used.idle == 1 and task.attempt == 1
    assert sum(task.identical_calls.values()) == 1
    ended = core.end(task, R.OPERATOR_STOP, NOW)
    assert core.reactivate(ended, NOW) is ended


def test_a_resume_restarts_identical_and_idle_counts_but_keeps_budgets() -> None:
    agent = Agent(L(max_same_call=1, max_tool_calls=3, max_idle=5))
    assert agent.run([read("A"), ok(1, revision=0), read("A")]) == (2, R.SAME_CALL)
    with pytest.raises(StateConflict):
        core.resume(agent.task, "x", None, "ops", ["w1"], NOW)  # an unknown operation
    agent.task = core.resume(agent.task, "context changed", None, "ops", [], NOW)
    assert agent.task.attempt == 2 and agent.task.used.idle == 0
    assert agent.task.resumes[-1]["actor"] == "ops"
    assert agent.run([read("A"), ok(1), read("B"), ok(2), read("C")]) == (4, R.TOOL_BUDGET)
    with pytest.raises(StateConflict):
        core.resume(Agent().task, "x", None, "ops", [], NOW)  # running: nothing to resume


def test_a_cycle_is_counted_in_the_current_run_only() -> None:
    steps = [read("A"), ok("a1"), read("B"), ok("b1"), read("A"), ok("a2")]
    looping = Agent(L(max_same_call=10, max_idle=50, max_cycle_repeats=2))
    looping.run(steps)
    assert looping.call("B", {"q": 1}).reason is R.CYCLE
    resumed = Agent(L(max_same_call=10, max_idle=50, max_cycle_repeats=2))
    resumed.run(steps)
    resumed.task = core.resume(core.stop(resumed.task, NOW), "go on", None, "ops", [], NOW)
    assert resumed.call("B", {"q": 1}).decision is ToolDecision.EXECUTE


# -- model turns and money -------------------------------------------------------------


def test_wrap_up_at_the_ratio_of_tokens_turns_or_money() -> None:
    agent = Agent(L(max_tokens=1000, max_model_calls=10, wrap_up_ratio=0.5))
    assert agent.model().wrap_up is False
    assert agent.model(500).wrap_up is True
    agent = Agent(L(max_cost=2.0, wrap_up_ratio=0.5))
    assert agent.model(reserve=0.5).wrap_up is False
    agent.task = core.settle_model_call(agent.task, 0.5, 1.0, 10, NOW)
    assert agent.model(reserve=0.5).wrap_up is True


def test_reservations_never_overspend_together_and_settle_exactly() -> None:
    agent = Agent(L(max_cost=0.3, max_model_calls=100))
    admitted = sum(agent.model(reserve=0.1).admitted for _ in range(5))
    assert admitted == 3 and agent.task.envelope is not None
    assert agent.task.envelope.reason is R.COST_BUDGET
    assert agent.task.used.reserved_micros == 300_000
    for _ in range(3):  # settled after the end: money spent is a fact
        agent.task = core.settle_model_call(agent.task, 0.1, 0.1, 7, NOW)
    used = agent.task.used
    assert (used.reserved_micros, used.cost_micros, used.cost, used.tokens) == (0, 300_000, 0.3, 21)


def test_a_turn_settled_again_under_its_id_is_settled_once() -> None:
    """A settle the store may have applied is applied again later (the gate
    keeps it while the store refuses): under the turn's id, the second changes
    nothing; another turn's settles still count."""
    agent = Agent(L(max_cost=1.0, max_model_calls=100))
    for _ in range(2):
        assert agent.model(reserve=0.2).admitted
    for _ in range(2):
        agent.task = core.settle_model_call(agent.task, 0.2, 0.1, 7, NOW, turn_id="g1")
    agent.task = core.settle_model_call(agent.task, 0.2, 0.1, 7, NOW, turn_id="g2")
    used = agent.task.used
    assert (used.reserved_micros, used.cost_micros, used.tokens) == (0, 200_000, 14)
    for _ in range(2):
        agent.task = core.record_tokens(agent.task, 5, NOW, turn_id="g3")
    assert agent.task.used.tokens == 19
    assert agent.task.settled_turns == ("g1", "g2", "g3")


def test_a_task_remembers_its_last_settled_turns_only() -> None:
    agent = Agent(L(max_tokens=10**9))
    for n in range(core_state.SETTLED_TURNS + 5):
        agent.task = core.record_tokens(agent.task, 1, NOW, turn_id=f"g{n}")
    kept = agent.task.settled_turns
    assert len(kept) == core_state.SETTLED_TURNS and kept[-1] == f"g{core_state.SETTLED_TURNS + 4}"
    assert "g0" not in kept
    again = core.Task.from_doc(agent.task.to_doc())
    assert again is not None and again.settled_turns == kept  # stored with the task


def test_a_spent_money_budget_denies_even_a_turn_without_reservation() -> None:
    agent = Agent(L(max_cost=1.0))
    agent.task = core.settle_model_call(agent.task, 0, 1.0, 0, NOW)
    out = agent.model()
    assert not out.admitted and out.reason is R.COST_BUDGET


def test_money_in_micro_units() -> None:
    assert core.to_micros(0.1) * 3 == core.to_micros(0.3)
    assert core.to_micros(1e-7) == 1  # a reservation never falls short
    assert core.from_micros(1_500_000) == 1.5


# -- complete, stop, envelope ----------------------------------------------------------


def test_complete_outcomes() -> None:
    agent = Agent(L(max_idle=2))
    task, out = core.complete(agent.task, None, None, NOW)
    assert (out.decision, out.reason) == (
        CompleteDecision.CONTINUE,
        core.CompleteReason.CHECK_FAILED,
    )
    task, out = core.complete(task, Evidence(revision=4), True, NOW)
    assert (out.decision, out.reason) == (CompleteDecision.COMPLETED, R.VERIFIED_DONE)
    assert task.envelope is not None and task.envelope.validated_revision == 4
    _, out = core.complete(task, Evidence(done=True), None, NOW)
    assert (out.decision, out.reason) == (CompleteDecision.ENDED, R.VERIFIED_DONE)


@pytest.mark.parametrize("reason", [R.OPERATOR_STOP, R.OUTLIER])
def test_stops_are_sticky(reason: EndReason) -> None:
    task = core.stop(Agent().task, NOW, reason)
    assert task.envelope is not None and task.envelope.status is TaskStatus.STOPPED
    assert core.stop(task, NOW + 5).envelope == task.envelope


def test_every_reason_has_one_status_and_never_a_blind_retry() -> None:
    assert set(core.STATUS_OF) == set(EndReason)
    assert core.STATUS_OF[R.COST_BUDGET] is TaskStatus.PARTIAL
    assert core.STATUS_OF[R.OUTLIER] is TaskStatus.STOPPED
    uncertain = core.NEXT_ACTIONS[TaskStatus.NEEDS_RECONCILIATION]
    assert [str(a) for a in uncertain] == ["query_operation_status", "reconcile", "human_review"]


def test_the_envelope_and_the_task_round_trip_through_their_documents() -> None:
    agent = Agent(L(max_cost=5.0))
    agent.run([read("A"), ok(1, revision=2), ("model", 10, 0.5), read("B"), ("fatal", {})])
    task = agent.task
    assert task.envelope is not None
    doc = task.to_doc()
    assert doc["envelope"]["used"]["cost"] == 0.0 and doc["envelope"]["validated_revision"] == 2
    assert Task.from_doc(doc) == task


def test_a_document_of_the_previous_layout_still_reads() -> None:
    old = {
        "task_id": "t1", "task_key": None, "workflow": "wf", "chain_id": None, "policy": None,
        "attempt": 1, "limits": TaskLimits().to_doc() | {"max_cost": None},
        "allowed_tools": None, "created_at": NOW, "updated_at": NOW,
        "used": {"model_calls": 1, "tool_calls": 1, "tokens": 0, "polls": 0, "retries": 0,
                 "idle": 0, "unchanged_polls": 0, "per_tool": {"A": 1}},
        "validated_revision": None, "last_good": None, "run": 2,
        "calls": [{"call_id": "k1", "tool": "A", "kind": "read", "sig": "A|00ff00ff00ff00ff|None",
                   "rev": None, "status": "pending", "at": NOW, "run": 2}],
        "results_seen": [], "last_poll": None, "first_poll_at": None, "operations": [],
        "envelope": None, "ended_at": None, "resumes": [],
    }  # fmt: skip
    task = Task.from_doc(old)
    assert task is not None and task.validated_revision == 0
    call = task.call("k1")
    assert call is not None and (call.fp, call.rev, call.attempt) == ("00ff00ff00ff00ff", 0, 1)
    assert task.history() == (call,)
    assert core.record_result(task, "k1", ToolResult(ResultStatus.OK, fp(1), 1), None, NOW)[2]


# -- limits: one definition, resolution, loosening, the docs table -----------------------


def test_configuration_validates_into_the_core_limits() -> None:
    assert Limits().to_core() == TaskLimits()
    core_fields = set(TaskLimits().to_doc())
    assert set(Limits.model_fields) == core_fields == set(LimitsOverride.model_fields)
    assert {rule.name for rule in LIMITS} == core_fields - {"wrap_up_ratio"}


def test_limits_resolve_configuration_then_policy_then_request() -> None:
    limits = core.resolve_limits(
        TaskLimits(max_tool_calls=30, per_tool={"b": 4}),
        {"a": 5, "b": 9},
        {"max_tool_calls": 20, "per_tool": {"a": 3}},
        {"max_tool_calls": 10, "max_idle": None, "max_cost": 2.5},
    )
    assert (limits.max_tool_calls, limits.max_idle, limits.max_cost) == (10, 3, 2.5)
    assert dict(limits.per_tool) == {"a": 3, "b": 4}


def test_a_request_that_loosens_a_limit_is_named() -> None:
    base = TaskLimits(per_tool={"a": 3}, max_cost=2.0)
    assert core.loosened(base, replace(base, max_idle=2, max_cost=1.0)) == []
    looser = replace(base, max_tool_calls=99, per_tool={"a": 9, "new": 1}, max_cost=None)
    assert core.loosened(base, looser) == ["max_tool_calls", "per_tool.a", "max_cost"]
    assert core.loosened(TaskLimits(), TaskLimits(max_cost=5.0)) == []


LIMITS_PAGE = REPO / "docs" / "loops" / "agents.md"


def _limits_table() -> list[list[str]]:
    text = LIMITS_PAGE.read_text()
    start = text.index("| limit | reason when passed |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def _default(name: str, value: Any) -> str:
    if name == "per_tool":
        return "tools.<name>.max_calls"
    return "none" if value is None else f"{value:g}"


def test_the_docs_table_of_limits_is_the_code() -> None:
    """The table of limits in docs/loops/agents.md says, for every limit, what the core counts."""
    defaults = TaskLimits().to_doc()
    expected = [
        [
            r.name,
            r.reason,
            _default(r.name, defaults[r.name]),
            r.counts,
            r.scope,
            "yes" if r.across_activations else "no",
            "yes" if r.resume_resets else "no",
        ]
        for r in LIMITS
    ]  # fmt: skip
    assert _limits_table() == expected


def test_every_counted_limit_has_a_row_that_fires() -> None:
    reasons = {row[4] for row in FIRES}
    assert {EndReason(r.reason) for r in LIMITS} <= reasons


# -- the docs table of limits, against the behaviour -------------------------------
#
# The test above checks that the table is the core's declaration (LIMITS); this
# one checks that the declaration is the behaviour. Every row of the table is
# read as a claim and run: at which counted step the limit fires ("N allowed,
# the N+1-th denied" unless the row says "the N-th ..."), whether creating the
# task again under its task_key continues the count, whether a resume restarts
# it, and whether progress (a higher validated revision) restarts it.

N = 2

#: Every other limit out of the way.
LOOSE = TaskLimits(
    max_model_calls=10_000, max_tool_calls=10_000, max_same_call=10_000, max_idle=10_000,
    max_cycle_repeats=10_000, max_polls=10_000, max_unchanged_polls=10_000, max_retries=10_000,
    deadline_s=1e9, poll_deadline_s=1e9, max_tokens=10**9,
)  # fmt: skip


#: Rows of a limit that ends the task at a second kind of step: (limit, a phrase
#: of the row's "what it counts") -> the key of its counted event in _unit.
_SECOND_ROWS = {
    ("max_idle", "retryable or lost"): "max_idle/failing",
    ("deadline_s", "a result recorded"): "deadline_s/result",
}


def _row_key(name: str, counts: str) -> str:
    """The key of a row's counted event (the limit's name, or its second row's key)."""
    return next(
        (k for (n, phrase), k in _SECOND_ROWS.items() if n == name and phrase in counts), name
    )


def _unit(key: str, i: int, rev: int) -> list[tuple[Any, ...]]:
    """The steps of the i-th counted event (from 1) of the row ``key`` (see
    :func:`_row_key`) in a task at validated revision ``rev``."""
    poll = ("poll", "job", {"id": 1})
    return {
        "max_model_calls": [("model",)],
        "max_tool_calls": [read("t", i), ok(i)],
        "per_tool": [read("A", i), ok(i)],
        "max_same_call": [read("A", 0), ok("same")],
        "max_idle": [read("A", i), ok(i, revision=rev)],
        "max_idle/failing": [read("A", i), ("unknown" if i % 2 else "retryable", {})],
        "max_cycle_repeats": [read("A"), ok(f"a{i}"), read("B"), ok(f"b{i}")],
        "max_polls": [poll, ok(i)],
        "max_unchanged_polls": [poll, ok(40)],
        "max_retries": [read("A"), ("retryable", {})],
        "deadline_s": [("advance", 1), read("A", i), ok(i)],
        "deadline_s/result": [read("A", i), ("advance", 1), ok(i, revision=rev + 1)],
        "poll_deadline_s": [("advance", 1), poll, ok(i)],
        "max_tokens": [("model", 1)],
        "max_cost": [("model", None, 1.0)],
    }[key]


#: Steps before the first counted event: an unchanged poll needs a first poll,
#: and the poll deadline counts from the first poll.
_PREAMBLE = {
    "max_unchanged_polls": [("poll", "job", {"id": 1}), ok(40)],
    "poll_deadline_s": [("poll", "job", {"id": 1}), ok(0)],
}

#: The verbs of admission steps (a call or a model turn); the others record a
#: result, complete, or move the task or the clock.
_ADMISSIONS = {"call", "write", "poll", "model"}


def _limited(name: str) -> TaskLimits:
    if name == "per_tool":
        return replace(LOOSE, per_tool={"A": N})
    return replace(LOOSE, **{name: float(N) if name == "max_cost" else N})


def _fires_at(
    agent: Agent, key: str, reason: str, first: int, gap: list[Any]
) -> tuple[int, bool] | None:
    """Run counted events from number ``first``, ``gap`` before each; the
    number of the event (from 1) at which the task ends with ``reason``, and
    whether the step that ended it was an admission (else a result)."""
    for n in range(1, 3 * N + 3):
        steps = [*gap, *_unit(key, first + n, agent.task.validated_revision)]
        at, why = agent.run(steps)
        if at is not None:
            assert why is not None and str(why) == reason, (key, n, why)
            return n, steps[at][0] in _ADMISSIONS
    return None


def _claimed_step(counts: str) -> int:
    """The counted event at which a row says its limit fires."""
    says_nth = (
        "the N-th" in counts or "once they reach N" in counts or "at N or later" in counts
    )  # fmt: skip
    return N if says_nth else N + 1


@pytest.mark.parametrize("row", _limits_table(), ids=lambda row: row[0])
def test_each_row_of_the_docs_table_is_the_behaviour(row: list[str]) -> None:
    name, reason, _, counts, scope, across, restarts = row
    key = _row_key(name, counts)
    claimed = _claimed_step(counts)
    # "... ends the task": at a result; "denied" (said or not): at an admission
    at_admission = "ends the task" not in counts

    agent = Agent(_limited(name))
    agent.run(_PREAMBLE.get(name, []))
    assert _fires_at(agent, key, reason, 0, []) == (claimed, at_admission), f"{name}: {counts}"

    # across activations: the task created again before every event
    agent = Agent(_limited(name))
    agent.run(_PREAMBLE.get(name, []))
    again = _fires_at(agent, key, reason, 0, [("again",)])
    assert (again == (claimed, at_admission)) is (across == "yes"), (
        f"{name}: across activations {across}"
    )

    # a resume: restarts the count (fires at the same step again) or keeps it (at once)
    agent.run([("resume",)])
    after = _fires_at(agent, key, reason, 100, [])
    if restarts == "yes":
        assert after is not None and after[0] >= N, (
            f"{name}: a resume restarts it, fired at {after}"
        )
    else:
        assert after is not None and after[0] == 1, f"{name}: a resume keeps it, fired at {after}"

    # progress: a higher validated revision before the last counted event
    if name in ("max_tool_calls", "max_unchanged_polls"):
        return  # the progress read is itself a tool call / not a poll result
    agent = Agent(_limited(name))
    agent.run(_PREAMBLE.get(name, []))
    agent.run([step for i in range(1, claimed) for step in _unit(key, i, 0)])
    assert agent.task.envelope is None
    agent.run([read("progress"), ok("p", revision=agent.task.validated_revision + 1)])
    fired = _fires_at(agent, key, reason, 50, [])
    restarted = fired is None or fired[0] != 1
    by_progress = scope in ("per revision", "since the last progress", "in a row")
    assert restarted is by_progress, f"{name}: scope {scope}"


def test_another_call_under_the_id_of_a_replayed_call_is_a_new_call() -> None:
    """An API without call ids is numbered by position (the model gate): a call
    the ledger replayed was never relayed, so a later call may take its number;
    the new call's result goes to it, never to the replayed one. A call in
    flight still holds its id (one whose result came is a new call: an upstream
    that numbers its calls afresh, rule 5)."""
    agent = Agent()
    agent.call("save", {"v": 1}, "write", "w1", call_id="n_0")
    agent.result(call_id="n_0", receipt="r1")
    replayed = agent.call("save", {"v": 1}, "write", "w1", call_id="n_1")
    assert replayed.decision is ToolDecision.REPLAY
    out = agent.call("get", {"q": 1}, call_id="n_1")  # the read in the replay's place
    assert out.decision is ToolDecision.EXECUTE and agent.task.used.tool_calls == 2
    agent.result(call_id="n_1", result=1)
    assert [(c.call_id, c.tool, c.status) for c in agent.task.history()] == [
        ("n_0", "save", core.CallStatus.OK),
        ("n_1", "save", core.CallStatus.REPLAYED),
        ("n_1", "get", core.CallStatus.OK),
    ]
    again = agent.call("get", {"q": 2}, call_id="n_0")  # n_0 has its result: a new call
    assert again.decision is ToolDecision.EXECUTE and agent.task.used.tool_calls == 3
    agent.result(call_id="n_0", result=2)
    agent.call("get", {"q": 3}, call_id="n_2")
    with pytest.raises(StateConflict):  # so does a call in flight
        agent.call("get", {"q": 4}, call_id="n_2")


def test_only_a_running_task_with_a_money_budget_requires_a_turn_to_bound_its_cost() -> None:
    assert not core.money_bound_required(Agent(L()).task)
    budgeted = Agent(L(max_cost=1.0)).task
    assert core.money_bound_required(budgeted)
    assert not core.money_bound_required(core.stop(budgeted, NOW))

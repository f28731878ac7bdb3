"""Admission (DESIGN §3): whether a model turn or a tool call may go ahead,
decided before anything runs. Budgets are reserved on admission, so
concurrent calls of one task (all in its one document) never overshoot.

A model turn, first match wins:

1. the task has an envelope -> ``deny`` with its reason (sticky);
2. the workflow or the chain is stopped -> ``stopped``;
3. ``deadline_s`` has passed since the task was created -> ``partial``, ``deadline``;
4. the tokens reported reach ``max_tokens`` -> ``token_budget``;
5. the money settled and reserved has reached ``max_cost``, or this turn's
   reservation would pass it -> ``cost_budget``;
6. ``max_model_calls`` turns were admitted -> ``model_budget``;
7. else ``admit``: one turn and its reservation counted; ``wrap_up`` once
   tokens, turns or money reach ``wrap_up_ratio`` of their budget.

A tool call, first match wins:

1. the task has an envelope -> ``deny`` with its reason, nothing executes (sticky);
2. the workflow or the chain is stopped -> ``stopped``;
3. ``deadline_s`` has passed -> ``partial``, ``deadline``;
4. the call is malformed (:attr:`CallFlaw.INVALID`: no call id, or a tool
   the model gate's request did not offer) -> ``blocked``, ``invalid_call``;
5. the caller's ``call_id`` names a call still waiting for its result ->
   that call's decision again (``replay`` once its write is committed),
   nothing counted; other arguments under it -> a conflict; an id whose call
   has its result is a new call (an upstream that numbers calls afresh);
   another call under the id of a replayed one is a new call;
   another copy of a call id earlier in the same proposal
   (:attr:`CallFlaw.REPEAT`) goes on to the rules after this one;
6. the task's policy does not allow the tool -> ``blocked``, ``policy_denied``;
7. a write's operation, in the ledger: conflicting payload ->
   ``operation_conflict``; unknown -> ``needs_reconciliation``,
   ``unknown_commit``; attempts used -> ``retry_budget``; another worker
   holds it -> ``deny``, ``in_progress`` (the task goes on); committed ->
   ``replay`` with its receipt: executes nothing, exempt from rules 8-12;
8. ``max_tool_calls`` calls were admitted to execute -> ``tool_budget``;
9. the tool's ``per_tool`` budget is used -> ``tool_budget``;
10. a poll past ``max_polls`` or ``poll_deadline_s`` -> ``poll_budget``;
11. ``max_same_call`` executions of this identical call (tool and RFC 8785
    arguments) at the current validated revision, wherever they fall in the
    task -> ``same_call`` (polls exempt, and writes at the model gate: the
    ledger decides their repeats);
12. the call completes ``max_cycle_repeats`` repeats in a row of a block of
    2 or more calls at the current revision -> ``cycle`` (polls exempt);
13. else ``execute``: the call is recorded and counted; a repeated copy
    (:attr:`CallFlaw.REPEAT`) is counted as a call (budgets, identical
    calls) but not recorded, and denied ``duplicate_call``: one call id is
    one call; a write that would open one more operation of its workflow
    once it holds ``operations.max_open_per_workflow`` open ones is refused
    (:class:`~sidecar.errors.TooManyOpen`, 429) and nothing is recorded.

Times are epoch seconds; every function takes ``now``; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sidecar.core.frozen import evolve
from sidecar.core.operations import BeginRequest, Operation, OperationPolicy
from sidecar.core.tasks.ledger_bridge import WriteAdmission, admit_write, require_open_room
from sidecar.core.tasks.lifecycle import deadline_passed, end, overshoot
from sidecar.core.tasks.limits import to_micros
from sidecar.core.tasks.outcomes import (
    DenyReason,
    EndReason,
    ModelDecision,
    ModelOutcome,
    ToolDecision,
    ToolOutcome,
)
from sidecar.core.tasks.state import (
    IDENTICAL_CALLS_KEPT,
    PRINT_DIGITS,
    SETTLED_TURNS,
    CallKind,
    CallRecord,
    CallStatus,
    Task,
    identity,
)
from sidecar.errors import StateConflict

# -- model turns ----------------------------------------------------------------


def admit_model_call(
    task: Task,
    tokens_used: int | None,
    now: float,
    stopped: EndReason | None = None,
    reserve_cost: float | None = None,
) -> tuple[Task, ModelOutcome]:
    """Reserve one model turn (rules above); ``tokens_used`` reports the previous turn.

    :param reserve_cost: the turn's worst-case cost, held until
        :func:`settle_model_call` releases it.
    """
    if task.envelope is not None:
        return task, ModelOutcome(ModelDecision.DENY, True, task.envelope.reason)
    limits = task.limits
    used = evolve(task.used, tokens=task.used.tokens + max(0, tokens_used or 0))
    task = evolve(task, used=used, updated_at=now)
    reserve = to_micros(reserve_cost or 0.0)
    max_cost = limits.max_cost_micros
    spent = used.cost_micros + used.reserved_micros
    reason: EndReason | None = stopped
    if reason is None and deadline_passed(task, now):
        reason = EndReason.DEADLINE
    if reason is None and used.tokens >= limits.max_tokens:
        reason = EndReason.TOKEN_BUDGET
    if (
        reason is None
        and max_cost is not None
        and (spent >= max_cost or spent + reserve > max_cost)
    ):
        reason = EndReason.COST_BUDGET
    if reason is None and used.model_calls >= limits.max_model_calls:
        reason = EndReason.MODEL_BUDGET
    if reason is not None:
        return end(task, reason, now), ModelOutcome(ModelDecision.DENY, True, reason)
    used = evolve(
        used, model_calls=used.model_calls + 1, reserved_micros=used.reserved_micros + reserve
    )
    ratio = limits.wrap_up_ratio
    wrap_up = (
        used.tokens >= ratio * limits.max_tokens
        or used.model_calls >= ratio * limits.max_model_calls
        or (max_cost is not None and used.cost_micros >= ratio * max_cost)
    )
    return evolve(task, used=used), ModelOutcome(ModelDecision.ADMIT, wrap_up, None)


def settle_model_call(
    task: Task,
    reserved_cost: float,
    actual_cost: float,
    tokens: int,
    now: float,
    turn_id: str | None = None,
) -> Task:
    """A model turn's real usage: releases its reservation, adds its cost and
    tokens, and applies to an ended task too: money spent is a fact.

    A turn that cost more than its reservation (an upstream that reports more
    than the request allowed) and so passes ``max_cost`` ends the task at this
    turn, ``partial``, ``cost_budget``, its envelope's ``used`` naming the
    ``cost_overshoot`` (an envelope that was already there gets it too): the
    budget is never passed unseen. Other budgets end at the next admission.

    :param turn_id: the turn's id: a turn settled already (among the task's
        last :data:`SETTLED_TURNS`) is not settled again. None: no id kept.
    """
    if turn_id is not None and turn_id in task.settled_turns:
        return task
    task = _settled(task, turn_id)
    used = task.used
    release = min(to_micros(reserved_cost), used.reserved_micros)
    used = evolve(
        used,
        reserved_micros=used.reserved_micros - release,
        cost_micros=used.cost_micros + to_micros(actual_cost),
        tokens=used.tokens + max(0, tokens),
    )
    task = evolve(task, used=used, updated_at=now)
    over = overshoot(task)
    if not over:
        return task
    if task.envelope is None:
        return end(task, EndReason.COST_BUDGET, now)
    envelope = evolve(task.envelope, used={**task.envelope.used, "cost": used.cost, **over})
    return evolve(task, envelope=envelope)


def record_tokens(task: Task, tokens: int, now: float, turn_id: str | None = None) -> Task:
    """Add the tokens a model turn reported after it. Crossing the budget ends
    nothing here: the next admission does.

    :param turn_id: as for :func:`settle_model_call`: a turn recorded already
        is not recorded again.
    """
    if tokens <= 0 or (turn_id is not None and turn_id in task.settled_turns):
        return task
    task = _settled(task, turn_id)
    return evolve(task, used=evolve(task.used, tokens=task.used.tokens + tokens), updated_at=now)


def _settled(task: Task, turn_id: str | None) -> Task:
    """``task`` remembering ``turn_id`` as settled (its last :data:`SETTLED_TURNS`)."""
    if turn_id is None:
        return task
    return evolve(task, settled_turns=(*task.settled_turns, turn_id)[-SETTLED_TURNS:])


# -- tool calls -----------------------------------------------------------------


class CallFlaw(StrEnum):
    """What is wrong with a proposed call as a proposal (:func:`screen_proposal`)."""

    INVALID = "invalid"  # no call id, or a tool the request did not offer
    REPEAT = "repeat"  # its call id was given earlier in the same proposal


def screen_proposal(
    calls: Sequence[tuple[str, str]], offered: frozenset[str] | None
) -> list[CallFlaw | None]:
    """The flaw of each call of one proposal, ``(call_id, tool)`` pairs in order.

    A call without an id cannot be matched with its output, and a call of a
    tool the request did not offer (``offered`` None: it offered none) can
    only be the model's invention: both are :attr:`CallFlaw.INVALID` (DESIGN
    §5, as the reference runners end a malformed proposal). One call id is one
    call: every copy after the first is :attr:`CallFlaw.REPEAT`.
    """
    seen: set[str] = set()
    flaws: list[CallFlaw | None] = []
    for call_id, tool in calls:
        if not call_id or offered is None or tool not in offered:
            flaws.append(CallFlaw.INVALID)
        elif call_id in seen:
            flaws.append(CallFlaw.REPEAT)
        else:
            flaws.append(None)
        seen.add(call_id)
    return flaws


@dataclass(frozen=True)
class ToolCall:
    """A tool call as the core sees it: ``args_fp`` is the RFC 8785 fingerprint.

    :ivar given_id: ``call_id`` was chosen by the caller (admission is
        idempotent on it) rather than generated.
    :ivar flaw: what :func:`screen_proposal` found (model-gate proposals only).
    :ivar ledger_repeats: the ledger alone decides repeats of this write (a
        write at the model gate, DESIGN §5.1): exempt from rule 11.
    """

    call_id: str
    tool: str
    kind: CallKind
    args_fp: str
    operation: BeginRequest | None = None
    given_id: bool = False
    flaw: CallFlaw | None = None
    ledger_repeats: bool = False


@dataclass(frozen=True)
class _Ask:
    task: Task
    call: ToolCall
    write: WriteAdmission | None
    now: float
    stopped: EndReason | None

    @property
    def key(self) -> str:
        return identity(self.call.tool, self.call.args_fp, self.task.validated_revision)


_Answer = tuple[Task, Operation | None, ToolOutcome]


def _ended(
    ask: _Ask, reason: EndReason, uncertain: Sequence[str] = (), op: Operation | None = None
) -> _Answer:
    return end(ask.task, reason, ask.now, uncertain), op, ToolOutcome(ToolDecision.DENY, reason)


def _rule_ended(ask: _Ask) -> _Answer | None:
    if ask.task.envelope is None:
        return None
    return ask.task, None, ToolOutcome(ToolDecision.DENY, ask.task.envelope.reason)


def _rule_stopped(ask: _Ask) -> _Answer | None:
    return None if ask.stopped is None else _ended(ask, ask.stopped)


def _rule_deadline(ask: _Ask) -> _Answer | None:
    return _ended(ask, EndReason.DEADLINE) if deadline_passed(ask.task, ask.now) else None


def _rule_invalid(ask: _Ask) -> _Answer | None:
    return _ended(ask, EndReason.INVALID_CALL) if ask.call.flaw is CallFlaw.INVALID else None


def _rule_known_call_id(ask: _Ask) -> _Answer | None:
    """A caller-given id already in the history (the model gate admitted the call,
    then a Loop Stop node asks for it again) is one call, counted once:

    - a read whose call already has its result is a new call, whatever its
      arguments (a server that numbers its calls afresh each turn): admitted
      and counted by the rules after this one; so is another call (another
      tool, kind, arguments or operation id) under a write's id whose result
      is in;
    - another tool, kind, arguments or operation id under an id still
      pending is a conflict;
    - a write goes through the ledger all the same: another worker writing it is
      a deny, an unknown outcome ends the task, a committed one replays;
    - a read still waiting for its result answers ``execute`` again;
    - another call under the id of a call the ledger replayed (answered from
      the ledger, never relayed: nobody saw that id) is a new call. The model
      gate numbers the calls of an API without ids (Ollama, Gemini) by their
      place in the conversation n8n sent: a later call of the request takes
      the place of one the gate answered itself.

    A repeated copy within one proposal goes on to the rules after this one
    and is counted and denied by :func:`_admit`.
    """
    known = ask.task.call(ask.call.call_id) if ask.call.given_id else None
    if known is None or ask.call.flaw is CallFlaw.REPEAT:
        return None
    if ask.write is None and known.status is not CallStatus.PENDING:
        return None
    operation_id = ask.call.operation.operation_id if ask.call.operation else None
    if (known.tool, known.kind, known.fp, known.operation_id) != (
        ask.call.tool,
        ask.call.kind,
        ask.call.args_fp[:PRINT_DIGITS],
        operation_id,
    ):
        if known.replayed or known.status is not CallStatus.PENDING:
            return None
        raise StateConflict(
            f"call {ask.call.call_id!r} was admitted for another tool, other arguments "
            "or another operation",
            call_id=ask.call.call_id,
        )
    w = ask.write
    if w is not None:
        if w.ends is not None or w.denies is not None:
            return _rule_ledger(ask)
        if w.replay or known.replayed:
            return ask.task, None, ToolOutcome(ToolDecision.REPLAY, None, known.call_id, w.record)
        return None  # the write may run again (not committed last time): a new attempt
    return ask.task, None, ToolOutcome(ToolDecision.EXECUTE, None, known.call_id, None)


def _rule_policy(ask: _Ask) -> _Answer | None:
    allowed = ask.task.allowed_tools
    return (
        _ended(ask, EndReason.POLICY_DENIED)
        if allowed is not None and ask.call.tool not in allowed
        else None
    )


def _rule_ledger(ask: _Ask) -> _Answer | None:
    w = ask.write
    if w is None:
        return None
    if w.ends is not None:
        oid = ask.call.operation.operation_id if ask.call.operation else ""
        uncertain = [oid] if w.ends is EndReason.UNKNOWN_COMMIT else []
        t, op, out = _ended(ask, w.ends, uncertain, w.operation if w.store_anyway else None)
        return t, op, evolve(out, operation=w.record)
    if w.denies is not None:
        return ask.task, None, ToolOutcome(ToolDecision.DENY, w.denies, None, w.record)
    if w.replay:
        used = evolve(ask.task.used, replays=ask.task.used.replays + 1)
        task = _record(ask, CallStatus.REPLAYED, used=used)
        return task, None, ToolOutcome(ToolDecision.REPLAY, None, ask.call.call_id, w.record)
    return None


def _rule_tool_budget(ask: _Ask) -> _Answer | None:
    return (
        _ended(ask, EndReason.TOOL_BUDGET)
        if ask.task.used.tool_calls >= ask.task.limits.max_tool_calls
        else None
    )


def _rule_per_tool(ask: _Ask) -> _Answer | None:
    limit = ask.task.limits.per_tool.get(ask.call.tool)
    used = ask.task.used.per_tool.get(ask.call.tool, 0)
    return _ended(ask, EndReason.TOOL_BUDGET) if limit is not None and used >= limit else None


def _rule_poll_budget(ask: _Ask) -> _Answer | None:
    task, limits = ask.task, ask.task.limits
    if ask.call.kind is not CallKind.POLL:
        return None
    late = task.first_poll_at is not None and ask.now - task.first_poll_at >= limits.poll_deadline_s
    return (
        _ended(ask, EndReason.POLL_BUDGET) if task.used.polls >= limits.max_polls or late else None
    )


def _rule_same_call(ask: _Ask) -> _Answer | None:
    if ask.call.kind is CallKind.POLL or ask.call.ledger_repeats:
        return None
    done = ask.task.identical_calls.get(ask.key, 0)
    return _ended(ask, EndReason.SAME_CALL) if done >= ask.task.limits.max_same_call else None


def _rule_cycle(ask: _Ask) -> _Answer | None:
    if ask.call.kind is CallKind.POLL or not _cycle(ask.task, ask.key):
        return None
    return _ended(ask, EndReason.CYCLE)


def _cycle(task: Task, key: str) -> bool:
    """True when ``key`` completes a block of 2+ calls repeated
    ``max_cycle_repeats`` times in a row at the current revision, in the
    current run (A,B,A,B,A,B or A,B,C,A,B,C,...)."""
    repeats = task.limits.max_cycle_repeats
    if task.identical_calls.get(key, 0) < repeats - 1:
        return False  # the block ends with key: key ran repeats - 1 times at this revision already
    seq = [
        c.key
        for c in task.history()
        if c.kind is not CallKind.POLL
        and not c.replayed
        and c.rev == task.validated_revision
        and c.attempt == task.attempt
    ]
    seq.append(key)
    for period in range(2, len(seq) // repeats + 1):
        block = seq[-period:]
        if len(set(block)) > 1 and seq[-period * repeats :] == block * repeats:
            return True
    return False


#: The tool-call rules in the order of the module docstring (rule 13 is :func:`_admit`).
TOOL_RULES: tuple[Callable[[_Ask], _Answer | None], ...] = (
    _rule_ended,
    _rule_stopped,
    _rule_deadline,
    _rule_invalid,
    _rule_known_call_id,
    _rule_policy,
    _rule_ledger,
    _rule_tool_budget,
    _rule_per_tool,
    _rule_poll_budget,
    _rule_same_call,
    _rule_cycle,
)


def _record(ask: _Ask, status: CallStatus, **changes: Any) -> Task:
    """The task with the call in its history (and ``changes``)."""
    task, call = ask.task, ask.call
    entry = CallRecord(
        call_id=call.call_id,
        tool=call.tool,
        kind=call.kind,
        fp=call.args_fp[:PRINT_DIGITS],
        rev=task.validated_revision,
        status=status,
        at=ask.now,
        attempt=task.attempt,
        operation_id=call.operation.operation_id if call.operation else None,
    )
    operations = task.operations
    if call.operation is not None:
        operations = tuple(dict.fromkeys((*operations, call.operation.operation_id)))
    return evolve(
        task, calls=task.calls_with(entry), operations=operations, updated_at=ask.now, **changes
    )


def _counted(counts: Mapping[str, int], key: str) -> dict[str, int]:
    """``counts`` with one more execution of ``key``, at most
    :data:`IDENTICAL_CALLS_KEPT` keys (the oldest dropped)."""
    out = {**counts, key: counts.get(key, 0) + 1}
    while len(out) > IDENTICAL_CALLS_KEPT:
        del out[next(iter(out))]
    return out


def _admit(ask: _Ask) -> _Answer:
    call, task = ask.call, ask.task
    u = task.used
    poll = call.kind is CallKind.POLL
    changes: dict[str, Any] = {
        "used": evolve(
            u,
            tool_calls=u.tool_calls + 1,
            polls=u.polls + (1 if poll else 0),
            per_tool={**u.per_tool, call.tool: u.per_tool.get(call.tool, 0) + 1},
        ),
        "identical_calls": (
            task.identical_calls if poll else _counted(task.identical_calls, ask.key)
        ),
        "first_poll_at": (task.first_poll_at or ask.now) if poll else task.first_poll_at,
    }
    if call.flaw is CallFlaw.REPEAT:
        counted = evolve(task, updated_at=ask.now, **changes)
        return counted, None, ToolOutcome(ToolDecision.DENY, DenyReason.DUPLICATE_CALL)
    task = _record(ask, CallStatus.PENDING, **changes)
    new_op = ask.write.operation if ask.write is not None else None
    record = ask.write.record if ask.write is not None else None
    return task, new_op, ToolOutcome(ToolDecision.EXECUTE, None, call.call_id, record)


def admit_tool_call(
    task: Task,
    call: ToolCall,
    op: Operation | None,
    op_policy: OperationPolicy,
    now: float,
    stopped: EndReason | None = None,
    *,
    open_count: int,
) -> tuple[Task, Operation | None, ToolOutcome]:
    """Decide a tool call before anything executes (rules above).

    A write that passes every rule and would open one more operation of its
    workflow is refused past ``op_policy.max_open_per_workflow``, as a
    ``begin`` is: nothing is recorded, the task goes on.

    :param op: the ledger record of ``call.operation`` (writes only).
    :param open_count: the open operations of the task's workflow (writes only).
    :returns: the task and operation to store (None: unchanged), and the outcome.
    :raises StateConflict: a caller-given ``call_id`` already names another call.
    :raises TooManyOpen: the write would open one operation past the bound.
    """
    write = None
    if call.kind is CallKind.WRITE and call.operation is not None and task.envelope is None:
        write = admit_write(op, call.operation, op_policy, now)
    ask = _Ask(task, call, write, now, stopped)
    for rule in TOOL_RULES:
        answer = rule(ask)
        if answer is not None:
            return answer
    if write is not None and call.operation is not None:
        require_open_room(op, call.operation, op_policy, open_count)
    return _admit(ask)


def money_bound_required(task: Task) -> bool:
    """True when a model turn must bound its own cost to be admitted: the task
    has a money budget (``max_cost``) and has not ended (DESIGN §3 ``max_cost``).
    A turn of a model with no price, or whose request does not bound what it
    costs, is then refused before anything is reserved."""
    return task.envelope is None and task.limits.max_cost is not None

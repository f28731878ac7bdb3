"""Which n8n executions acted for what, and what a stop may claim (DESIGN §6), as pure functions.

An n8n execution that acted for a chain or a task is remembered on it as
``{execution_id, execution_mode, at}`` (the last :data:`REMEMBERED` of
them); a chain or task stop asks n8n to stop those, and only those. A
workflow stop asks n8n for the workflow's ``running`` and ``waiting``
executions and keeps those of the stop's own mode: n8n runs an execution
started from the editor in mode ``manual``, which a node sees as
``$execution.mode == "test"`` (n8n-core ``get-additional-keys``); every other
n8n mode (``trigger``, ``webhook``, ``retry``, ...) is ``production``. So a
test-mode stop never cancels a production execution, nor the other way round.

After asking, loopstop polls each execution until n8n reports a finished
status (n8n-workflow ``isTerminalExecutionStatus``: ``canceled``, ``crashed``,
``error``, ``success``) or ``confirm_s`` passes. An execution whose end was
not seen is ``unconfirmed``: nothing here ever reports it stopped.

A chain or task stop asks n8n only for the executions that are its own
(:func:`reach`): each remembered id is read from n8n first, and n8n's
``workflowId`` must be the workflow the id was remembered for (the record's
``workflow``, which the Loop Stop node sends as ``$workflow.id``) and n8n's
mode the stop's mode. A request can name any id (n8n's are sequential), so an
id of another workflow's execution, or one outside the stopping token's
workflows, is ``refused`` and never stopped. A record whose workflow is a
name rather than n8n's id matches no execution: its stops are refused too
(safe: loopstop never guesses which n8n workflow a name means).

A sub-workflow's execution is the child workflow's (n8n's ``workflowId``),
run in mode ``integrated``. It is stopped when n8n itself says the record's
workflow started it: n8n writes ``parentExecution: {executionId,
workflowId}`` (n8n-workflow ``RelatedExecution``) into a sub-execution's
data when an Execute Workflow node or a Call n8n Workflow Tool starts it,
and the public API returns it with ``includeData=true``. Following those
parents, at most :data:`MAX_PARENT_HOPS` of them, must reach an execution
whose ``workflowId`` is the record's workflow, in the stop's mode (the
child's own ``integrated`` mode is not compared: it runs as part of that
execution). The token must hold the record's workflow, not the child's: a
child that an execution of A started is A's doing, and an execution of B
that no execution of A started (a top-level run, a sub-execution of B's own
run) is never reached through A's record.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

#: How many executions a chain or a task remembers (the most recent ones).
REMEMBERED = 50

#: n8n statuses of an execution that has ended (n8n-workflow ``execution-status``).
FINISHED = frozenset({"canceled", "crashed", "error", "success"})
#: n8n statuses a stop is asked for (``new`` and ``unknown`` are asked too: they may run).
STOPPABLE = frozenset({"new", "running", "waiting", "unknown"})

ExecutionMode = Literal["test", "production"]

#: What an ``execution_id`` must be wherever it enters (n8n's ids are decimal
#: strings), as JSON Schema reads it; checked whole (``fullmatch``).
EXECUTION_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
_EXECUTION_ID = re.compile(EXECUTION_ID_PATTERN)


def valid_execution_id(value: str) -> bool:
    """Whether ``value`` is an execution id loopstop accepts (the whole string)."""
    return _EXECUTION_ID.fullmatch(value) is not None


def mode_of_n8n(n8n_mode: str | None) -> ExecutionMode:
    """n8n's execution ``mode`` as a node sees it in ``$execution.mode``."""
    return "test" if n8n_mode == "manual" else "production"


def remember(
    executions: Sequence[Mapping[str, Any]],
    execution_id: str | None,
    mode: ExecutionMode,
    now: float,
    limit: int = REMEMBERED,
    workflow: str | None = None,
) -> tuple[dict[str, Any], ...] | None:
    """The list with ``execution_id`` added (or moved last), bounded to ``limit``,
    each entry ``{execution_id, execution_mode, workflow, at}``: ``workflow`` is
    the one the request acted for (a stop checks n8n's ``workflowId`` against it).

    :returns: the new list, or None when nothing changes (no id, or it is
        already the most recent entry): the caller then writes nothing.
    """
    if not execution_id:
        return None
    if executions and executions[-1].get("execution_id") == execution_id:
        return None
    kept = [dict(e) for e in executions if e.get("execution_id") != execution_id]
    entry: dict[str, Any] = {"execution_id": execution_id, "execution_mode": mode, "at": now}
    if workflow is not None:
        entry["workflow"] = workflow
    kept.append(entry)
    return tuple(kept[-limit:])


def of_mode(executions: Iterable[Mapping[str, Any]], mode: ExecutionMode) -> list[str]:
    """The remembered execution ids of one mode, oldest first."""
    return [str(e["execution_id"]) for e in executions if e.get("execution_mode", mode) == mode]


@dataclass(frozen=True)
class Target:
    """A remembered execution a chain or task stop may ask n8n about.

    :ivar workflow: the workflow it was remembered for (n8n's ``workflowId``
        must be this one); None for a task that names no workflow (refused).
    :ivar in_scope: the stopping token holds that workflow.
    """

    execution_id: str
    workflow: str | None
    in_scope: bool = True


def targets(
    executions: Iterable[Mapping[str, Any]],
    mode: ExecutionMode,
    own_workflow: str | None,
    allows: Callable[[str | None], bool],
) -> list[Target]:
    """The remembered executions of ``mode``, oldest first, each with the workflow
    it acted for (entries remembered without one: the record's ``own_workflow``)
    and whether ``allows`` (the stopping token's scope) holds that workflow."""
    out = []
    for e in executions:
        if e.get("execution_mode", mode) != mode:
            continue
        workflow = e.get("workflow")
        workflow = workflow if isinstance(workflow, str) else own_workflow
        out.append(Target(str(e["execution_id"]), workflow, allows(workflow)))
    return out


def refusal_before_asking(target: Target) -> str | None:
    """What :func:`reach` can tell before n8n is read: a malformed id, or a
    workflow outside the token's scope (n8n is then never asked about it)."""
    if not valid_execution_id(target.execution_id):
        return "refused: not an n8n execution id"
    if not target.in_scope:
        return "refused: the execution acted for a workflow outside the token's scope"
    if target.workflow is None:
        return "refused: the record names no workflow, so no n8n execution can be matched to it"
    return None


#: How many parents a stop follows from a remembered execution of another workflow
#: towards an execution of the record's own (a child, a grandchild, a great-grandchild).
MAX_PARENT_HOPS = 3


@dataclass(frozen=True)
class Reported:
    """What n8n reported of one execution (``GET /executions/{id}``).

    :ivar found: n8n knows it (False: it answered 404).
    :ivar parent_read: its data was read (``includeData=true``), so
        ``parent_id`` is what n8n says started it (None: nothing did).
    :ivar parent_id: n8n's ``data.parentExecution.executionId``.
    :ivar data_withheld: n8n gave no data to read (``dataTooLargeToDisplay``,
        or an answer too large or unreadable): who started it is unknown.
    """

    execution_id: str
    workflow_id: str | None
    mode: str | None
    found: bool = True
    parent_read: bool = False
    parent_id: str | None = None
    data_withheld: bool = False


@dataclass(frozen=True)
class Lineage:
    """What :func:`reach` decided about one remembered execution.

    :ivar ask: the execution n8n must be asked about next (None: decided).
    :ivar with_parent: read ``ask`` with its data, for its parent.
    :ivar refused: why it must not be stopped (None with no ``ask``: it may).
    """

    ask: str | None = None
    with_parent: bool = False
    refused: str | None = None


def reach(target: Target, mode: ExecutionMode, seen: Mapping[str, Reported]) -> Lineage:
    """Whether a chain or task stop may stop ``target`` (DESIGN §6), from what n8n
    reported so far (``seen``, by execution id), or what n8n must tell next.

    Stopped: an execution n8n runs for the target's workflow in the stop's mode,
    or one whose n8n parents (``parentExecution``, at most
    :data:`MAX_PARENT_HOPS`) reach such an execution. Refused: everything else
    (another workflow's execution that no execution of the target's workflow
    started, a parent n8n does not know, data n8n withheld, a cycle).
    """
    before = refusal_before_asking(target)
    if before is not None:
        return Lineage(refused=before)
    workflow = target.workflow
    current = target.execution_id
    path: list[str] = []
    for hop in range(MAX_PARENT_HOPS + 1):
        r = seen.get(current)
        if r is None:
            return Lineage(ask=current)
        which = "this execution" if hop == 0 else f"its parent execution {current}"
        if not r.found:
            if hop == 0:
                return Lineage(refused="refused: n8n does not know this execution")
            return Lineage(refused=_foreign(workflow, f"n8n does not know {which}"))
        if r.workflow_id == workflow:
            if mode_of_n8n(r.mode) != mode:
                return Lineage(refused=f"refused: n8n runs {which} in another mode than {mode}")
            return Lineage()
        path.append(current)
        if hop == MAX_PARENT_HOPS:
            break
        if not r.parent_read:
            return Lineage(ask=current, with_parent=True)
        if r.data_withheld:
            return Lineage(refused=_foreign(workflow, f"n8n withheld the data of {which}"))
        if r.parent_id is None:
            return Lineage(refused=_foreign(workflow, f"no execution started {which}"))
        if not valid_execution_id(r.parent_id) or r.parent_id in path:
            return Lineage(refused=_foreign(workflow, f"n8n names a bad parent of {which}"))
        current = r.parent_id
    return Lineage(
        refused=_foreign(workflow, f"none within {MAX_PARENT_HOPS} parents is one of its")
    )


def _foreign(workflow: str | None, why: str) -> str:
    return (
        f"refused: n8n runs this execution for another workflow than {workflow!r} and {why} "
        "(a stop reaches the record's workflow's executions and the sub-executions they started)"
    )


class Confirmation(StrEnum):
    """What loopstop can say about one execution after asking n8n to stop it."""

    STOPPED = "stopped"  # n8n reported it canceled after loopstop asked
    FINISHED = "finished"  # it ended by itself (success, error, crashed) meanwhile
    ALREADY_FINISHED = "already_finished"  # it had finished before loopstop asked
    UNCONFIRMED = "unconfirmed"  # no finished status seen within confirm_s
    NOT_FOUND = "not_found"  # n8n does not know it (deleted, or another instance's)
    REFUSED = "refused"  # not the chain's or task's own (another workflow or mode): not asked


@dataclass(frozen=True)
class ExecutionResult:
    """One execution of a stop's answer.

    :ivar status_before: n8n's status when loopstop first looked (None: not seen).
    :ivar status_after: n8n's last reported status (None: never seen).
    :ivar confirmed: n8n reported a finished status; never true without it.
    """

    execution_id: str
    status_before: str | None
    status_after: str | None
    confirmed: bool
    result: Confirmation
    error: str | None = None

    def to_doc(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "status_before": self.status_before,
            "status_after": self.status_after,
            "confirmed": self.confirmed,
            "result": str(self.result),
            "error": self.error,
        }


def judge(
    execution_id: str,
    status_before: str | None,
    status_after: str | None,
    found: bool = True,
    error: str | None = None,
    refused: str | None = None,
) -> ExecutionResult:
    """Classify one execution from what n8n reported before and after the stop.

    Only a finished status reported by n8n confirms; a missing execution is
    ``not_found`` (not confirmed: loopstop did not see it end); a refused one
    (:func:`reach`, its reason in ``refused``) is ``refused``, shown without
    the statuses of an execution that is not the stop's own.
    """
    if refused is not None:
        return ExecutionResult(execution_id, None, None, False, Confirmation.REFUSED, refused)
    if not found:
        return ExecutionResult(
            execution_id, status_before, status_after, False, Confirmation.NOT_FOUND, error
        )
    if status_before in FINISHED:
        return ExecutionResult(
            execution_id,
            status_before,
            status_after or status_before,
            True,
            Confirmation.ALREADY_FINISHED,
            error,
        )
    if status_after in FINISHED:
        how = Confirmation.STOPPED if status_after == "canceled" else Confirmation.FINISHED
        return ExecutionResult(execution_id, status_before, status_after, True, how, error)
    return ExecutionResult(
        execution_id, status_before, status_after, False, Confirmation.UNCONFIRMED, error
    )


class CancellationState(StrEnum):
    """The outcome of asking n8n to stop what a loopstop stop covers."""

    CONFIRMED = "confirmed"  # every execution reported finished
    PARTIAL = "partial"  # some executions could not be confirmed
    FAILED = "failed"  # n8n could not be asked (unreachable, key refused)
    NOT_CONFIGURED = "not_configured"  # no ``n8n`` section: loopstop's stop only
    NOTHING_TO_STOP = "nothing_to_stop"  # no running or waiting execution was known


def summarize(results: Sequence[ExecutionResult], failure: str | None) -> CancellationState:
    """The stop's overall cancellation state from each execution's result."""
    if failure is not None:
        return CancellationState.FAILED
    if not results:
        return CancellationState.NOTHING_TO_STOP
    if all(r.confirmed for r in results):
        return CancellationState.CONFIRMED
    return CancellationState.PARTIAL

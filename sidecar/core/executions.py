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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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

#: What an n8n execution id may be wherever loopstop takes one (the API's
#: ``execution_id`` fields, the model gate's ``loopstop-execution`` line): n8n's
#: ids are decimal; nothing here is ever a path segment such as ``..``.
EXECUTION_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"


def mode_of_n8n(n8n_mode: str | None) -> ExecutionMode:
    """n8n's execution ``mode`` as a node sees it in ``$execution.mode``."""
    return "test" if n8n_mode == "manual" else "production"


def remember(
    executions: Sequence[Mapping[str, Any]],
    execution_id: str | None,
    mode: ExecutionMode,
    now: float,
    limit: int = REMEMBERED,
) -> tuple[dict[str, Any], ...] | None:
    """The list with ``execution_id`` added (or moved last), bounded to ``limit``.

    :returns: the new list, or None when nothing changes (no id, or it is
        already the most recent entry): the caller then writes nothing.
    """
    if not execution_id:
        return None
    if executions and executions[-1].get("execution_id") == execution_id:
        return None
    kept = [dict(e) for e in executions if e.get("execution_id") != execution_id]
    kept.append({"execution_id": execution_id, "execution_mode": mode, "at": now})
    return tuple(kept[-limit:])


def of_mode(executions: Iterable[Mapping[str, Any]], mode: ExecutionMode) -> list[str]:
    """The remembered execution ids of one mode, oldest first."""
    return [str(e["execution_id"]) for e in executions if e.get("execution_mode", mode) == mode]


class Confirmation(StrEnum):
    """What loopstop can say about one execution after asking n8n to stop it."""

    STOPPED = "stopped"  # n8n reported it canceled after loopstop asked
    FINISHED = "finished"  # it ended by itself (success, error, crashed) meanwhile
    ALREADY_FINISHED = "already_finished"  # it had finished before loopstop asked
    UNCONFIRMED = "unconfirmed"  # no finished status seen within confirm_s
    NOT_FOUND = "not_found"  # n8n does not know it (deleted, or another instance's)


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
) -> ExecutionResult:
    """Classify one execution from what n8n reported before and after the stop.

    Only a finished status reported by n8n confirms; a missing execution is
    ``not_found`` (not confirmed: loopstop did not see it end).
    """
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

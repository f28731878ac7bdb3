"""A task's lifecycle (DESIGN §3): create, continue (a re-activation), end
with an envelope, complete, stop, resume.

- **Create**: attempt 1, nothing used, at validated revision 0 or the
  ``initial_revision`` given.
- **Continue**: the same ``task_key`` created again (an error branch
  re-entering the flow, a trigger re-firing, an execution re-run) continues
  every counter: identical calls, idle results, retries, cycles and budgets.
  A re-run of a flow whose writes are committed is served by replays.
- **End**: the first terminal reason wins and is sticky.
- **Complete**: an exit passes only on a check's verdict or trusted
  ``done: true``; a failed exit costs one idle step.
- **Stop**: sticky ``stopped``, ``operator_stop``.
- **Resume**: the only new run: a linked attempt, recorded with its actor,
  that keeps budgets, ledger and history and restarts the identical-call,
  idle, unchanged-poll and cycle counts (a person changed the context).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sidecar.core.frozen import evolve
from sidecar.core.stops import StopScope
from sidecar.core.tasks.limits import TaskLimits, from_micros
from sidecar.core.tasks.outcomes import (
    NEXT_ACTIONS,
    STATUS_OF,
    CompleteDecision,
    CompleteOutcome,
    CompleteReason,
    EndReason,
    TaskStatus,
)
from sidecar.core.tasks.state import Envelope, Evidence, Task
from sidecar.errors import Forbidden, StateConflict, ValidationFailed


def new_task(
    task_id: str,
    task_key: str | None,
    workflow: str | None,
    chain_id: str | None,
    policy: str | None,
    limits: TaskLimits,
    allowed_tools: Sequence[str] | None,
    now: float,
    initial_revision: int = 0,
) -> Task:
    """A running task, attempt 1, nothing used, at ``initial_revision``."""
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
        initial_revision=initial_revision,
        validated_revision=initial_revision,
    )


def reactivate(task: Task, now: float) -> Task:
    """The task created again under its ``task_key``: every counter continues
    (a counter that starts again at each activation does not bound a chain
    of activations); only the activation is counted. An ended task is
    returned unchanged."""
    if task.envelope is not None:
        return task
    return evolve(task, activations=task.activations + 1, updated_at=now)


def deadline_passed(task: Task, now: float) -> bool:
    """Whether ``deadline_s`` seconds have passed since the task was created
    (at the deadline itself counts as passed). Both a call admitted and a
    result recorded at or after it end the task ``partial``, ``deadline``, as
    the reference runner 000 checks its clock before dispatch and again after
    the result."""
    return now - task.created_at >= task.limits.deadline_s


def elapsed_s(task: Task, now: float) -> float:
    """Seconds since the task was created (until it ended)."""
    return round(max(0.0, (task.ended_at or now) - task.created_at), 3)


def overshoot(task: Task) -> dict[str, float]:
    """``{"cost_overshoot": amount}`` when the money settled passed ``max_cost``
    (a turn that cost more than its reservation), else nothing."""
    limit = task.limits.max_cost_micros
    if limit is None or task.used.cost_micros <= limit:
        return {}
    return {"cost_overshoot": from_micros(task.used.cost_micros - limit)}


def end(task: Task, reason: EndReason, now: float, uncertain: Sequence[str] = ()) -> Task:
    """The task with its terminal envelope. Sticky: a task that has one keeps it."""
    if task.envelope is not None:
        return task
    status = STATUS_OF[reason]
    ended = evolve(task, ended_at=now, updated_at=now)
    envelope = Envelope(
        task_id=task.task_id,
        attempt=task.attempt,
        status=status,
        reason=reason,
        validated_revision=task.validated_revision,
        used={
            "model_calls": task.used.model_calls,
            "tool_calls": task.used.tool_calls,
            "tokens": task.used.tokens,
            "polls": task.used.polls,
            "cost": from_micros(task.used.cost_micros),
            "elapsed_s": elapsed_s(ended, now),
            **overshoot(task),
        },
        last_good=task.last_good,
        uncertain_operations=tuple(sorted(set(uncertain))),
        allowed_next_actions=NEXT_ACTIONS[status],
    )
    return evolve(ended, envelope=envelope)


def idle_step(task: Task) -> tuple[Task, bool]:
    """One more result without progress; True when that reaches ``max_idle``."""
    idle = task.used.idle + 1
    return evolve(task, used=evolve(task.used, idle=idle)), idle >= task.limits.max_idle


def complete(
    task: Task, evidence: Evidence | None, passed: bool | None, now: float
) -> tuple[Task, CompleteOutcome]:
    """Validate an exit. ``passed`` is a check's verdict (None: use ``evidence.done``).

    Pass -> ``completed``, ``verified_done``; fail -> ``continue``,
    ``check_failed`` at the cost of one idle step (``ended``, ``no_progress``
    at ``max_idle``); an ended task -> ``ended`` with its reason.
    """
    if task.envelope is not None:
        return task, CompleteOutcome(CompleteDecision.ENDED, task.envelope.reason)
    done = passed if passed is not None else bool(evidence and evidence.done)
    if done:
        if evidence is not None and evidence.revision is not None:
            task = evolve(task, validated_revision=max(evidence.revision, task.validated_revision))
        return end(task, EndReason.VERIFIED_DONE, now), CompleteOutcome(
            CompleteDecision.COMPLETED, EndReason.VERIFIED_DONE
        )
    task, exhausted = idle_step(evolve(task, updated_at=now))
    if exhausted:
        return end(task, EndReason.NO_PROGRESS, now), CompleteOutcome(
            CompleteDecision.ENDED, EndReason.NO_PROGRESS
        )
    return task, CompleteOutcome(CompleteDecision.CONTINUE, CompleteReason.CHECK_FAILED)


def stopped_by(scope: StopScope | None) -> EndReason | None:
    """The end reason of a task covered by a sticky stop
    (:func:`sidecar.core.stops.covering`); None when no stop covers it."""
    if scope is None:
        return None
    if scope is StopScope.WORKFLOW:
        return EndReason.WORKFLOW_STOPPED
    return EndReason.CHAIN_STOPPED


def exit_check(policy_exit_check: str | None, named: str | None) -> str | None:
    """The check a completion runs: a policy with an ``exit_check`` completes
    only through it; else the check the request names (None: trusted evidence).

    :raises ValidationFailed: the request names another check than the policy's.
    """
    if policy_exit_check is not None and named not in (None, policy_exit_check):
        raise ValidationFailed(
            [
                {
                    "loc": ["body", "check"],
                    "msg": "the policy completes only through its exit check "
                    f"{policy_exit_check!r}",
                }
            ]
        )
    return policy_exit_check or named


def require_resumable(task: Task, admin: bool) -> None:
    """A task ended ``stopped`` (an operator's or a sticky stop's decision) is
    resumed by an admin token only; any other ended task by its workflow's token.

    :raises Forbidden: a stopped task and ``admin`` False.
    """
    if task.status is TaskStatus.STOPPED and not admin:
        raise Forbidden("a stopped task is resumed by an admin token only")


def stop(task: Task, now: float, reason: EndReason = EndReason.OPERATOR_STOP) -> Task:
    """A sticky stop (``operator_stop``; ``outlier`` for a runaway task). An
    ended task keeps its envelope."""
    return end(task, reason, now)


def resume(
    task: Task,
    reason: str,
    extend: Mapping[str, Any] | None,
    actor: str,
    unknown_operations: Sequence[str],
    now: float,
) -> Task:
    """A linked attempt: keeps budgets, ledger and history; restarts the
    identical-call, idle, unchanged-poll and cycle counts. Recorded with
    ``actor``, ``reason`` and ``extend`` (raised limits).

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
        limits = TaskLimits.from_doc(merged)
    record = {
        "attempt": task.attempt + 1,
        "at": now,
        "reason": reason,
        "actor": actor,
        "extend": dict(extend) if extend else None,
        "previous": {"status": str(task.envelope.status), "reason": str(task.envelope.reason)},
    }
    return evolve(
        task,
        attempt=task.attempt + 1,
        limits=limits,
        envelope=None,
        ended_at=None,
        identical_calls={},
        used=evolve(task.used, idle=0, unchanged_polls=0),
        resumes=(*task.resumes, record),
        updated_at=now,
    )

"""Text written for the model: why a task ended or a call was denied, and
what to do instead (DESIGN §3 ``message``, §5 the gate's final answer).

The core decides with enums; this module turns them into sentences.
"""

from __future__ import annotations

from sidecar.core.tasks import DenyReason, EndReason, Task

MESSAGES: dict[EndReason, str] = {
    EndReason.DEADLINE: "The task's time is up: give your final answer now with what you have.",
    EndReason.MODEL_BUDGET: "The task used all its model turns: answer now with what you have.",
    EndReason.TOOL_BUDGET: "The task used its tool budget: do not call tools again; "
    "answer with what you have.",
    EndReason.TOKEN_BUDGET: "The task used its token budget: answer now with what you have.",
    EndReason.COST_BUDGET: "The task used its money budget: answer now with what you have.",
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
    EndReason.OUTLIER: "This task ran far longer than tasks of its kind and was stopped: do "
    "not call tools; end your answer.",
    EndReason.POLICY_DENIED: "This tool is not allowed for this task: use an allowed tool or "
    "give your final answer.",
    EndReason.OPERATION_CONFLICT: "That write conflicts with one already recorded under the same "
    "operation id: do not retry it; report the conflict.",
    EndReason.FATAL_RESULT: "The tool failed for good: do not retry it; report the failure.",
    EndReason.UNVERIFIED_RESULT: "The tool's result could not be verified: do not rely on it; "
    "report what is known.",
    EndReason.INVALID_EVIDENCE: "The tool's result contradicted the task's state: stop and "
    "report it.",
    EndReason.INVALID_CALL: "The model proposed a call that cannot be run as proposed (a tool "
    "not offered, no call id, or a value it needs missing): do not repeat it; report it.",
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


DUPLICATE_MESSAGE = (
    "That call repeats a call id already proposed and not yet answered: do not repeat it; use "
    "the result you have or give your final answer."
)


ASKED_ENOUGH_MESSAGE = (
    "[loopstop] The writes you keep proposing are already done or being written "
    "(the gate answered them for you several times in this turn): do not propose them "
    "again; give your final answer with what you have."
)


def message(reason: EndReason | DenyReason | str | None) -> str | None:
    """The sentence for the model about ``reason`` (None when there is none)."""
    if reason is None:
        return None
    if reason == DenyReason.IN_PROGRESS:
        return IN_PROGRESS_MESSAGE
    if reason == DenyReason.DUPLICATE_CALL:
        return DUPLICATE_MESSAGE
    try:
        return MESSAGES[EndReason(reason)]
    except ValueError:
        return None


def final_message(task: Task) -> str:
    """What the model gate answers for an ended task: a plain final assistant message."""
    envelope = task.envelope
    status = "" if envelope is None else str(envelope.status)
    reason = "" if envelope is None else str(envelope.reason)
    why = message(reason) or ""
    return (
        f"[loopstop] This task has ended: {status} ({reason}). {why} "
        f"The workflow can read the full result with GET /v1/tasks/{task.task_id}."
    ).replace("  ", " ")


WRAP_UP_MESSAGE = (
    "[loopstop] The task is close to its budget. Conclude now: give your final answer "
    "with what you have, and do not call more tools."
)

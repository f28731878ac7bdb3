"""The task guard (DESIGN §3): bounded agent runs, as pure functions.

A *task* is one job an AI Agent works on across executions, workers and
restarts. Before each model turn and each tool call the flow asks for
admission; budgets are reserved first, so concurrent calls cannot
overshoot. When a rule ends the task it gets a terminal *envelope*; from
then on every call returns that same envelope and nothing executes
(sticky). Only validated evidence completes a task: a budget or a loop stop
is never ``completed``.

Counting, as the reference runners count:

- a task starts at validated revision 0 (or its ``initial_revision``); a
  result is progress only when its revision is greater than the current
  one; evidence at the current revision is idle;
- ``max_same_call: N`` allows N executions of one identical call (tool and
  RFC 8785 arguments) per validated revision over the whole task; the
  N+1-th is denied, whatever came in between; a replay of a committed write
  executes nothing and is exempt;
- every count continues across activations of one ``task_key``; only an
  explicit resume starts a new run.

Modules, in reading order:

- :mod:`~sidecar.core.tasks.outcomes`: statuses, end reasons, next actions,
  each route's decision enum;
- :mod:`~sidecar.core.tasks.limits`: limits, their defaults, resolution and
  what each one counts;
- :mod:`~sidecar.core.tasks.state`: the typed task, its calls and envelope;
- :mod:`~sidecar.core.tasks.admission`: the numbered rules of a model turn
  and of a tool call;
- :mod:`~sidecar.core.tasks.results`: the numbered steps of a result;
- :mod:`~sidecar.core.tasks.ledger_bridge`: the one door to the ledger;
- :mod:`~sidecar.core.tasks.lifecycle`: create, continue, end, complete, stop, resume.

Times are epoch seconds; every function takes ``now``; no I/O.
"""

from sidecar.core.tasks.admission import (
    TOOL_RULES,
    CallFlaw,
    ToolCall,
    admit_model_call,
    admit_tool_call,
    money_bound_required,
    record_tokens,
    screen_proposal,
    settle_model_call,
)
from sidecar.core.tasks.ledger_bridge import unknown_operations
from sidecar.core.tasks.lifecycle import (
    complete,
    elapsed_s,
    end,
    exit_check,
    new_task,
    reactivate,
    require_resumable,
    resume,
    stop,
    stopped_by,
)
from sidecar.core.tasks.limits import (
    LIMITS,
    MICROS,
    LimitRule,
    TaskLimits,
    from_micros,
    loosened,
    require_tightened,
    resolve_limits,
    to_micros,
)
from sidecar.core.tasks.outcomes import (
    NEXT_ACTIONS,
    STATUS_OF,
    CompleteDecision,
    CompleteOutcome,
    CompleteReason,
    DenyReason,
    EndReason,
    LifecycleDecision,
    ModelDecision,
    ModelOutcome,
    NextAction,
    ResultDecision,
    ResultOutcome,
    TaskStatus,
    ToolDecision,
    ToolOutcome,
    TurnDecision,
    TurnReason,
)
from sidecar.core.tasks.results import CheckVerdict, ToolResult, record_result
from sidecar.core.tasks.state import (
    CALL_HISTORY,
    PRINT_DIGITS,
    CallKind,
    CallRecord,
    CallStatus,
    Effect,
    Envelope,
    Evidence,
    ResultStatus,
    Task,
    Used,
)

#: Every enum whose members a task route answers or logs (metrics label values).
DECISION_ENUMS = (
    TaskStatus,
    EndReason,
    ModelDecision,
    TurnDecision,
    TurnReason,
    ToolDecision,
    DenyReason,
    ResultDecision,
    CompleteDecision,
    CompleteReason,
    LifecycleDecision,
    ResultStatus,
    CallStatus,
)

__all__ = [
    "CALL_HISTORY",
    "DECISION_ENUMS",
    "LIMITS",
    "MICROS",
    "NEXT_ACTIONS",
    "PRINT_DIGITS",
    "STATUS_OF",
    "TOOL_RULES",
    "CallFlaw",
    "CallKind",
    "CallRecord",
    "CallStatus",
    "CheckVerdict",
    "CompleteDecision",
    "CompleteOutcome",
    "CompleteReason",
    "DenyReason",
    "Effect",
    "EndReason",
    "Envelope",
    "Evidence",
    "LifecycleDecision",
    "LimitRule",
    "ModelDecision",
    "ModelOutcome",
    "NextAction",
    "ResultDecision",
    "ResultOutcome",
    "ResultStatus",
    "Task",
    "TaskLimits",
    "TaskStatus",
    "ToolCall",
    "ToolDecision",
    "ToolOutcome",
    "ToolResult",
    "TurnDecision",
    "TurnReason",
    "Used",
    "admit_model_call",
    "admit_tool_call",
    "complete",
    "elapsed_s",
    "end",
    "exit_check",
    "from_micros",
    "loosened",
    "money_bound_required",
    "new_task",
    "reactivate",
    "record_result",
    "record_tokens",
    "require_resumable",
    "require_tightened",
    "resolve_limits",
    "resume",
    "screen_proposal",
    "settle_model_call",
    "stop",
    "stopped_by",
    "to_micros",
    "unknown_operations",
]

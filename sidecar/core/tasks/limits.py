"""Task limits (DESIGN §3): their defaults (defined here once), how a task's
limits are resolved from configuration, policy and request, and what each
one counts.

Money is held in integer micro-units of the configured currency
(:data:`MICROS`, 1e-6): sums of reservations and settlements never drift the
way binary floats do, and a store holds them exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.frozen import build, known_items, shallow_doc
from sidecar.errors import Forbidden

#: Micro-units in one unit of the currency.
MICROS = 1_000_000


def to_micros(amount: float) -> int:
    """An amount of money in micro-units, rounded up (a reservation never falls short)."""
    return max(0, math.ceil(round(amount * MICROS, 3)))


def from_micros(micros: int) -> float:
    """Micro-units as an amount of money."""
    return micros / MICROS


@dataclass(frozen=True)
class TaskLimits:
    """Resolved limits of one task (configuration, then policy, then the request).

    These defaults are the product's: the configuration's ``limits`` section
    validates into this class. Counts are "N allowed, the N+1-th denied"
    (see :data:`LIMITS`); times in seconds; ``max_cost`` in the configured
    currency (None: no money budget).
    """

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
    max_cost: float | None = None
    wrap_up_ratio: float = 0.8

    def to_doc(self) -> dict[str, Any]:
        """The stored (and shown) form: scalars plus a copy of ``per_tool``."""
        doc = shallow_doc(self)
        doc["per_tool"] = dict(self.per_tool)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> TaskLimits:
        """The limits of a stored (or merged) document; fields it lacks take their default."""
        return build(cls, known_items(cls, doc))

    @property
    def max_cost_micros(self) -> int | None:
        return None if self.max_cost is None else to_micros(self.max_cost)


@dataclass(frozen=True)
class LimitRule:
    """What one limit counts, as the docs' table of limits says it (one row).

    :ivar counts: what is counted; "N allowed, the N+1-th denied" unless said.
    :ivar scope: ``per task``, ``per tool``, ``per revision`` or ``in a row``.
    :ivar across_activations: the count continues when the task is created
        again under its ``task_key``.
    :ivar resume_resets: an explicit resume starts this count again.
    """

    name: str
    reason: str
    counts: str
    scope: str
    across_activations: bool
    resume_resets: bool


#: Every limit, in the order of the docs' table of limits (tested against it); a
#: limit that ends the task at two kinds of step has one row for each.
LIMITS: tuple[LimitRule, ...] = (
    LimitRule("max_model_calls", "model_budget", "model turns admitted", "per task", True, False),
    LimitRule(
        "max_tool_calls",
        "tool_budget",
        "tool calls admitted to execute (replays of committed writes not counted)",
        "per task",
        True,
        False,
    ),
    LimitRule(
        "per_tool", "tool_budget", "calls of one tool admitted to execute", "per tool", True, False
    ),
    LimitRule(
        "max_same_call",
        "same_call",
        "executions of one identical call (tool + RFC 8785 args), wherever they fall; "
        "polls and replays exempt",
        "per revision",
        True,
        True,
    ),
    LimitRule(
        "max_idle",
        "no_progress",
        "idle results: evidence not above the validated revision, a result seen before, "
        "a failed check or exit (the N-th ends the task)",
        "since the last progress",
        True,
        True,
    ),
    LimitRule(
        "max_idle",
        "no_progress",
        "retryable or lost read results whose revision does not rise, each one also a retry "
        "(the N-th ends the task, before max_retries when both are reached)",
        "since the last progress",
        True,
        True,
    ),
    LimitRule(
        "max_cycle_repeats",
        "cycle",
        "occurrences in a row of one block of 2+ calls (the call completing the N-th is denied)",
        "per revision",
        True,
        True,
    ),
    LimitRule("max_polls", "poll_budget", "polls admitted", "per task", True, False),
    LimitRule(
        "max_unchanged_polls",
        "poll_stalled",
        "unchanged poll results (the N-th ends the task)",
        "in a row",
        True,
        True,
    ),
    LimitRule(
        "max_retries",
        "retry_budget",
        "retryable or lost results, each one also idle (the N+1-th ends the task); "
        "a success starts it again",
        "in a row",
        True,
        False,
    ),
    LimitRule(
        "deadline_s",
        "deadline",
        "seconds since the task was created (a call at N or later is denied)",
        "per task",
        True,
        False,
    ),
    LimitRule(
        "deadline_s",
        "deadline",
        "seconds since the task was created, at a result (a result recorded at N or later "
        "ends the task, once its write is settled)",
        "per task",
        True,
        False,
    ),
    LimitRule(
        "poll_deadline_s",
        "poll_budget",
        "seconds since the task's first poll (a poll at N or later is denied)",
        "per task",
        True,
        False,
    ),
    LimitRule(
        "max_tokens",
        "token_budget",
        "tokens reported; a turn is denied once they reach N",
        "per task",
        True,
        False,
    ),
    LimitRule(
        "max_cost",
        "cost_budget",
        "money settled plus reserved; a turn is denied when its reservation would pass N",
        "per task",
        True,
        False,
    ),
)


def resolve_limits(
    defaults: TaskLimits,
    tool_max_calls: Mapping[str, int],
    policy: Mapping[str, Any] | None,
    request: Mapping[str, Any],
) -> TaskLimits:
    """A task's limits: ``defaults`` (the configuration's), then the named
    ``policy``'s given fields, then the ``request``'s given fields.

    ``per_tool`` starts from each configured tool's ``max_calls`` and is
    merged tool by tool. A layer's None values are "not given".
    """
    merged = defaults.to_doc()
    merged["per_tool"] = {**dict(tool_max_calls), **dict(defaults.per_tool)}
    for layer in (policy or {}, request):
        given = {k: v for k, v in layer.items() if v is not None}
        merged["per_tool"].update(given.pop("per_tool", None) or {})
        merged.update(given)
    return TaskLimits.from_doc(merged)


def loosened(base: TaskLimits, asked: TaskLimits) -> list[str]:
    """The limits ``asked`` sets looser than ``base`` (raising them needs an admin).

    Every limit is looser when higher; ``wrap_up_ratio`` too (a later
    wrap-up); a money budget is looser when absent where ``base`` has one.
    """
    out = []
    for name, value in asked.to_doc().items():
        limit = getattr(base, name)
        if name == "per_tool":
            out += [
                f"per_tool.{tool}"
                for tool, n in value.items()
                if base.per_tool.get(tool) is not None and n > base.per_tool[tool]
            ]
        elif limit is None:
            continue
        elif value is None or value > limit:
            out.append(name)
    return out


def require_tightened(base: TaskLimits, asked: TaskLimits, admin: bool) -> None:
    """Only an admin may loosen limits: a request may only tighten the
    configured or policy limits ``base`` (see :func:`loosened`).

    :raises Forbidden: ``asked`` loosens a limit and ``admin`` is False.
    """
    raised = [] if admin else loosened(base, asked)
    if raised:
        raise Forbidden(
            f"raising {', '.join(raised)} above the configured or policy limits needs "
            "an admin token (a request may only tighten them)"
        )

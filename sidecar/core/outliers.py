"""Runaway tasks (DESIGN §6 "Runaway tasks"), as pure functions.

Per workflow the store keeps the totals of finished tasks: how many ended
and the tokens, model turns and tool calls they used. Those are plain sums,
added at commit by the transaction that ends a task (increments commute, so
every worker and every instance agrees and none is lost); the running mean
is the sum divided by the count. A task still running is an *outlier* once
the workflow has ``min_tasks`` finished tasks and the task has used more
than ``factor`` times the mean of any measure (the reference article's
example: more than 5x the mean tokens). What happens then is the policy's
``action``: ``flag`` (a log line, a metric, a mark), ``wrap_up`` (the model
is also asked to conclude), ``stop`` (the task ends ``stopped``, ``outlier``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

#: The measures compared against the workflow's mean, as named in a task's ``used``.
MEASURES = ("tokens", "model_calls", "tool_calls")


class OutlierAction(StrEnum):
    FLAG = "flag"
    WRAP_UP = "wrap_up"
    STOP = "stop"


@dataclass(frozen=True)
class OutlierPolicy:
    """``outliers`` of the configuration; ``running_s`` is for the long-running list."""

    factor: float = 5.0
    min_tasks: int = 20
    running_s: float = 1800.0
    action: OutlierAction = OutlierAction.FLAG


@dataclass(frozen=True)
class Totals:
    """Sums over a workflow's finished tasks."""

    tasks: int = 0
    tokens: int = 0
    model_calls: int = 0
    tool_calls: int = 0

    def mean(self, measure: str) -> float:
        """The mean of ``measure`` per finished task (0 when none finished)."""
        return float(getattr(self, measure)) / self.tasks if self.tasks else 0.0


def contribution(used: Mapping[str, Any]) -> dict[str, int]:
    """What one finished task adds to its workflow's :class:`Totals`."""
    return {"tasks": 1, **{m: max(0, int(used.get(m, 0) or 0)) for m in MEASURES}}


@dataclass(frozen=True)
class Exceeded:
    """One measure past its bound: the task's value, the mean, the bound (factor x mean)."""

    measure: str
    value: int
    mean: float
    bound: float

    def to_doc(self) -> dict[str, Any]:
        return {
            "measure": self.measure,
            "value": self.value,
            "mean": round(self.mean, 3),
            "bound": round(self.bound, 3),
        }


def judge(totals: Totals, used: Mapping[str, Any], policy: OutlierPolicy) -> list[Exceeded]:
    """The measures on which a running task is an outlier (empty: it is not).

    Nothing is judged before ``min_tasks`` tasks of the workflow finished; a
    measure whose mean is 0 is skipped (every task so far used none of it:
    there is no scale to compare with).
    """
    if totals.tasks < policy.min_tasks:
        return []
    out = []
    for measure in MEASURES:
        mean = totals.mean(measure)
        value = int(used.get(measure, 0) or 0)
        bound = policy.factor * mean
        if mean > 0 and value > bound:
            out.append(Exceeded(measure, value, mean, bound))
    return out


def ends_task(exceeded: list[Exceeded], policy: OutlierPolicy) -> bool:
    """Whether a task flagged on the ``exceeded`` measures ends (``action: stop``:
    ``stopped``, ``outlier``)."""
    return bool(exceeded) and policy.action is OutlierAction.STOP


def wraps_up(exceeded: list[Exceeded], policy: OutlierPolicy) -> bool:
    """Whether the model of a task flagged on the ``exceeded`` measures is asked
    to conclude (``action: wrap_up``)."""
    return bool(exceeded) and policy.action is OutlierAction.WRAP_UP


def running_too_long(created_at: float, now: float, policy: OutlierPolicy) -> bool:
    """A running task older than ``running_s``."""
    return now - created_at > policy.running_s

"""What the task guard keeps beside a task for stops and runaway detection (DESIGN §6).

Three things, each written inside the task's own transaction:

- the task's *watch* document (``<ns>:taskwatch:<task_id>``, expiring with
  the task): the n8n executions that acted for it (a task stop stops them)
  and its outlier mark once flagged;
- the workflow's totals over finished tasks (``<ns>:totals:<wf>:<measure>``),
  incremented by the transaction that ends a task, so every worker and every
  instance computes the same running mean (:mod:`sidecar.core.outliers`);
- the index of running tasks, scored by creation time, so that tasks running
  longer than ``outliers.running_s`` are listed and counted without a scan.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sidecar.config import OutliersConfig
from sidecar.core import executions as n8n_executions
from sidecar.core import outliers
from sidecar.core import tasks as core
from sidecar.core.executions import ExecutionMode
from sidecar.core.outliers import OutlierAction, OutlierPolicy, Totals
from sidecar.core.tasks import Task
from sidecar.metrics import Metrics
from sidecar.service import keys
from sidecar.service.records import Txn
from sidecar.store import Increment

log = logging.getLogger("loopstop.decisions")

TOTALS = ("tasks", *outliers.MEASURES)


def policy_of(config: OutliersConfig) -> OutlierPolicy:
    """The core's policy from the ``outliers`` section."""
    return OutlierPolicy(
        factor=config.factor,
        min_tasks=config.min_tasks,
        running_s=config.running_s,
        action=OutlierAction(config.action),
    )


class TaskWatch:
    """Reads and plans the task's watch document, the totals and the running index.

    :param retention_s: how long a finished workflow's totals are kept after
        the last task ended (the tasks' retention).
    :param metrics: counts the tasks flagged as outliers.
    """

    def __init__(
        self, config: OutliersConfig, retention_s: float, horizon_s: float, metrics: Metrics
    ) -> None:
        self.policy = policy_of(config)
        self.retention_s = retention_s
        self.horizon_s = horizon_s
        self.metrics = metrics
        # A workflow's totals keys, built once (every decision on a task names them).
        self._totals_keys: dict[tuple[str, str | None], tuple[str, ...]] = {}

    def totals_keys(self, ns: str, workflow: str | None) -> tuple[str, ...]:
        """The keys of the workflow's totals, one per measure of :data:`TOTALS`."""
        found = self._totals_keys.get((ns, workflow))
        if found is None:
            if len(self._totals_keys) > 10_000:
                self._totals_keys.clear()
            found = tuple(keys.task_totals(ns, workflow, m) for m in TOTALS)
            self._totals_keys[(ns, workflow)] = found
        return found

    def keys(self, ns: str, task_id: str, workflow: str | None) -> list[str]:
        """The keys a decision on the task reads (declare them up front when known)."""
        return [keys.task_watch(ns, task_id), *self.totals_keys(ns, workflow)]

    @staticmethod
    def doc(txn: Txn, ns: str, task_id: str) -> dict[str, Any]:
        return dict(txn.doc(keys.task_watch(ns, task_id)) or {})

    def totals(self, txn: Txn, ns: str, workflow: str | None) -> Totals:
        """The workflow's totals as read (:meth:`plan` leaves them out of the
        compare-and-set: only increments change them, and a mean one task
        older decides the same)."""
        values = {}
        for measure, key in zip(TOTALS, self.totals_keys(ns, workflow), strict=True):
            values[measure] = txn.count(key, "n")
        return Totals(**values)

    def exceeded(
        self, txn: Txn, ns: str, task: Task, extra_tokens: int = 0
    ) -> list[outliers.Exceeded]:
        """The measures on which the running ``task`` (plus ``extra_tokens``) is an outlier."""
        if task.envelope is not None:
            return []
        used = {
            "tokens": task.used.tokens + max(0, extra_tokens),
            "model_calls": task.used.model_calls,
            "tool_calls": task.used.tool_calls,
        }
        return outliers.judge(self.totals(txn, ns, task.workflow), used, self.policy)

    def stop_reason(self, exceeded: list[outliers.Exceeded]) -> core.EndReason | None:
        """``outliers.action: stop`` ends a flagged task ``stopped``, ``outlier``."""
        return core.EndReason.OUTLIER if outliers.ends_task(exceeded, self.policy) else None

    def with_tokens(
        self, txn: Txn, ns: str, task: Task, tokens: int, turn_id: str | None = None
    ) -> tuple[Task, list[outliers.Exceeded]]:
        """``task`` with a model turn's ``tokens`` added (once per ``turn_id``),
        and the measures on which that makes it an outlier (ended ``stopped``,
        ``outlier`` under ``outliers.action: stop``)."""
        new = core.record_tokens(task, tokens, txn.now, turn_id)
        exceeded = self.exceeded(txn, ns, new)
        reason = self.stop_reason(exceeded)
        if reason is not None:
            new = core.end(new, reason, txn.now)
        return new, exceeded

    def plan(
        self,
        txn: Txn,
        ns: str,
        before: Task | None,
        task: Task,
        now: float,
        ttl_s: float,
        execution_id: str | None = None,
        execution_mode: ExecutionMode = "production",
        exceeded: list[outliers.Exceeded] | None = None,
    ) -> None:
        """Add to the transaction: the execution remembered, the outlier mark
        (once), the running index, and the totals when ``task`` has just ended."""
        watch_key = keys.task_watch(ns, task.task_id)
        txn.tolerate([key for key in self.totals_keys(ns, task.workflow) if txn.has_read(key)])
        # Read the watch document only when something may change in it (or it was
        # declared up front): a result costs no extra round trip. The steps that change
        # the task's time to live (it ends, it is resumed) read it once each and write it
        # again, so that it is kept exactly as long as the task.
        ended_now = task.envelope is not None and (before is None or before.envelope is None)
        resumed_now = before is not None and before.envelope is not None and task.envelope is None
        relive = ended_now or resumed_now
        needed = execution_id is not None or bool(exceeded) or relive or txn.has_read(watch_key)
        doc = self.doc(txn, ns, task.task_id) if needed else {}
        changed = False
        remembered = n8n_executions.remember(
            doc.get("executions", []), execution_id, execution_mode, now, workflow=task.workflow
        )
        if remembered is not None:
            doc["executions"] = list(remembered)
            changed = True
        if exceeded and not doc.get("outlier"):
            mark = {
                "at": now,
                "action": str(self.policy.action),
                "factor": self.policy.factor,
                "exceeded": [e.to_doc() for e in exceeded],
            }
            doc["outlier"] = mark
            changed = True
            txn.on_commit(lambda: self._flagged(task, mark))
        if changed or (relive and doc):
            txn.put(watch_key, doc, ttl_s)
        if task.envelope is None:
            if before is None or before.envelope is not None:
                txn.index(keys.running_tasks(ns), task.task_id, task.created_at)
        elif ended_now:
            txn.index(keys.running_tasks(ns), task.task_id, None)
            used = task.envelope.used
            for measure, delta in outliers.contribution(used).items():
                txn.increment(
                    keys.task_totals(ns, task.workflow, measure),
                    Increment("n", delta, self.retention_s),
                )
        txn.trim(keys.running_tasks(ns), now - self.horizon_s)

    def _flagged(self, task: Task, mark: Mapping[str, Any]) -> None:
        """The decision-log line and the counter of a task flagged as an outlier."""
        measures = [e["measure"] for e in mark["exceeded"]]
        for measure in measures:
            self.metrics.task_outliers.labels(measure, mark["action"]).inc()
        if log.isEnabledFor(logging.INFO):
            line = {
                "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "event": "decision",
                "route": "tasks.outlier",
                "decision": "flagged",
                "reason": "outlier",
                "task_id": task.task_id,
                "workflow": task.workflow,
                "action": mark["action"],
                "exceeded": mark["exceeded"],
            }
            log.info(json.dumps(line, separators=(",", ":"), default=str))

"""What the operator page and the metrics gauges list (DESIGN "Observability").

Read-only listings over the store's bounded indexes, filtered to what a
principal may see: live chains with their stops, recent tasks with their
use against their limits and any runaway mark, tasks running long, and
the counts of open and unknown operations. Views render these; they never
read the store themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sidecar.auth import Principal
from sidecar.core.chains import Chain
from sidecar.core.stops import Stop
from sidecar.core.tasks import Task
from sidecar.service import keys
from sidecar.store import Store

#: Index members read per listing before the principal's scope filters them.
SCANNED = 500


@dataclass(frozen=True)
class ChainRow:
    """A live chain, its stop and its last activation."""

    chain: Chain
    stop: Stop | None
    last: dict[str, Any] | None


@dataclass(frozen=True)
class TaskRow:
    """A recent task: ``bars`` are (used, limit) for tool calls, model calls, tokens;
    ``outlier`` its runaway mark (DESIGN §6), if any."""

    task: Task
    bars: list[tuple[int, int]]
    outlier: dict[str, Any] | None


@dataclass(frozen=True)
class RunningRow:
    """A task running for ``running_s`` seconds, past ``outliers.running_s``."""

    task: Task
    running_s: int


class Overview:
    """Listings for ``/ui`` and ``/metrics``.

    :param longest_chain_s: how far back a chain may still be alive.
    :param task_horizon_s: how far back a task is listed (retention plus deadline).
    :param running_s: ``outliers.running_s``.
    :raises StoreUnavailable: from every method when the store cannot answer.
    """

    def __init__(
        self,
        store: Store,
        clock: Callable[[], float],
        *,
        longest_chain_s: float,
        task_horizon_s: float,
        running_s: float,
    ) -> None:
        self.store = store
        self.clock = clock
        self.longest_chain_s = longest_chain_s
        self.task_horizon_s = task_horizon_s
        self.running_s = running_s

    def ping(self) -> dict[str, Any]:
        """The store's readiness facts (:meth:`sidecar.store.Store.ping`)."""
        return self.store.ping()

    def chains(self, principal: Principal, ns: str, now: float, limit: int) -> list[ChainRow]:
        """Live chains the principal may see, newest first, at most ``limit``."""
        entries = self.store.index_page(
            keys.recent_chains(ns), min_score=now - self.longest_chain_s, limit=SCANNED
        )
        ids = [m for m, _ in reversed(entries)]
        docs = self.store.get_many(
            [keys.chain(ns, i) for i in ids] + [keys.chain_stop(ns, i) for i in ids]
        )
        out = []
        for chain_id in ids:
            chain = Chain.from_doc(docs[keys.chain(ns, chain_id)])
            if chain is None or not chain.alive(now) or not principal.allows(chain.workflow):
                continue
            stop_doc = docs[keys.chain_stop(ns, chain_id)]
            stop = Stop(**stop_doc) if stop_doc else None
            out.append(ChainRow(chain, stop, chain.recent[-1] if chain.recent else None))
            if len(out) == limit:
                break
        return out

    def tasks(self, principal: Principal, ns: str, now: float, limit: int) -> list[TaskRow]:
        """Recent tasks the principal may see, newest first, at most ``limit``."""
        entries = self.store.index_page(
            keys.recent_tasks(ns), min_score=now - self.task_horizon_s, limit=SCANNED
        )
        ids = [m for m, _ in reversed(entries)]
        docs = self.store.get_many([keys.task(ns, i) for i in ids])
        found: list[Task] = []
        for task_id in ids:
            task = Task.from_doc(docs[keys.task(ns, task_id)])
            if task is not None and principal.allows(task.workflow):
                found.append(task)
                if len(found) == limit:
                    break
        marks = self.store.get_many([keys.task_watch(ns, t.task_id) for t in found])
        out = []
        for task in found:
            u, lim = task.used, task.limits
            bars = [
                (u.tool_calls, lim.max_tool_calls),
                (u.model_calls, lim.max_model_calls),
                (u.tokens, lim.max_tokens),
            ]
            mark = (marks[keys.task_watch(ns, task.task_id)] or {}).get("outlier")
            out.append(TaskRow(task, bars, mark))
        return out

    def running_long(
        self, principal: Principal, ns: str, now: float, limit: int
    ) -> list[RunningRow]:
        """Running tasks older than ``running_s`` the principal may see, oldest first."""
        since = now - self.running_s
        entries = self.store.index_page(keys.running_tasks(ns), max_score=since, limit=SCANNED)
        docs = self.store.get_many([keys.task(ns, m) for m, _ in entries])
        out = []
        for member, _ in entries:
            task = Task.from_doc(docs[keys.task(ns, member)])
            if task is None or task.envelope is not None or not principal.allows(task.workflow):
                continue
            out.append(RunningRow(task, int(now - task.created_at)))
            if len(out) == limit:
                break
        return out

    def open_counts(self, principal: Principal, ns: str, now: float) -> dict[str, int]:
        """Open and unknown operations in the principal's scope (what the bound counts)."""
        scopes: list[str | None] = [None]
        if principal.workflows is not None:
            scopes = list(sorted(principal.workflows))
        counts = {"open": 0, "unknown": 0}
        for workflow in scopes:
            index = keys.open_operations(ns, workflow)
            counts["open"] += self.store.index_count(index)
            counts["unknown"] += self.store.index_count(index, max_score=now)
        return counts

    # -- gauges (every workflow, production) -------------------------------------------

    def unknown_operations(self) -> int:
        """Operations whose outcome is unknown (lease expired or reported unknown)."""
        return self.store.index_count(keys.open_operations("p"), max_score=self.clock())

    def open_operations(self) -> int:
        """Operations begun and not settled."""
        return self.store.index_count(keys.open_operations("p"))

    def running_long_count(self) -> int:
        """Tasks running longer than ``running_s``."""
        since = self.clock() - self.running_s
        return self.store.index_count(keys.running_tasks("p"), max_score=since)

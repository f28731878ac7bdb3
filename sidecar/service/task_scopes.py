"""What this process has seen of each task's scope: its workflow and chain,
which never change. Knowing them, a decision on the task names its stop and
watch keys up front (read in the one round trip with the task) instead of
reading them lazily, a round trip more."""

from __future__ import annotations

from sidecar.core.tasks import Task
from sidecar.service import keys
from sidecar.service.task_watch import TaskWatch

#: Tasks whose scope is kept; past it, everything is forgotten at once.
SCOPES_KEPT = 10_000


class TaskScopes:
    """``(ns, task_id) -> (workflow, chain_id)`` for the tasks this process
    decided on (at most :data:`SCOPES_KEPT`)."""

    def __init__(self, watch: TaskWatch) -> None:
        self.watch = watch
        self._scopes: dict[str, tuple[str | None, str | None]] = {}

    def remember(self, ns: str, task: Task) -> None:
        """Keep ``task``'s workflow and chain."""
        if len(self._scopes) >= SCOPES_KEPT:
            self._scopes.clear()
        self._scopes[f"{ns}:{task.task_id}"] = (task.workflow, task.chain_id)

    def workflow(self, ns: str, task_id: str) -> tuple[bool, str | None]:
        """``(known, workflow)``: whether the task was seen, and its workflow."""
        scope = self._scopes.get(f"{ns}:{task_id}")
        return (False, None) if scope is None else (True, scope[0])

    def stop_keys(self, ns: str, task_id: str) -> list[str]:
        """The stop keys of a task seen before (else none: read lazily)."""
        if (scope := self._scopes.get(f"{ns}:{task_id}")) is None:
            return []
        workflow, chain_id = scope
        out = [keys.workflow_stop(workflow)] if workflow else []
        return out + ([keys.chain_stop(ns, chain_id)] if chain_id else [])

    def watch_keys(self, ns: str, task_id: str) -> list[str]:
        """The watch and totals keys of a task seen before (else none: read lazily)."""
        scope = self._scopes.get(f"{ns}:{task_id}")
        return [] if scope is None else self.watch.keys(ns, task_id, scope[0])

    def all_keys(self, ns: str, task_id: str) -> list[str]:
        """:meth:`stop_keys` and :meth:`watch_keys` together."""
        return [*self.stop_keys(ns, task_id), *self.watch_keys(ns, task_id)]

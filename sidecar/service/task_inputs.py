"""What the task guard service is asked: a task to create, a tool call to admit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.core import tasks as core
from sidecar.core.tasks import CallKind


@dataclass(frozen=True)
class CreateInput:
    """``POST /v1/tasks``; ``initial_revision`` is the validated revision the task starts at."""

    task_key: str | None
    workflow: str | None
    chain_id: str | None
    policy: str | None
    limits: Mapping[str, Any]
    initial_revision: int = 0


@dataclass(frozen=True)
class CallInput:
    """A tool call to admit; ``call_id`` is the caller's own id (admission is
    idempotent on it), None for a generated one; ``flaw``: the model gate's screening;
    a write at the model gate (DESIGN §5.1) gives its ``lease_s``, ``reconcile``
    check and ``ledger_repeats``; ``tokens``: the model turn that proposed it, counted
    first in the same transaction (as :meth:`TaskService.record_tokens` would)."""

    tool: str
    kind: CallKind
    args: Any
    operation_id: str | None
    call_id: str | None = None
    flaw: core.CallFlaw | None = None
    lease_s: float | None = None
    reconcile: dict[str, Any] | None = None
    ledger_repeats: bool = False
    tokens: int = 0

"""What the model gate keeps while it serves one request: the decision log's
record of the turn, the answer, and the request being served."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import urllib3

from sidecar.auth import Principal
from sidecar.config import ModelGateConfig
from sidecar.core import cost
from sidecar.core.tasks import Task, TurnDecision
from sidecar.errors import MalformedRequest, NotFound
from sidecar.gate.lines import TaskLines
from sidecar.gate.wire.base import Api, Inbound, WireAdapter
from sidecar.outbound.upstream import Upstream
from sidecar.service.task_inputs import CreateInput
from sidecar.service.tasks import TaskService


@dataclass
class TurnRecord:
    """How a turn was decided, for the decision log (filled in as a stream ends).

    :ivar api: the adapter's name (``chat``, ``responses``).
    :ivar usage: ``reported`` (the upstream said), ``estimated`` (it did not:
        a cut stream), or ``none`` (the upstream was not called).
    :ivar tool_calls: ``(tool, decision, reason, operation_id)`` per proposed call
        (``operation_id`` only for a write at the gate).
    :ivar answered: the exchanges the gate answered itself (a write committed
        before or being written, DESIGN §5.1): ``{tool, call_id, decision}``.
    :ivar turns: the upstream calls the request made (more than one when the
        gate answered a write itself and asked again).
    """

    decision: TurnDecision
    reason: str | None
    task_id: str | None
    api: str
    stream: bool
    execution: str | None = None
    tokens: int = 0
    usage: str = "none"
    tool_calls: list[tuple[str, str, str | None, str | None]] = field(default_factory=list)
    upstream_status: int | None = None
    cost: float | None = None
    cost_overshoot: float | None = None
    answered: list[dict[str, str]] = field(default_factory=list)
    turns: int = 0

    def upstream_failed(self, reason: str) -> None:
        """Record that the upstream failed, and how."""
        self.decision, self.reason = TurnDecision.UPSTREAM_ERROR, reason


@dataclass
class GateAnswer:
    """What the gate answers: a JSON body, or a stream of bytes in the API's framing.

    :ivar raw: the upstream's answer as it came (JSON bytes, decompressed),
        when the gate relays it unchanged: sent as they are, not written again
        from ``body``.
    """

    record: TurnRecord
    body: Any = None
    events: Iterator[bytes] | None = None
    raw: bytes | None = None


@dataclass
class Turn:
    """One upstream call of the request being served.

    :ivar body: what is asked of the upstream (with the gate's own exchanges).
    :ivar received: the request as n8n sent it (the calls n8n sees are numbered on it).
    """

    adapter: WireAdapter
    principal: Principal
    body: dict[str, Any]
    model: str
    stream: bool
    record: TurnRecord
    inbound: Inbound | None = None
    received: dict[str, Any] = field(default_factory=dict)
    ns: str | None = None
    task_id: str | None = None
    price: cost.Price | None = None
    reserved: float = 0.0
    counted: bool = False
    #: tokens counted, left to the first call's admission to store (0: none)
    tokens_due: int = 0
    #: the id its settle is applied under (once, however often it is retried)
    settle_id: str = field(default_factory=lambda: "g" + secrets.token_hex(8))


class KnownTasks:
    """What this worker learned of tasks that never changes once a task exists,
    so a turn need not read it again: the namespace holding a task id (ids are
    random: one namespace holds it). Learned only from a read of the store; at
    most :attr:`MAX` tasks (then forgotten at once and learned again). A task
    that expired meanwhile is still refused: every decision on it reads it in
    its transaction. (A task's limits are not kept: a resume may raise them,
    a money budget included, on any worker.)"""

    MAX = 10_000

    def __init__(self) -> None:
        self._ns: dict[str, str] = {}
        self._lock = threading.Lock()

    def namespace(self, task_id: str) -> str | None:
        """The namespace learned for ``task_id`` (None: not learned)."""
        return self._ns.get(task_id)

    def learn(self, ns: str, task_id: str) -> None:
        """Remember the namespace of ``task_id``."""
        with self._lock:
            if len(self._ns) >= self.MAX:
                self._ns.clear()
            self._ns[task_id] = ns


def make_upstream(
    config: ModelGateConfig, pool: urllib3.PoolManager, environ: Mapping[str, str], api: Api
) -> Upstream:
    """The upstream of ``api`` (``model_gate.upstreams.<api>``); one with no URL when
    the API has none (it raises :class:`~sidecar.errors.GateNotConfigured` when used)."""
    entry = config.upstream(api.name)
    key = None
    if entry is not None and entry.api_key_env:
        key = environ.get(entry.api_key_env) or None
    setting = f"model_gate.upstreams.{api.name}.url"
    if api.name == "openai":
        setting = f"model_gate.upstream_url (or {setting})"
    return Upstream(
        pool,
        entry.url if entry else None,
        key,
        config.timeout_s,
        config.max_answer_bytes,
        api=api,
        setting=setting,
    )


def find_task(
    tasks: TaskService,
    allow_untracked: bool,
    turn: Turn,
    lines: TaskLines,
    known: KnownTasks,
) -> Task | None:
    """The task the lines name (created by key when new), or None when untracked.

    :param known: what this worker learned of tasks (the namespace of an id
        it saw is not read again).

    :raises MalformedRequest: no task named and untracked requests are not allowed.
    :raises NotFound: the ``loopstop-task`` line names no task.
    """
    if lines.task_id is not None:
        ns = known.namespace(lines.task_id)
        if ns is None:
            ns = tasks.namespace_of(lines.task_id)
            if ns is None:
                raise NotFound(f"no task {lines.task_id!r}")
            known.learn(ns, lines.task_id)
        turn.ns, turn.task_id = ns, lines.task_id
        return None  # read only when needed (tool outputs to record)
    if lines.task_key is not None:
        ns = "p"
        task = _by_key(tasks, turn.principal, ns, lines)
        known.learn(ns, task.task_id)
        turn.ns, turn.task_id = ns, task.task_id
        return task
    if not allow_untracked:
        raise MalformedRequest(
            "no 'loopstop-task: <task_id>' or 'loopstop-task-key: <key>' line in "
            f"{turn.adapter.system_where}: add one to the AI Agent's System Message "
            "(or set model_gate.allow_untracked)",
            errors=[{"loc": ["body", "system", "loopstop-task"], "msg": "missing"}],
        )
    return None


def _by_key(tasks: TaskService, principal: Principal, ns: str, lines: TaskLines) -> Task:
    """Continue the task made under the key, or create it as ``POST /v1/tasks`` does.

    A task found by key is continued in its current run: every model turn
    of one agent run names the same key, and starting a new run on each
    would forget its identical calls.
    """
    assert lines.task_key is not None
    found = tasks.by_key(principal, ns, lines.workflow, lines.task_key)
    if found is not None:
        return found
    task, _ = tasks.create(
        principal,
        ns,
        CreateInput(
            task_key=lines.task_key,
            workflow=lines.workflow,
            chain_id=None,
            policy=lines.policy,
            limits={},
        ),
    )
    return task

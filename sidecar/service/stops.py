"""Stops that reach n8n (DESIGN §6): ask n8n to stop executions, confirm, record.

A loopstop stop (workflow, chain, task) is committed first; only then does
this service ask n8n, outside every store transaction: it reads each
execution's status, asks n8n to stop the ones still going, polls until n8n
reports each finished or ``confirm_s`` passes, and records what it saw in
a document of its own (``<ns>:cancel:<kind>:<id>``), which the stop's
answer, its ``GET`` and ``/ui`` show. n8n unreachable or refusing the key
changes nothing in loopstop: the stop holds, and the record says
cancellation failed and why.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import requests

from sidecar.auth import Principal
from sidecar.config import N8nConfig
from sidecar.core import executions as core
from sidecar.core.executions import (
    CancellationState,
    Confirmation,
    ExecutionMode,
    ExecutionResult,
)
from sidecar.core.stops import Stop
from sidecar.core.tasks import Task
from sidecar.metrics import Metrics
from sidecar.outbound.n8n_api import Execution, N8nClient, N8nError
from sidecar.service import keys, records
from sidecar.service.chains import ChainInfo, ChainService
from sidecar.service.tasks import TaskService
from sidecar.store import Store

#: Statuses a workflow stop lists (n8n parks an execution in a long Wait as ``waiting``).
LISTED_STATUSES = ("running", "waiting")
#: Seconds between two polls of the executions still going (doubling up to the cap).
POLL_FIRST_S = 0.1
POLL_MAX_S = 1.0
#: ``/readyz`` asks n8n at most this often per process, each time within this bound,
#: so that a probe stays fast while n8n hangs.
READY_CACHE_S = 10.0
READY_TIMEOUT_S = 2.0
#: How long the one ``/readyz`` that starts a new ask waits for it before answering
#: the last known state (the others never wait).
READY_WAIT_S = 0.25
#: How long /ui lists a stop that left executions unconfirmed (its record may live less).
UNCONFIRMED_KEPT_S = 7 * 86400.0
#: Index entries read to find the newest of them (they leave it once confirmed).
UNCONFIRMED_READ = 500


@dataclass(frozen=True)
class Cancellation:
    """What asking n8n achieved for one loopstop stop.

    :ivar state: see :class:`~sidecar.core.executions.CancellationState`.
    :ivar error: why n8n could not be asked (``unreachable: ...``,
        ``key_refused: ...``), None when it could.
    """

    state: CancellationState
    at: float
    execution_mode: ExecutionMode
    executions: tuple[ExecutionResult, ...] = ()
    error: str | None = None
    elapsed_s: float = 0.0

    def to_doc(self) -> dict[str, Any]:
        return {
            "state": str(self.state),
            "at": self.at,
            "execution_mode": self.execution_mode,
            "error": self.error,
            "elapsed_s": self.elapsed_s,
            "executions": [r.to_doc() for r in self.executions],
        }

    @staticmethod
    def from_doc(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """A stored record as the API shows it (the document itself)."""
        return None if doc is None else dict(doc)


@dataclass
class _Tracked:
    execution_id: str
    before: str | None
    after: str | None = None
    found: bool = True
    error: str | None = None
    done: bool = field(default=False)
    target: core.Target | None = None  # a remembered id: n8n's record must match it
    refused: str | None = None


def _note(seen: dict[str, core.Reported], ex: Execution) -> None:
    """Keep what n8n just said of ``ex`` (a parent read earlier stays known)."""
    known = seen.get(ex.execution_id)
    report = core.Reported(ex.execution_id, ex.workflow_id, ex.mode)
    if ex.data_read:
        report = replace(
            report, parent_read=True, parent_id=ex.parent_id, data_withheld=ex.data_withheld
        )
    elif known is not None and known.parent_read:
        report = replace(
            report,
            parent_read=True,
            parent_id=known.parent_id,
            data_withheld=known.data_withheld,
        )
    seen[ex.execution_id] = report


class StopService:
    """Operator stops that reach n8n: commit the loopstop stop, then cancel the
    n8n executions it covers and record what was confirmed.

    :param chains: commits workflow and chain stops.
    :param tasks: commits task stops and knows a task's executions.
    :param config: the ``n8n`` section (None: stops stay loopstop's own).
    :param workflow_ttl_s: how long a workflow stop's cancellation record is kept.
    :param clock: epoch seconds, for the record's ``at``.
    :param metrics: counts the cancellations and the executions they asked about.
    :param sleep: waits between polls (tests keep the real one: n8n is real).
    """

    def __init__(
        self,
        store: Store,
        chains: ChainService,
        tasks: TaskService,
        config: N8nConfig | None,
        environ: Mapping[str, str],
        session: requests.Session,
        clock: Callable[[], float],
        metrics: Metrics,
        *,
        workflow_ttl_s: float,
        task_ttl_s: float,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.chains = chains
        self.tasks = tasks
        self.workflow_ttl_s = workflow_ttl_s
        self.task_ttl_s = task_ttl_s
        self.config = config
        self.clock = clock
        self.sleep = sleep
        self.monotonic = monotonic
        self.client: N8nClient | None = None
        self._probe: N8nClient | None = None
        self._ready: tuple[float, dict[str, Any]] | None = None
        self._ready_lock = threading.Lock()
        self._asking: threading.Thread | None = None
        if config is not None:
            key = environ.get(config.api_key_env, "")
            self.client = N8nClient(config.api_url, key, session, config.timeout_s, monotonic)
            probe_s = min(config.timeout_s, READY_TIMEOUT_S)
            self._probe = N8nClient(config.api_url, key, session, probe_s, monotonic)

    # -- readiness -----------------------------------------------------------------

    def ready(self) -> dict[str, Any]:
        """Whether n8n's API answers, for ``/readyz`` (a warning, never "not ready").

        Never blocks a probe on n8n: the answer is cached for
        :data:`READY_CACHE_S` seconds; past that, one thread at a time asks n8n
        again (in the background, within :data:`READY_TIMEOUT_S`) and the
        probe that started it waits at most :data:`READY_WAIT_S`. Every other
        probe, and that one when n8n is slower, answers the last known state
        marked ``stale: true`` (``reachable: null`` before the first answer).
        """
        if self._probe is None:
            return {"configured": False}
        with self._ready_lock:
            known = self._ready
            if known is not None and self.monotonic() - known[0] < READY_CACHE_S:
                return known[1]
            asking = self._asking
            started = asking is None
            if asking is None:
                asking = self._asking = threading.Thread(
                    target=self._ask_ready, name="loopstop-n8n-ready", daemon=True
                )
                asking.start()
        if started:
            asking.join(READY_WAIT_S)
        with self._ready_lock:
            if self._ready is not None and self._ready is not known:
                return self._ready[1]  # asked just now
            last = known[1] if known is not None else {"configured": True, "reachable": None}
        return {**last, "stale": True}

    def _ask_ready(self) -> None:
        """Ask n8n once (the background part of :meth:`ready`)."""
        assert self._probe is not None
        facts: dict[str, Any] = {"configured": True, "reachable": True}
        try:
            self._probe.ping()
        except N8nError as exc:
            facts = {"configured": True, "reachable": False, "warning": str(exc)}
        except Exception as exc:  # never leave readiness stuck "asking"
            facts = {"configured": True, "reachable": False, "warning": type(exc).__name__}
        with self._ready_lock:
            self._ready = (self.monotonic(), facts)
            self._asking = None

    # -- stops ---------------------------------------------------------------------

    def for_workflow(self, mode: ExecutionMode, workflow: str) -> Cancellation:
        """Stop the workflow's ``running`` and ``waiting`` executions of ``mode``."""
        now = self.clock()
        if self.client is None:
            return Cancellation(CancellationState.NOT_CONFIGURED, now, mode)
        started = self.monotonic()
        found: dict[str, Execution] = {}
        try:  # the listing is inside the stop's one deadline too
            for status in LISTED_STATUSES:
                for ex in self.client.list_executions(workflow, status, self._until(started)):
                    if ex.workflow_id == workflow and core.mode_of_n8n(ex.mode) == mode:
                        found.setdefault(ex.execution_id, ex)
        except N8nError as exc:
            elapsed = round(self.monotonic() - started, 3)
            return Cancellation(
                CancellationState.FAILED, now, mode, error=str(exc), elapsed_s=elapsed
            )
        tracked = [_Tracked(e.execution_id, e.status) for e in found.values()]
        return self._stop_all(mode, now, started, tracked, known=True)

    def for_executions(self, mode: ExecutionMode, targets: Sequence[core.Target]) -> Cancellation:
        """Stop the given executions (those remembered on a chain or a task), each
        only when n8n reports it of its target's workflow and of ``mode``, or a
        sub-execution such an execution started
        (:func:`~sidecar.core.executions.reach`); the others are ``refused``."""
        now = self.clock()
        unique = list({t.execution_id: t for t in targets}.values())
        if self.client is None:
            results = tuple(
                core.judge(t.execution_id, None, None, refused=core.refusal_before_asking(t))
                for t in unique
            )
            return Cancellation(CancellationState.NOT_CONFIGURED, now, mode, results)
        started = self.monotonic()
        tracked = [_Tracked(t.execution_id, None, target=t) for t in unique]
        return self._stop_all(mode, now, started, tracked, known=False)

    def _until(self, started: float) -> float:
        """When a stop that started at ``started`` must be done asking n8n:
        ``confirm_s`` plus one request's ``timeout_s`` (monotonic seconds)."""
        assert self.config is not None
        return started + self.config.confirm_s + self.config.timeout_s

    def _stop_all(
        self,
        mode: ExecutionMode,
        now: float,
        started: float,
        tracked: list[_Tracked],
        known: bool,
    ) -> Cancellation:
        assert self.client is not None and self.config is not None
        client = self.client
        failure: str | None = None
        seen: dict[str, core.Reported] = {}  # what n8n said of each execution, this stop
        # Asking is bounded too (a slow n8n times many executions): past confirm_s plus
        # one request's timeout, the rest are left unconfirmed, never claimed stopped;
        # every request ends by then whatever n8n does (a trickled answer included).
        ask_until = self._until(started)
        try:
            for t in tracked:
                if self.monotonic() > ask_until:
                    t.error, t.done = "not asked: n8n.confirm_s passed", True
                    continue
                try:
                    self._ask(client, mode, t, known, ask_until, seen)
                except N8nError as exc:
                    if not self._out_of_time(exc, ask_until):
                        raise
                    t.error, t.done = "no answer before n8n.confirm_s passed", True
            self._confirm(client, [t for t in tracked if not t.done], started, ask_until)
        except N8nError as exc:
            failure = str(exc)
            for t in tracked:
                if not t.done:
                    t.error = failure
        results = tuple(
            core.judge(t.execution_id, t.before, t.after, t.found, t.error, t.refused)
            for t in tracked
        )
        return Cancellation(
            core.summarize(results, failure),
            now,
            mode,
            results,
            failure,
            round(self.monotonic() - started, 3),
        )

    def _out_of_time(self, exc: N8nError, until: float) -> bool:
        """Whether ``exc`` is the stop's own deadline cutting a request (then the
        executions left are unconfirmed, not a failure of n8n)."""
        return exc.reason == "timeout" and self.monotonic() >= until - 0.05

    def _ask(
        self,
        client: N8nClient,
        mode: ExecutionMode,
        t: _Tracked,
        known: bool,
        until: float,
        seen: dict[str, core.Reported],
    ) -> None:
        """Read one execution (when only its id is known) and whatever n8n must
        tell of its parents, then ask n8n to stop it unless it is refused or
        already over; ``t`` records what n8n said."""
        if not known:
            assert t.target is not None
            t.refused = core.refusal_before_asking(t.target)
            if t.refused is not None:
                t.done = True
                return
            ex = client.get(t.execution_id, until)
            if ex is None:
                t.found, t.done = False, True
                return
            _note(seen, ex)
            t.refused = self._lineage(client, mode, t.target, until, seen)
            if t.refused is not None:  # another workflow's: never stopped
                t.done = True
                return
            t.before = ex.status
        if t.before in core.FINISHED:
            t.after, t.done = t.before, True
            return
        code, answered = client.stop(t.execution_id, until)
        if code == 404:
            t.found, t.done = False, True
        elif answered in core.FINISHED:
            t.after, t.done = answered, True

    def _lineage(
        self,
        client: N8nClient,
        mode: ExecutionMode,
        target: core.Target,
        until: float,
        seen: dict[str, core.Reported],
    ) -> str | None:
        """Why ``target`` must not be stopped (None: it may), reading from n8n
        what :func:`~sidecar.core.executions.reach` asks for (its parents, each
        by ``until``). An answer with data that cannot be read (too large, not
        JSON) refuses that execution only; the stop goes on."""
        while True:
            step = core.reach(target, mode, seen)
            if step.ask is None:
                return step.refused
            try:
                ex = client.get(step.ask, until, with_data=step.with_parent)
            except N8nError as exc:
                if exc.reason != "bad_response" or not step.with_parent:
                    raise
                known = seen[step.ask]
                seen[step.ask] = replace(known, parent_read=True, data_withheld=True)
                continue
            if ex is None:
                seen[step.ask] = core.Reported(step.ask, None, None, found=False)
            else:
                _note(seen, ex)

    def _confirm(
        self, client: N8nClient, pending: list[_Tracked], started: float, until: float
    ) -> None:
        """Poll until each execution reports a finished status or ``confirm_s``
        passes (each read over by ``until``)."""
        assert self.config is not None
        deadline = started + self.config.confirm_s
        wait = POLL_FIRST_S
        while pending:
            for t in list(pending):
                try:
                    ex = client.get(t.execution_id, until)
                except N8nError as exc:
                    if self._out_of_time(exc, until):
                        return  # the ones left stay unconfirmed
                    raise
                if ex is None:
                    t.found, t.done = False, True
                else:
                    t.after = ex.status
                    t.done = ex.status in core.FINISHED
                if t.done:
                    pending.remove(t)
            if not pending or self.monotonic() + wait > deadline:
                return
            self.sleep(wait)
            wait = min(POLL_MAX_S, wait * 2)

    # -- operator stops: commit first, then reach n8n --------------------------------

    def stop_workflow(
        self, principal: Principal, mode: ExecutionMode, workflow: str, reason: str
    ) -> tuple[Stop | None, Cancellation]:
        """Stop a workflow (:meth:`ChainService.stop_workflow`), then its running
        and waiting n8n executions of ``mode``, confirmed.

        :raises Forbidden: not an admin token, or outside its scope (n8n is not asked).
        """
        ns = keys.namespace(mode)
        stop = self.chains.stop_workflow(principal, ns, workflow, reason, stopped=True)
        return stop, self.cancel_workflow(ns, mode, workflow, self.workflow_ttl_s)

    def stop_chain(
        self, principal: Principal, mode: ExecutionMode, chain_id: str, reason: str
    ) -> tuple[ChainInfo, Cancellation]:
        """Stop a chain (:meth:`ChainService.stop_chain`), then the n8n executions
        of ``mode`` that acted for it; the record lives as long as the chain.

        :raises Forbidden, NotFound: as :meth:`ChainService.stop_chain` (n8n is not asked).
        """
        ns = keys.namespace(mode)
        info = self.chains.stop_chain(principal, ns, chain_id, reason, stopped=True)
        targets = core.targets(info.chain.executions, mode, info.chain.workflow, principal.allows)
        ttl_s = info.chain.expires_at - self.clock()
        return info, self.cancel_executions(ns, "chain", chain_id, mode, targets, ttl_s)

    def stop_task(self, principal: Principal, ns: str, task_id: str) -> tuple[Task, Cancellation]:
        """Stop a task (:meth:`TaskService.stop`), then the n8n executions that
        acted for it, in the task's own mode.

        :raises NotFound, Forbidden: as :meth:`TaskService.stop` (n8n is not asked).
        """
        task = self.tasks.stop(principal, ns, task_id)
        mode: ExecutionMode = "test" if ns == keys.namespace("test") else "production"
        # A task acts for its own workflow only, whatever an entry says.
        remembered = self.tasks.watched(ns, task.task_id).get("executions", [])
        targets = [
            replace(t, workflow=task.workflow, in_scope=principal.allows(task.workflow))
            for t in core.targets(remembered, mode, task.workflow, principal.allows)
        ]
        return task, self.cancel_executions(
            ns, "task", task.task_id, mode, targets, self.task_ttl_s
        )

    # -- after a stop committed -----------------------------------------------------

    def cancel_workflow(
        self, ns: str, mode: ExecutionMode, workflow: str, ttl_s: float
    ) -> Cancellation:
        """After a workflow stop committed: stop its executions of ``mode``
        (:meth:`for_workflow`) and record what was confirmed for ``ttl_s`` seconds."""
        result = self.for_workflow(mode, workflow)
        self.record(ns, "workflow", workflow, result, ttl_s)
        return result

    def cancel_executions(
        self,
        ns: str,
        kind: str,
        ident: str,
        mode: ExecutionMode,
        targets: Sequence[core.Target],
        ttl_s: float,
    ) -> Cancellation:
        """After a ``chain`` or ``task`` stop committed: stop the executions that
        acted for it (:meth:`for_executions`) and record what was confirmed."""
        result = self.for_executions(mode, targets)
        self.record(ns, kind, ident, result, ttl_s)
        return result

    # -- records -------------------------------------------------------------------

    def record(self, ns: str, kind: str, ident: str, result: Cancellation, ttl_s: float) -> None:
        """Keep what the last cancellation of a stop confirmed (its own transaction)."""
        key = keys.cancellation(ns, kind, ident)
        self.metrics.n8n_cancellations.labels(kind, str(result.state)).inc()
        for r in result.executions:
            self.metrics.n8n_executions.labels(str(r.result)).inc()

        unconfirmed = any(r.result is Confirmation.UNCONFIRMED for r in result.executions)

        def keep(txn: records.Txn) -> None:
            txn.put(key, result.to_doc(), max(1.0, ttl_s))
            index = keys.unconfirmed_cancellations(ns)
            txn.index(index, f"{kind}:{ident}", result.at if unconfirmed else None)
            txn.trim(index, txn.now - UNCONFIRMED_KEPT_S)

        records.run(self.store, [key], keep, self.clock())

    def recorded(self, ns: str, kind: str, ident: str) -> dict[str, Any] | None:
        """The last recorded cancellation of a stop, if any."""
        return Cancellation.from_doc(self.store.get(keys.cancellation(ns, kind, ident)))

    def unconfirmed(self, ns: str, limit: int) -> list[dict[str, Any]]:
        """The latest stops whose last cancellation left executions ``unconfirmed``
        (n8n still reported them going after ``confirm_s``: a worker may be gone),
        newest first: ``{kind, id, at, executions}``, the executions being those
        unconfirmed, each with n8n's last status."""
        members = self.store.index_page(keys.unconfirmed_cancellations(ns), limit=UNCONFIRMED_READ)
        wanted = [m.split(":", 1) for m, _ in reversed(members)][:limit]
        docs = self.store.get_many([keys.cancellation(ns, k, i) for k, i in wanted])
        found = []
        for kind, ident in wanted:
            doc = docs.get(keys.cancellation(ns, kind, ident)) or {}
            left = [
                e
                for e in doc.get("executions", [])
                if e.get("result") == str(Confirmation.UNCONFIRMED)
            ]
            if left:
                found.append({"kind": kind, "id": ident, "at": doc.get("at"), "executions": left})
        return found

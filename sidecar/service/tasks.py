"""The task guard service: keys, transactions and plans around :mod:`sidecar.core.tasks`."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from sidecar.auth import Principal
from sidecar.canonical import Fingerprinter
from sidecar.config import Settings
from sidecar.core import outliers
from sidecar.core import tasks as core
from sidecar.core.check_verdicts import CheckResult
from sidecar.core.operations import BeginRequest, OperationPolicy
from sidecar.core.tasks import (
    CallKind,
    CompleteOutcome,
    Evidence,
    ModelOutcome,
    ResultOutcome,
    Task,
    TaskLimits,
    ToolCall,
    ToolDecision,
    ToolOutcome,
    ToolResult,
)
from sidecar.errors import NotFound, ValidationFailed
from sidecar.metrics import Metrics
from sidecar.service import keys, mappers, records
from sidecar.service.check_service import CheckService, check_input, verdict
from sidecar.service.mappers import Tasks, covering_stop
from sidecar.service.operations import OperationService
from sidecar.service.records import Txn
from sidecar.service.task_inputs import CallInput, CreateInput
from sidecar.service.task_scopes import TaskScopes
from sidecar.service.task_watch import TaskWatch
from sidecar.store import Store

T = TypeVar("T")


class TaskService:
    """Runs task decisions as store transactions.

    :param operations: the ledger service (its plan keeps the open index in step).
    :param metrics: counts tasks ended and tasks flagged as outliers.
    """

    def __init__(
        self,
        store: Store,
        fingerprinter: Fingerprinter,
        settings: Settings,
        operations: OperationService,
        checks: CheckService,
        clock: Callable[[], float],
        metrics: Metrics,
    ) -> None:
        self.store = store
        self.fp = fingerprinter
        self.settings = settings
        self.operations = operations
        self.checks = checks
        # The ledger's whole policy: a task's write is bounded by
        # max_open_per_workflow like any begin (DESIGN §1).
        self.op_policy: OperationPolicy = settings.operations.to_core()
        self.clock = clock
        self._tool_max_calls = {
            name: t.max_calls for name, t in settings.tools.items() if t.max_calls is not None
        }
        # Executions that acted for a task, its outlier mark, the running mean (DESIGN §6).
        self.watch = TaskWatch(
            settings.outliers,
            settings.tasks.retention_s,
            settings.tasks.retention_s + settings.limits.deadline_s,
            metrics,
        )
        self.scopes = TaskScopes(self.watch)
        self.records = Tasks(
            fingerprinter,
            self.watch,
            settings.tasks.retention_s,
            settings.limits.deadline_s,
            metrics,
        )

    # -- helpers -----------------------------------------------------------------

    def resolve_limits(
        self, policy: str | None, override: Mapping[str, Any]
    ) -> tuple[TaskLimits, tuple[str, ...] | None]:
        """The task's limits (:func:`sidecar.core.tasks.resolve_limits`) and the
        tools its policy allows (None: any).

        :raises ValidationFailed: an unknown policy.
        """
        s = self.settings
        layer: Mapping[str, Any] | None = None
        allowed: tuple[str, ...] | None = None
        if policy is not None:
            if policy not in s.policies:
                raise ValidationFailed(
                    [{"loc": ["body", "policy"], "msg": f"no policy named {policy!r}"}]
                )
            named = s.policies[policy]
            allowed = None if named.tools is None else tuple(named.tools)
            layer = named.limits.model_dump(exclude_none=True)
        limits = core.resolve_limits(s.limits.to_core(), self._tool_max_calls, layer, override)
        return limits, allowed

    def _workflow_of(self, ns: str, task_id: str) -> str | None:
        """The task's workflow (it never changes): as this process saw it, else read."""
        known, workflow = self.scopes.workflow(ns, task_id)
        if known:
            return workflow
        found = self.records.decode(self.store.get(keys.task(ns, task_id)))
        return None if found is None else found.workflow

    def _stopped(self, txn: Txn, ns: str, task: Task) -> core.EndReason | None:
        return core.stopped_by(covering_stop(txn, ns, task.workflow, task.chain_id))

    def _save(
        self,
        txn: Txn,
        ns: str,
        before: Task,
        after: Task,
        execution_id: str | None,
        exceeded: list[Any],
    ) -> None:
        """Save a task a step changed on behalf of ``execution_id`` (remembered for a
        task stop), marking it an outlier on the ``exceeded`` measures."""
        saving = self.records.acting(execution_id, exceeded)
        txn.save(saving, ns, keys.task(ns, after.task_id), after, before)

    def _update(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        step: Callable[[Task, Txn], tuple[Task | None, T]],
        also: list[str] | None = None,
        *,
        recent_likely: bool = False,
    ) -> T:
        """One decision on one task (:func:`sidecar.service.records.update`)."""
        return records.update(
            self.store,
            self.records,
            ns,
            task_id,
            principal,
            step,
            self.clock(),
            also=also or (),
            recent_likely=recent_likely,
        )

    # -- routes ------------------------------------------------------------------

    def create(
        self, principal: Principal, ns: str, body: CreateInput, execution_id: str | None = None
    ) -> tuple[Task, bool]:
        """Create a task, or return the task already made under ``task_key``.

        :param execution_id: the n8n execution asking (remembered for a task stop).
        :returns: the task and whether it was created now.
        :raises Forbidden, ValidationFailed, StoreUnavailable:
        """
        principal.require(body.workflow)
        limits, allowed = self.resolve_limits(body.policy, body.limits)
        if not principal.admin:
            base, _ = self.resolve_limits(body.policy, {})
            core.require_tightened(base, limits, principal.admin)
        now = self.clock()
        task_id = "t" + secrets.token_hex(10)
        key_key = (
            self.records.pointer(ns, body.workflow, body.task_key)
            if body.task_key is not None
            else None
        )
        declared = [keys.task(ns, task_id)] + ([key_key] if key_key else [])
        declared += self.watch.keys(ns, task_id, body.workflow)
        if body.chain_id is not None:
            declared.append(keys.chain(ns, body.chain_id))

        acting = self.records.acting(execution_id)

        def step(txn: Txn) -> tuple[Task, bool]:
            if key_key is not None:
                pointer = txn.doc(key_key)
                if pointer is not None:
                    existing = txn.read(self.records, keys.task(ns, pointer["task_id"]))
                    if existing is not None:
                        again = core.reactivate(existing, txn.now)
                        txn.save(acting, ns, keys.task(ns, again.task_id), again, existing)
                        return again, False
            if body.chain_id is not None:
                mappers.require_chain_in_scope(txn, principal, ns, body.chain_id)
            task = core.new_task(
                task_id,
                body.task_key,
                body.workflow,
                body.chain_id,
                body.policy,
                limits,
                allowed,
                txn.now,
                body.initial_revision,
            )
            txn.save(acting, ns, keys.task(ns, task_id), task)
            return task, True

        task, created = records.run(self.store, declared, step, now)
        self.scopes.remember(ns, task)
        return task, created

    def get(self, principal: Principal, ns: str, task_id: str) -> Task:
        """:raises NotFound, Forbidden, StoreUnavailable:"""
        found = self.records.decode(self.store.get(keys.task(ns, task_id)))
        return self.records.authorize(principal, found, task_id)

    def model_call(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        tokens_used: int | None,
        reserve_cost: float | None = None,
        execution_id: str | None = None,
        unbudgeted: Mapping[str, Any] | None = None,
    ) -> tuple[Task, ModelOutcome]:
        """Reserve a model turn (the model gate calls this too).

        :param reserve_cost: the turn's worst-case cost, held until
            :meth:`settle_model_call`.
        :param execution_id: the n8n execution asking (remembered for a task stop).
        :param unbudgeted: the refusal of a turn whose cost no money budget bounds (an
            unpriced model): raised if :func:`core.money_bound_required` (ValidationFailed).
        """

        def step(task: Task, txn: Txn) -> tuple[Task | None, tuple[Task, ModelOutcome]]:
            if unbudgeted is not None and core.money_bound_required(task):
                raise ValidationFailed([unbudgeted])
            self.scopes.remember(ns, task)
            exceeded = self.watch.exceeded(txn, ns, task, tokens_used or 0)
            stopped = self._stopped(txn, ns, task) or self.watch.stop_reason(exceeded)
            new, out = core.admit_model_call(task, tokens_used, txn.now, stopped, reserve_cost)
            if out.admitted and outliers.wraps_up(exceeded, self.watch.policy):
                out = replace(out, wrap_up=True)
            self._save(txn, ns, task, new, execution_id, exceeded)
            return None, (new, out)

        # Likely the task as this process last wrote it: decided on that, checked.
        watch = self.scopes.watch_keys(ns, task_id)
        return self._update(principal, ns, task_id, step, watch, recent_likely=True)

    def watched(self, ns: str, task_id: str) -> dict[str, Any]:
        """The task's watch document: ``executions`` that acted for it, ``outlier`` mark."""
        return dict(self.store.get(keys.task_watch(ns, task_id)) or {})

    def in_namespace(
        self, mode: keys.ExecutionMode | None, task_id: str, call: Callable[[str], T]
    ) -> T:
        """Run ``call`` in the namespace the request's ``execution_mode`` names;
        a ``production`` request for a task that only the test namespace holds
        runs there.

        n8n runs a sub-workflow (an AI Agent's tool) in mode ``integrated``,
        which ``$execution.mode`` reports as ``production`` even when the parent
        is a test run, so a test task's tools arrive as production calls. Task
        ids are random, so the id names one task. Never the other way: a test
        run cannot reach a production task. The second try costs one read, only
        on a miss, and ``call`` raises NotFound before it changes or fetches
        anything.

        :raises NotFound: no such task in the namespace (nor, for production, in test).
        """
        ns = keys.namespace(mode)
        try:
            return call(ns)
        except NotFound:
            if ns != "p" or self.namespace_of(task_id) != "t":
                raise
            return call("t")

    def by_key(
        self, principal: Principal, ns: str, workflow: str | None, task_key: str
    ) -> Task | None:
        """The task made under ``task_key`` in ``workflow``, if it is still kept.

        :raises Forbidden: the task belongs to a workflow outside the scope.
        :raises StoreUnavailable:
        """
        found = self.store.get(self.records.pointer(ns, workflow, task_key))
        if found is None:
            return None
        try:
            return self.get(principal, ns, str(found["task_id"]))
        except NotFound:
            return None  # expired between the two reads

    def namespace_of(self, task_id: str) -> str | None:
        """The namespace holding ``task_id`` (task ids are random, so at most one)."""
        docs = self.store.get_many([keys.task("p", task_id), keys.task("t", task_id)])
        if docs[keys.task("p", task_id)] is not None:
            return "p"
        return "t" if docs[keys.task("t", task_id)] is not None else None

    def record_tokens(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        tokens: int,
        execution_id: str | None = None,
        turn_id: str | None = None,
    ) -> Task:
        """Add the tokens a model turn used (reported by the upstream after the turn).

        A task these tokens make an outlier is flagged (and, with
        ``outliers.action: stop``, ended ``stopped``, ``outlier``).

        :param turn_id: the turn's id: its tokens are added once, however often
            this is applied (:func:`core.record_tokens`).
        """

        def step(task: Task, txn: Txn) -> tuple[Task | None, Task]:
            new, exceeded = self.watch.with_tokens(txn, ns, task, tokens, turn_id)
            self._save(txn, ns, task, new, execution_id, exceeded)
            return None, new

        return self._update(
            principal, ns, task_id, step, self.scopes.all_keys(ns, task_id), recent_likely=True
        )

    def settle_model_call(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        reserved_cost: float,
        actual_cost: float,
        tokens: int,
        turn_id: str | None = None,
    ) -> Task:
        """Settle a model turn: release its reservation, add its real cost and
        tokens, once per ``turn_id`` (:func:`core.settle_model_call`)."""
        return self._update(
            principal,
            ns,
            task_id,
            lambda task, txn: _same(
                core.settle_model_call(task, reserved_cost, actual_cost, tokens, txn.now, turn_id)
            ),
            self.scopes.stop_keys(ns, task_id),
            recent_likely=True,
        )

    def tool_call(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        body: CallInput,
        execution_id: str | None = None,
    ) -> tuple[Task, ToolOutcome]:
        """Admit (or deny) a tool call before it executes.

        :param execution_id: the n8n execution asking (remembered for a task stop).

        :raises ValidationFailed: a write without ``operation_id``, or a kind
            that contradicts the tool's configuration.
        """
        configured = self.settings.tools.get(body.tool)
        if configured is not None and configured.kind != body.kind:
            raise ValidationFailed(
                [
                    {
                        "loc": ["body", "kind"],
                        "msg": f"tool {body.tool!r} is configured as {configured.kind}",
                    }
                ]
            )
        if body.kind is CallKind.WRITE and not body.operation_id and body.flaw is None:
            raise ValidationFailed(
                [{"loc": ["body", "operation_id"], "msg": "a write needs its operation_id"}]
            )
        args_prints = self.fp.fingerprints(body.args)
        call_id = body.call_id or "k" + secrets.token_hex(8)
        writes = body.kind is CallKind.WRITE and bool(body.operation_id)
        # A write is bounded by the open operations of the task's workflow, as a
        # begin is (counted before the transaction, like the ledger's).
        workflow = self._workflow_of(ns, task_id) if writes else None
        open_count = self.operations.open_count(ns, workflow) if writes else 0

        def step(task: Task, txn: Txn) -> tuple[Task | None, tuple[Task, ToolOutcome]]:
            self.scopes.remember(ns, task)
            before, counted = task, list[Any]()
            if body.tokens:  # the proposing turn's tokens first, as record_tokens
                task, counted = self.watch.with_tokens(txn, ns, task, body.tokens)
            op = None
            op_key = None
            begin = None
            if body.kind is CallKind.WRITE and body.operation_id:
                # The write lives in the task's workflow namespace (DESIGN §1).
                op_key, op = self.operations.find(txn, ns, body.operation_id, task.workflow)
                begin = BeginRequest(
                    operation_id=body.operation_id,
                    fingerprints=args_prints,
                    secret_id=self.fp.current.id,
                    workflow=task.workflow,
                    task_id=task.task_id,
                    chain_id=task.chain_id,
                    lease_s=body.lease_s or self.settings.operations.lease_s,
                    reconcile_check=body.reconcile,
                )
            call = ToolCall(
                call_id,
                body.tool,
                body.kind,
                args_prints[self.fp.current.id],
                begin,
                given_id=body.call_id is not None,
                ledger_repeats=body.ledger_repeats,
                flaw=body.flaw,
            )
            exceeded = self.watch.exceeded(txn, ns, task)
            stopped = self._stopped(txn, ns, task) or self.watch.stop_reason(exceeded)
            new, new_op, out = core.admit_tool_call(
                task, call, op, self.op_policy, txn.now, stopped, open_count=open_count
            )
            self._save(txn, ns, before, new, execution_id, counted or exceeded)
            if op_key is not None:
                txn.save(self.operations.records, ns, op_key, new_op, op)
            return None, (new, out)

        # Likely the task as this process last wrote it: decided on that, checked.
        task, out = self._update(
            principal,
            ns,
            task_id,
            step,
            self.scopes.all_keys(ns, task_id),
            recent_likely=True,
        )
        if writes and out.decision is ToolDecision.EXECUTE:
            self.operations.opened(ns, task.workflow)
        return task, out

    def tool_result(
        self, principal: Principal, ns: str, task_id: str, call_id: str, res: ToolResult
    ) -> tuple[Task, ResultOutcome, CheckResult | None]:
        """Record a call's result (and settle its write in the ledger).

        When the call's tool names a check, the sidecar runs it (its outside
        parts before the transaction) and its verdict replaces the caller's
        evidence.
        """
        check_name = self._tool_check(principal, ns, task_id, call_id)
        data = check_input(res.result, res.receipt)
        fetched = self.checks.prefetch(check_name, data) if check_name else {}

        def step(
            task: Task, txn: Txn
        ) -> tuple[Task | None, tuple[Task, ResultOutcome, CheckResult | None]]:
            call = task.call(call_id)
            op = None
            op_key = None
            if call is not None and call.operation_id and call.kind is CallKind.WRITE:
                op_key, op = self.operations.find(txn, ns, call.operation_id, task.workflow)
            checked: CheckResult | None = None
            given = res
            if check_name is not None and call is not None:
                checked = self.checks.run_in(
                    txn, principal, ns, task_id, check_name, data, fetched, scope=call.tool
                )
                given = replace(res, check=verdict(checked))
            new, new_op, out = core.record_result(task, call_id, given, op, txn.now)
            if op_key is not None:
                txn.save(self.operations.records, ns, op_key, new_op, op)
            return new, (new, out, checked)

        return self._update(principal, ns, task_id, step, recent_likely=True)

    def _tool_check(self, principal: Principal, ns: str, task_id: str, call_id: str) -> str | None:
        """The check configured for the tool of ``call_id`` (read before any I/O).

        Without any tool check configured there is nothing to look up: the
        result is decided in one transaction, with no extra read.
        """
        if not any(tool.check for tool in self.settings.tools.values()):
            return None
        task = self.get(principal, ns, task_id)
        call = task.call(call_id)
        if call is None or call.status is not core.CallStatus.PENDING:
            return None  # the core answers 404 / 409; nothing is asked outside
        tool = self.settings.tools.get(call.tool)
        if tool is not None and tool.check is not None:
            self.checks.require_open(principal, tool.check, task.workflow)
        return None if tool is None else tool.check

    def complete(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        evidence: Evidence | None,
        check: str | None,
        data: Any,
    ) -> tuple[Task, CompleteOutcome, CheckResult | None]:
        """Validate the task's exit: with a check (named, or the policy's
        ``exit_check``) the sidecar runs it on ``data``; else trusted evidence.

        :raises ValidationFailed: the named check does not exist.
        """
        exit_check = None
        if check is not None or any(p.exit_check for p in self.settings.policies.values()):
            # A check may apply: read the task first, so that the exit check of
            # its policy is known and nothing is asked outside for a task that
            # is not there or not the caller's (NotFound / Forbidden first).
            task = self.get(principal, ns, task_id)
            policy = self.settings.policies.get(task.policy or "")
            exit_check = policy.exit_check if policy is not None else None
        name = core.exit_check(exit_check, check)
        if name is not None and name not in self.checks:
            raise ValidationFailed([{"loc": ["body", "check"], "msg": f"no check {name!r}"}])
        if name is not None:
            self.checks.require_open(principal, name, task.workflow)
        fetched = self.checks.prefetch(name, data) if name else {}

        def step(
            task: Task, txn: Txn
        ) -> tuple[Task | None, tuple[Task, CompleteOutcome, CheckResult | None]]:
            checked = None
            if name is not None:
                checked = self.checks.run_in(txn, principal, ns, task_id, name, data, fetched)
            passed = None if checked is None else checked.passed
            ev = evidence
            if checked is not None and checked.revision is not None:
                ev = Evidence(revision=checked.revision)
            new, outcome = core.complete(task, ev, passed, txn.now)
            return new, (new, outcome, checked)

        return self._update(principal, ns, task_id, step)

    def stop(self, principal: Principal, ns: str, task_id: str) -> Task:
        """Stop a task (sticky ``stopped``, ``operator_stop``).

        :raises NotFound, Forbidden, StoreUnavailable:
        """
        return self._update(
            principal, ns, task_id, lambda task, txn: _same(core.stop(task, txn.now))
        )

    def resume(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        reason: str,
        extend: Mapping[str, Any] | None,
    ) -> Task:
        """:raises Forbidden: ``extend`` without an admin token, or a stopped
            task resumed without one (:func:`sidecar.core.tasks.require_resumable`).
        :raises StateConflict: see :func:`sidecar.core.tasks.resume`."""
        if extend:
            principal.require_admin()

        def step(task: Task, txn: Txn) -> tuple[Task | None, Task]:
            core.require_resumable(task, principal.admin)
            ops = {
                oid: self.operations.find(txn, ns, oid, task.workflow)[1] for oid in task.operations
            }
            unknown = core.unknown_operations(ops, txn.now)
            return _same(core.resume(task, reason, extend, principal.name, unknown, txn.now))

        return self._update(principal, ns, task_id, step)


def _same(task: Task) -> tuple[Task, Task]:
    """A step whose new task is also its answer."""
    return task, task

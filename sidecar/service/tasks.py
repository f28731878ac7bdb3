"""The task guard service: keys, transactions and plans around :mod:`sidecar.core.tasks`."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sidecar import metrics
from sidecar.auth import Principal
from sidecar.canonical import Fingerprinter
from sidecar.checks import CheckResult
from sidecar.config import Settings
from sidecar.core import tasks as core
from sidecar.core.operations import BeginRequest, Operation, OperationPolicy
from sidecar.core.tasks import (
    CallKind,
    CompleteDecision,
    CompleteOutcome,
    Evidence,
    ModelOutcome,
    ResultOutcome,
    Task,
    TaskLimits,
    ToolCall,
    ToolOutcome,
    ToolResult,
)
from sidecar.errors import Forbidden, NotFound, ValidationFailed
from sidecar.service import keys
from sidecar.service.checks import CheckService, check_input, verdict
from sidecar.service.operations import OperationService
from sidecar.service.task_watch import TaskWatch
from sidecar.store import IndexEntry, Plan, Snapshot, Store, Write


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
    idempotent on it), None for a generated one."""

    tool: str
    kind: CallKind
    args: Any
    operation_id: str | None
    call_id: str | None = None


class TaskService:
    """Runs task decisions as store transactions.

    :param operations: the ledger service (its plan keeps the open index in step).
    """

    def __init__(
        self,
        store: Store,
        fingerprinter: Fingerprinter,
        settings: Settings,
        operations: OperationService,
        checks: CheckService,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.fp = fingerprinter
        self.settings = settings
        self.operations = operations
        self.checks = checks
        self.op_policy = OperationPolicy(
            settings.operations.max_attempts, settings.operations.retention_s
        )
        self.clock = clock
        # A task's workflow and chain never change: remembering them lets a decision
        # name the stop keys up front (one read round trip instead of two).
        self._scopes: dict[str, tuple[str | None, str | None]] = {}
        self._tool_max_calls = {
            name: t.max_calls for name, t in settings.tools.items() if t.max_calls is not None
        }
        # Executions that acted for a task, its outlier mark, the running mean (DESIGN §6).
        self.watch = TaskWatch(
            settings.outliers,
            settings.tasks.retention_s,
            settings.tasks.retention_s + settings.limits.deadline_s,
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

    def _ttl(self, task: Task, now: float) -> float:
        retention = self.settings.tasks.retention_s
        if task.ended_at is not None:
            return max(1.0, task.ended_at + retention - now)
        return max(1.0, task.created_at + task.limits.deadline_s + retention - now)

    def _stop_keys(self, ns: str, task_id: str) -> list[str]:
        """The stop keys of a task seen before by this process (else none: read lazily)."""
        scope = self._scopes.get(f"{ns}:{task_id}")
        if scope is None:
            return []
        workflow, chain_id = scope
        out = [keys.workflow_stop(workflow)] if workflow else []
        return out + ([keys.chain_stop(ns, chain_id)] if chain_id else [])

    def _watch_keys(self, ns: str, task_id: str) -> list[str]:
        """The watch and totals keys of a task seen before by this process (else read lazily)."""
        scope = self._scopes.get(f"{ns}:{task_id}")
        return [] if scope is None else self.watch.keys(ns, task_id, scope[0])

    def _remember(self, ns: str, task: Task) -> None:
        if len(self._scopes) > 10_000:
            self._scopes.clear()
        self._scopes[f"{ns}:{task.task_id}"] = (task.workflow, task.chain_id)

    def _stopped(self, snap: Snapshot, ns: str, task: Task) -> core.EndReason | None:
        if task.workflow and snap.get(keys.workflow_stop(task.workflow)) is not None:
            return core.EndReason.WORKFLOW_STOPPED
        if task.chain_id and snap.get(keys.chain_stop(ns, task.chain_id)) is not None:
            return core.EndReason.CHAIN_STOPPED
        return None

    @staticmethod
    def _scoped(principal: Principal, doc: Mapping[str, Any] | None, task_id: str) -> Task:
        task = Task.from_doc(doc)
        if task is None:
            raise NotFound(f"no task {task_id!r}")
        principal.require(task.workflow, of_record=True)
        return task

    def _write_task(
        self,
        plan: Plan[Any],
        snap: Snapshot,
        ns: str,
        task: Task,
        now: float,
        before: Task | None = None,
        execution_id: str | None = None,
        exceeded: list[Any] | None = None,
    ) -> None:
        """Store the task; its ``task_key`` pointer too when created, ended or resumed
        (the moments its retention changes); its watch document, running index
        and workflow totals (:class:`TaskWatch`)."""
        ttl = self._ttl(task, now)
        plan.writes[keys.task(ns, task.task_id)] = Write(task.to_doc(), ttl)
        mode: keys.ExecutionMode = "test" if ns == "t" else "production"
        self.watch.plan(plan, snap, ns, before, task, now, ttl, execution_id, mode, exceeded)
        plan.index.append(IndexEntry(keys.recent_tasks(ns), task.task_id, now))
        plan.trims.append(
            (
                keys.recent_tasks(ns),
                now - self.settings.tasks.retention_s - self.settings.limits.deadline_s,
            )
        )
        if task.envelope is not None and (before is None or before.envelope is None):
            status, reason = str(task.envelope.status), str(task.envelope.reason)
            plan.on_commit.append(lambda: metrics.ENVELOPES.labels(status, reason).inc())
        moved = before is None or (before.envelope is None) != (task.envelope is None)
        if task.task_key is not None and moved:
            pointer = keys.task_key(ns, task.workflow, self.fp.key_hash("task", task.task_key))
            snap.get(pointer)
            plan.writes[pointer] = Write({"task_id": task.task_id}, ttl)

    def _write_op(
        self, plan: Plan[Any], ns: str, op: Operation | None, key: str | None = None
    ) -> None:
        if op is not None:
            sub = self.operations.plan(ns, op, None, key)
            plan.writes.update(sub.writes)
            plan.index += sub.index

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
            raised = core.loosened(base, limits)
            if raised:
                raise Forbidden(
                    f"raising {', '.join(raised)} above the configured or policy limits needs "
                    "an admin token (a request may only tighten them)"
                )
        now = self.clock()
        task_id = "t" + secrets.token_hex(10)
        key_key = (
            keys.task_key(ns, body.workflow, self.fp.key_hash("task", body.task_key))
            if body.task_key is not None
            else None
        )
        declared = [keys.task(ns, task_id)] + ([key_key] if key_key else [])
        declared += self.watch.keys(ns, task_id, body.workflow)

        def decide(snap: Snapshot) -> Plan[tuple[Task, bool]]:
            if key_key is not None:
                pointer = snap.get(key_key)
                if pointer is not None:
                    existing = Task.from_doc(snap.get(keys.task(ns, pointer["task_id"])))
                    if existing is not None:
                        again = core.reactivate(existing, now)
                        found: Plan[tuple[Task, bool]] = Plan((again, False))
                        if again != existing:
                            self._write_task(found, snap, ns, again, now, existing, execution_id)
                        return found
            task = core.new_task(
                task_id,
                body.task_key,
                body.workflow,
                body.chain_id,
                body.policy,
                limits,
                allowed,
                now,
                body.initial_revision,
            )
            plan: Plan[tuple[Task, bool]] = Plan((task, True))
            self._write_task(plan, snap, ns, task, now, None, execution_id)
            return plan

        task, created = self.store.transact(declared, decide)
        self._remember(ns, task)
        return task, created

    def get(self, principal: Principal, ns: str, task_id: str) -> Task:
        """:raises NotFound, Forbidden, StoreUnavailable:"""
        return self._scoped(principal, self.store.get(keys.task(ns, task_id)), task_id)

    def model_call(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        tokens_used: int | None,
        reserve_cost: float | None = None,
        execution_id: str | None = None,
    ) -> tuple[Task, ModelOutcome]:
        """Reserve a model turn (the model gate calls this too).

        :param reserve_cost: the turn's worst-case cost, held until
            :meth:`settle_model_call`.
        :param execution_id: the n8n execution asking (remembered for a task stop).
        """
        now = self.clock()
        key = keys.task(ns, task_id)

        def decide(snap: Snapshot) -> Plan[tuple[Task, ModelOutcome]]:
            task = self._scoped(principal, snap.get(key), task_id)
            self._remember(ns, task)
            exceeded = self.watch.exceeded(snap, ns, task, tokens_used or 0)
            stopped = self._stopped(snap, ns, task) or self._outlier_stop(exceeded)
            new, out = core.admit_model_call(task, tokens_used, now, stopped, reserve_cost)
            if exceeded and out.admitted and self.watch.policy.action == "wrap_up":
                out = replace(out, wrap_up=True)
            plan: Plan[tuple[Task, ModelOutcome]] = Plan((new, out))
            if new != task:
                self._write_task(plan, snap, ns, new, now, task, execution_id, exceeded)
            return plan

        return self.store.transact([key, *self._watch_keys(ns, task_id)], decide)

    def _outlier_stop(self, exceeded: list[Any]) -> core.EndReason | None:
        """``outliers.action: stop`` ends a flagged task ``stopped``, ``outlier``."""
        return core.EndReason.OUTLIER if exceeded and self.watch.policy.action == "stop" else None

    def watched(self, ns: str, task_id: str) -> dict[str, Any]:
        """The task's watch document: ``executions`` that acted for it, ``outlier`` mark."""
        return dict(self.store.get(keys.task_watch(ns, task_id)) or {})

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
    ) -> Task:
        """Add the tokens a model turn used (reported by the upstream after the turn).

        A task these tokens make an outlier is flagged (and, with
        ``outliers.action: stop``, ended ``stopped``, ``outlier``).
        """
        now = self.clock()
        key = keys.task(ns, task_id)

        def decide(snap: Snapshot) -> Plan[Task]:
            task = self._scoped(principal, snap.get(key), task_id)
            new = core.record_tokens(task, tokens, now)
            exceeded = self.watch.exceeded(snap, ns, new)
            if self._outlier_stop(exceeded):
                new = core.end(new, core.EndReason.OUTLIER, now)
            plan: Plan[Task] = Plan(new)
            if new != task:
                self._write_task(plan, snap, ns, new, now, task, execution_id, exceeded)
            return plan

        return self.store.transact(
            [key, *self._stop_keys(ns, task_id), *self._watch_keys(ns, task_id)], decide
        )

    def settle_model_call(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        reserved_cost: float,
        actual_cost: float,
        tokens: int,
    ) -> Task:
        """Settle a model turn: release its reservation, add its real cost and tokens."""
        now = self.clock()
        key = keys.task(ns, task_id)

        def decide(snap: Snapshot) -> Plan[Task]:
            task = self._scoped(principal, snap.get(key), task_id)
            new = core.settle_model_call(task, reserved_cost, actual_cost, tokens, now)
            plan: Plan[Task] = Plan(new)
            if new != task:
                self._write_task(plan, snap, ns, new, now, task)
            return plan

        return self.store.transact([key, *self._stop_keys(ns, task_id)], decide)

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
        if body.kind is CallKind.WRITE and not body.operation_id:
            raise ValidationFailed(
                [{"loc": ["body", "operation_id"], "msg": "a write needs its operation_id"}]
            )
        now = self.clock()
        args_prints = self.fp.fingerprints(body.args)
        call_id = body.call_id or "k" + secrets.token_hex(8)
        key = keys.task(ns, task_id)
        declared = [key, *self._stop_keys(ns, task_id), *self._watch_keys(ns, task_id)]

        def decide(snap: Snapshot) -> Plan[tuple[Task, ToolOutcome]]:
            task = self._scoped(principal, snap.get(key), task_id)
            self._remember(ns, task)
            op = None
            op_key = None
            begin = None
            if body.kind is CallKind.WRITE and body.operation_id:
                # The write lives in the task's workflow namespace (DESIGN §1).
                op_key, op = self.operations.find(snap, ns, body.operation_id, task.workflow)
                begin = BeginRequest(
                    operation_id=body.operation_id,
                    fingerprints=args_prints,
                    secret_id=self.fp.current.id,
                    workflow=task.workflow,
                    task_id=task.task_id,
                    chain_id=task.chain_id,
                    lease_s=self.settings.operations.lease_s,
                )
            call = ToolCall(
                call_id,
                body.tool,
                body.kind,
                args_prints[self.fp.current.id],
                begin,
                given_id=body.call_id is not None,
            )
            exceeded = self.watch.exceeded(snap, ns, task)
            stopped = self._stopped(snap, ns, task) or self._outlier_stop(exceeded)
            new, new_op, out = core.admit_tool_call(task, call, op, self.op_policy, now, stopped)
            plan: Plan[tuple[Task, ToolOutcome]] = Plan((new, out))
            if new != task:
                self._write_task(plan, snap, ns, new, now, task, execution_id, exceeded)
            self._write_op(plan, ns, new_op, op_key)
            return plan

        # Likely the task as this process last wrote it: decided on that, checked.
        return self.store.transact(declared, decide, recent_likely=True)

    def tool_result(
        self, principal: Principal, ns: str, task_id: str, call_id: str, res: ToolResult
    ) -> tuple[Task, ResultOutcome, CheckResult | None]:
        """Record a call's result (and settle its write in the ledger).

        When the call's tool names a check, the sidecar runs it (its outside
        parts before the transaction) and its verdict replaces the caller's
        evidence.
        """
        key = keys.task(ns, task_id)
        check_name = self._tool_check(principal, key, task_id, call_id)
        data = check_input(res.result, res.receipt)
        fetched = self.checks.checks.prefetch(check_name, data) if check_name else {}
        now = self.clock()

        def decide(snap: Snapshot) -> Plan[tuple[Task, ResultOutcome, CheckResult | None]]:
            task = self._scoped(principal, snap.get(key), task_id)
            call = task.call(call_id)
            op = None
            op_key = None
            if call is not None and call.operation_id and call.kind is CallKind.WRITE:
                op_key, op = self.operations.find(snap, ns, call.operation_id, task.workflow)
            plan: Plan[tuple[Task, ResultOutcome, CheckResult | None]] = Plan(
                (task, ResultOutcome(core.ResultDecision.RECORDED, None), None)
            )
            checked: CheckResult | None = None
            given = res
            if check_name is not None and call is not None:
                part = self.checks.store_part(
                    snap, plan, principal, ns, task_id, now, scope=call.tool
                )
                checked = self.checks.checks.run(check_name, data, fetched, part)
                given = replace(res, check=verdict(checked))
            new, new_op, out = core.record_result(task, call_id, given, op, now)
            plan.result = (new, out, checked)
            self._write_task(plan, snap, ns, new, now, task)
            self._write_op(plan, ns, new_op, op_key)
            return plan

        return self.store.transact([key], decide, recent_likely=True)

    def _tool_check(self, principal: Principal, key: str, task_id: str, call_id: str) -> str | None:
        """The check configured for the tool of ``call_id`` (read before any I/O).

        Without any tool check configured there is nothing to look up: the
        result is decided in one transaction, with no extra read.
        """
        if not any(tool.check for tool in self.settings.tools.values()):
            return None
        task = self._scoped(principal, self.store.get(key), task_id)
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
        key = keys.task(ns, task_id)
        exit_check = None
        if check is not None or any(p.exit_check for p in self.settings.policies.values()):
            # A check may apply: read the task first, so that the exit check of
            # its policy is known and nothing is asked outside for a task that
            # is not there or not the caller's (NotFound / Forbidden first).
            task = self._scoped(principal, self.store.get(key), task_id)
            policy = self.settings.policies.get(task.policy or "")
            exit_check = policy.exit_check if policy is not None else None
        if exit_check is not None and check not in (None, exit_check):
            raise ValidationFailed(
                [
                    {
                        "loc": ["body", "check"],
                        "msg": f"the policy completes only through its exit check {exit_check!r}",
                    }
                ]
            )
        name = exit_check or check
        if name is not None and name not in self.checks.checks:
            raise ValidationFailed([{"loc": ["body", "check"], "msg": f"no check {name!r}"}])
        if name is not None:
            self.checks.require_open(principal, name, task.workflow)
        fetched = self.checks.checks.prefetch(name, data) if name else {}
        now = self.clock()

        def decide(snap: Snapshot) -> Plan[tuple[Task, CompleteOutcome, CheckResult | None]]:
            task = self._scoped(principal, snap.get(key), task_id)
            plan: Plan[tuple[Task, CompleteOutcome, CheckResult | None]] = Plan(
                (task, CompleteOutcome(CompleteDecision.ENDED, None), None)
            )
            checked = None
            if name is not None:
                part = self.checks.store_part(snap, plan, principal, ns, task_id, now)
                checked = self.checks.checks.run(name, data, fetched, part)
            passed = None if checked is None else checked.passed
            ev = evidence
            if checked is not None and checked.revision is not None:
                ev = Evidence(revision=checked.revision)
            new, outcome = core.complete(task, ev, passed, now)
            plan.result = (new, outcome, checked)
            if new != task:
                self._write_task(plan, snap, ns, new, now, task)
            return plan

        return self.store.transact([key], decide)

    def stop(self, principal: Principal, ns: str, task_id: str) -> Task:
        now = self.clock()
        key = keys.task(ns, task_id)

        def decide(snap: Snapshot) -> Plan[Task]:
            task = self._scoped(principal, snap.get(key), task_id)
            new = core.stop(task, now)
            plan: Plan[Task] = Plan(new)
            if new != task:
                self._write_task(plan, snap, ns, new, now, task)
            return plan

        return self.store.transact([key], decide)

    def resume(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        reason: str,
        extend: Mapping[str, Any] | None,
    ) -> Task:
        """:raises Forbidden: ``extend`` without an admin token.
        :raises StateConflict: see :func:`sidecar.core.tasks.resume`."""
        if extend:
            principal.require_admin()
        now = self.clock()
        key = keys.task(ns, task_id)

        def decide(snap: Snapshot) -> Plan[Task]:
            task = self._scoped(principal, snap.get(key), task_id)
            if task.status is core.TaskStatus.STOPPED and not principal.admin:
                raise Forbidden("a stopped task is resumed by an admin token only")
            ops = {
                oid: self.operations.find(snap, ns, oid, task.workflow)[1]
                for oid in task.operations
            }
            unknown = core.unknown_operations(ops, now)
            new = core.resume(task, reason, extend, principal.name, unknown, now)
            plan: Plan[Task] = Plan(new)
            self._write_task(plan, snap, ns, new, now, task)
            return plan

        return self.store.transact([key], decide)

"""Writes at the model gate (DESIGN §5.1): a native n8n tool node that writes
runs once per business operation, across turns and executions of the task.

A tool configured ``kind: write`` with an ``operation_id`` template is
guarded here; the pure rules are :mod:`sidecar.core.gate_writes`, the ledger
decisions :mod:`sidecar.core.tasks` (through :class:`TaskService`). Per
answer the upstream gives, its write proposals are decided first:

- the template renders the operation id (nothing usable: the task ends
  ``blocked``, ``invalid_call``, nothing is relayed);
- the task guard admits the call (budgets, per-tool budget, cycles, policy;
  not the identical-call rule) and the ledger begins its operation in the
  task's workflow namespace, payload the call's arguments;
- ``execute``: relayed; ``replay`` / ``in_progress``: not relayed, the gate
  answers the call itself (the receipt, or :data:`IN_PROGRESS_OUTPUT`) and
  asks the upstream again (:class:`Admitted`), keeping the exchange on the task
  under a call id of its own (:func:`~sidecar.core.gate_writes.own_call_id`:
  a call numbered by position may lend its number to a later one);
- anything that ends the task: its final message; writes of the same answer
  admitted before are released (``not_committed``: n8n never saw them).

The tool's output in the next request settles the operation
(:meth:`GateWrites.settle`): committed when it proves the write, otherwise
unknown, reconciled at once by the tool's ``reconcile`` check when it has one.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jmespath

from sidecar.auth import Principal
from sidecar.config import Settings
from sidecar.core import tasks as core
from sidecar.core.gate_writes import (
    KeptExchange,
    Template,
    TemplateError,
    kept_with,
    own_call_id,
    parse_input_templates,
    parse_template,
    read_output,
    receipt_text,
    render_input,
    render_operation_id,
)
from sidecar.core.operations import CheckFinding
from sidecar.core.tasks import (
    CallKind,
    CallStatus,
    DenyReason,
    EndReason,
    ResultStatus,
    Task,
    ToolDecision,
    ToolResult,
)
from sidecar.errors import NotFound, StaleAttempt, StateConflict
from sidecar.gate.wire.base import Proposal, ToolOutput, WireAdapter
from sidecar.service import records
from sidecar.service.gate_calls import denied_text
from sidecar.service.messages import final_message
from sidecar.service.records import Txn
from sidecar.service.task_inputs import CallInput
from sidecar.service.tasks import TaskService

log = logging.getLogger("loopstop")

#: The tool output the gate writes for each copy of one write proposed twice in one answer.
COPY_OUTPUT = (
    "[loopstop] Not run: this write was proposed more than once in one answer. Propose it once."
)

#: The tool output the gate writes for a write another execution holds.
IN_PROGRESS_OUTPUT = (
    "[loopstop] Another execution is writing this right now; do not call it again now. "
    "Continue with something else or give your final answer."
)


@dataclass(frozen=True)
class WriteTool:
    """A tool whose writes the gate guards (``tools.<name>`` with ``operation_id``)."""

    name: str
    operation_id: Template
    lease_s: float | None
    committed_when: Any | None
    reconcile_check: str | None
    reconcile_input: Any


@dataclass
class Admitted:
    """What the gate does with one answer's write proposals.

    :ivar final: answer this text instead of the upstream's answer.
    :ivar again: ask the upstream again with these exchanges appended (the
        proposal and the gate's own output), in the answer's order.
    :ivar executed: ``(operation_id, attempt)`` of the writes relayed to n8n,
        in the task's ``workflow`` (:meth:`GateWrites.release` them when the
        answer is not relayed after all).
    """

    final: str | None = None
    again: list[KeptExchange] = field(default_factory=list)
    executed: list[tuple[str, int]] = field(default_factory=list)
    workflow: str | None = None


@dataclass(frozen=True)
class _Answer:
    """The answer whose write proposals :meth:`GateWrites.admit` decides."""

    principal: Principal
    ns: str
    task_id: str
    adapter: WireAdapter
    body: Mapping[str, Any]
    note: Callable[[str, str, str | None, str | None], None]


class GateWrites:
    """The writes of the model gate (see the module's docstring)."""

    def __init__(self, tasks: TaskService, settings: Settings) -> None:
        self.tasks = tasks
        self.tools: dict[str, WriteTool] = {}
        for name, tool in settings.tools.items():
            if tool.kind != "write" or tool.operation_id is None:
                continue
            self.tools[name] = WriteTool(
                name,
                parse_template(tool.operation_id),
                tool.lease_s,
                None if tool.committed_when is None else jmespath.compile(tool.committed_when),
                tool.reconcile.check if tool.reconcile else None,
                parse_input_templates(tool.reconcile.input) if tool.reconcile else None,
            )

    def guards(self, tool: str) -> bool:
        """True when ``tool``'s writes go through the gate's ledger."""
        return tool in self.tools

    # -- the conversation ----------------------------------------------------------------

    def splice(self, adapter: WireAdapter, body: dict[str, Any], task: Task) -> dict[str, Any]:
        """The request with the task's kept exchanges put back (DESIGN §5.1)."""
        if not task.exchanges:
            return body
        return adapter.with_kept(body, [KeptExchange.from_doc(d) for d in task.exchanges])

    # -- admission ---------------------------------------------------------------------

    def admit(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        adapter: WireAdapter,
        body: Mapping[str, Any],
        proposals: list[Proposal],
        note: Callable[[str, str, str | None, str | None], None],
        flaws: Sequence[core.CallFlaw | None] = (),
    ) -> Admitted:
        """Decide the write proposals of one answer (the others are left to the caller).

        :param body: the request the answer answers (the anchor of new exchanges).
        :param note: called with ``(tool, decision, reason, operation_id)`` per decided
            proposal (``operation_id`` None when the template named none).
        :param flaws: :func:`~sidecar.core.tasks.screen_proposal`'s, per proposal
            (none :attr:`~sidecar.core.tasks.CallFlaw.INVALID`): a repeated call id
            is one call, its copy denied ``duplicate_call`` (nothing relayed).
        """
        out = Admitted()
        answer = _Answer(principal, ns, task_id, adapter, body, note)
        try:
            return self._admit(answer, proposals, flaws, out)
        except BaseException:
            # a store failure, a refused begin (too many open, a conflict) while
            # deciding a later proposal: nothing of the answer is relayed, so the
            # writes it began are given back (best effort: the store may be down)
            try:
                self.release(principal, ns, out.workflow, out.executed)
            except Exception:
                log.warning("task %s: writes begun in a failed answer not released", task_id)
            raise

    def _admit(
        self,
        answer: _Answer,
        proposals: list[Proposal],
        flaws: Sequence[core.CallFlaw | None],
        out: Admitted,
    ) -> Admitted:
        principal, ns, task_id = answer.principal, answer.ns, answer.task_id
        adapter, body, note = answer.adapter, answer.body, answer.note
        kept: list[KeptExchange] = []
        begun: dict[str, Proposal] = {}  # operation id -> the proposal that began it
        workflow: str | None = None
        for at, call in enumerate(proposals):
            spec = self.tools.get(call.tool)
            if spec is None:
                continue
            if at < len(flaws) and flaws[at] is core.CallFlaw.REPEAT:
                dup = str(DenyReason.DUPLICATE_CALL)
                note(call.tool, str(ToolDecision.DENY), dup, None)
                self.release(principal, ns, workflow, out.executed)
                return Admitted(final=denied_text(call.tool, dup))
            try:
                oid = render_operation_id(spec.operation_id, call.args)
                rinput = (
                    None
                    if spec.reconcile_check is None
                    else render_input(spec.reconcile_input, call.args)
                )
            except TemplateError:
                note(call.tool, "deny", str(EndReason.INVALID_CALL), None)
                task = self.end(principal, ns, task_id, EndReason.INVALID_CALL)
                self.release(principal, ns, task.workflow, out.executed)
                return Admitted(final=final_message(task))
            if oid in begun:
                # One answer asks for one operation twice (parallel tool calls): n8n
                # would run both. Neither runs; the model is told, and asked again.
                note(call.tool, str(ToolDecision.DENY), str(DenyReason.DUPLICATE_CALL), oid)
                self.release(principal, ns, workflow, out.executed)
                copies = [begun[oid], call]
                return Admitted(
                    again=[self._kept(body, adapter, c, COPY_OUTPUT, "copy", oid) for c in copies]
                )
            begun[oid] = call
            task, decided = self.tasks.tool_call(
                principal,
                ns,
                task_id,
                CallInput(
                    tool=call.tool,
                    kind=CallKind.WRITE,
                    args=call.args,
                    operation_id=oid,
                    call_id=call.call_id or None,
                    lease_s=spec.lease_s,
                    reconcile=None
                    if spec.reconcile_check is None
                    else {"check": spec.reconcile_check, "input": rinput},
                    ledger_repeats=True,
                ),
            )
            workflow = out.workflow = task.workflow
            reason = None if decided.reason is None else str(decided.reason)
            note(call.tool, str(decided.decision), reason, oid)
            op = decided.operation
            if decided.decision is ToolDecision.EXECUTE and op is not None:
                out.executed.append((oid, op.attempt))
            elif decided.decision is ToolDecision.REPLAY and op is not None:
                receipt = receipt_text(op.receipt)
                kept.append(self._kept(body, adapter, call, receipt, "replay", oid))
            elif decided.decision is ToolDecision.DENY and (
                task.envelope is None and decided.reason is DenyReason.IN_PROGRESS
            ):
                kept.append(self._kept(body, adapter, call, IN_PROGRESS_OUTPUT, "in_progress", oid))
            else:
                self.release(principal, ns, workflow, out.executed)
                return Admitted(final=final_message(task))
        if kept:
            self.release(principal, ns, workflow, out.executed)
            if any(e.decision == "replay" for e in kept):  # what kept_with keeps
                self.keep(principal, ns, task_id, kept)
            return Admitted(again=kept)
        return out

    def _kept(
        self,
        body: Mapping[str, Any],
        adapter: WireAdapter,
        call: Proposal,
        output: str,
        decision: str,
        oid: str,
    ) -> KeptExchange:
        return KeptExchange(
            adapter.last_anchor(body),
            own_call_id(call.call_id, secrets.token_hex(4)),
            call.tool,
            call.args,
            output,
            decision,
            oid,
            self.tasks.clock(),
        )

    def keep(self, principal: Principal, ns: str, task_id: str, new: list[KeptExchange]) -> Task:
        """Keep exchanges the gate answered itself on the task."""

        def step(task: Task, txn: Txn) -> tuple[Task | None, Task]:
            kept = replace(task, exchanges=kept_with(task.exchanges, new), updated_at=txn.now)
            return kept, kept

        return self._update(principal, ns, task_id, step)

    def end(self, principal: Principal, ns: str, task_id: str, reason: EndReason) -> Task:
        """End the task for ``reason`` (an ended task keeps its envelope)."""

        def step(task: Task, txn: Txn) -> tuple[Task | None, Task]:
            if task.envelope is not None:
                return None, task
            ended = core.end(task, reason, txn.now)
            return ended, ended

        return self._update(principal, ns, task_id, step)

    def _update(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        step: Callable[[Task, Txn], tuple[Task | None, Task]],
    ) -> Task:
        tasks = self.tasks
        return records.update(
            tasks.store, tasks.records, ns, task_id, principal, step, tasks.clock()
        )

    def release(
        self,
        principal: Principal,
        ns: str,
        workflow: str | None,
        executed: list[tuple[str, int]],
    ) -> None:
        """Writes admitted but never relayed (the answer was not relayed): their
        attempts are given back (``not_committed``, n8n never ran them), so a
        later proposal may write without spending an attempt."""
        for oid, attempt in executed:
            try:
                self.tasks.operations.release(
                    principal, ns, oid, attempt, "not relayed: the gate answered instead", workflow
                )
            except (NotFound, StaleAttempt, StateConflict):
                continue  # settled meanwhile: the ledger keeps what it knows

    # -- settling ----------------------------------------------------------------------

    def result(
        self, principal: Principal, ns: str, task: Task, out: ToolOutput
    ) -> ToolResult | None:
        """The result of a guarded write's output (:meth:`settle`); None when
        ``out`` answers no guarded write waiting for its output."""
        if not self.is_pending_write(task, out.call_id):
            return None
        return self.settle(principal, ns, task, out)

    def settle(self, principal: Principal, ns: str, task: Task, out: ToolOutput) -> ToolResult:
        """The result a write's tool output gives (DESIGN §5.1): committed with the
        output as receipt when it proves the write; otherwise unknown, reconciled
        at once by the tool's ``reconcile`` check (run here, before the result's
        transaction) when it has one."""
        fp = self.tasks.fp.fingerprint(out.output)
        call = task.call(out.call_id)
        spec = self.tools.get(call.tool) if call is not None else None
        committed_when = spec.committed_when if spec is not None else None
        reading = read_output(out.output, committed_when)
        if reading.committed:
            return ToolResult(status=ResultStatus.OK, result_fp=fp, receipt=reading.receipt)
        finding = None
        if spec is not None and spec.reconcile_check is not None and call is not None:
            finding = self._ask(principal, ns, task, call.operation_id)
        log.warning(
            "task %s: the output of %s did not prove its write (%s); %s",
            task.task_id,
            call.tool if call else "?",
            reading.why,
            "no reconcile check"
            if finding is None
            else f"check {finding.check}: found={finding.found} absent={finding.absent}",
        )
        if finding is None:
            return ToolResult(status=ResultStatus.UNKNOWN, result_fp=fp, why=reading.why)
        status = ResultStatus.OK if finding.found or finding.absent else ResultStatus.UNKNOWN
        return ToolResult(status=status, result_fp=fp, reconciled=finding, why=reading.why)

    def _ask(
        self, principal: Principal, ns: str, task: Task, operation_id: str | None
    ) -> CheckFinding | None:
        """What the operation's recorded reconcile check finds at the receiver
        (None: it cannot run, or nothing is recorded)."""
        if operation_id is None:
            return None
        try:
            op = self.tasks.operations.get(principal, ns, operation_id, task.workflow)
        except NotFound:
            return None
        if op.reconcile_check is None:
            return None
        return self.tasks.operations.ask_receiver(
            dict(op.reconcile_check), principal, task.workflow
        )

    def is_pending_write(self, task: Task, call_id: str) -> bool:
        """The call ``call_id`` is a guarded write waiting for its output."""
        call = task.call(call_id)
        return (
            call is not None
            and call.kind is CallKind.WRITE
            and call.tool in self.tools
            and call.status is CallStatus.PENDING
        )

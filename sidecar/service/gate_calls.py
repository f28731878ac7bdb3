"""The model gate's tool calls (DESIGN §5): the calls an upstream proposes,
admitted by the task guard before they reach n8n, and the tool outputs the
agent sends back, recorded as those calls' results.

A proposal is screened as a whole first (:func:`sidecar.core.tasks.screen_proposal`):
a call without an id or naming a tool the request did not offer ends the
task ``blocked``, ``invalid_call`` before anything else of it is admitted; a
call id given twice is one call, its copies denied ``duplicate_call`` and
counted. No wire format is known here: the adapters read the calls and outputs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar.auth import Principal
from sidecar.config import Settings
from sidecar.core.gate_writes import tool_item
from sidecar.core.tasks import (
    CallFlaw,
    CallKind,
    CallStatus,
    DenyReason,
    ResultStatus,
    Task,
    ToolDecision,
    ToolResult,
    screen_proposal,
)
from sidecar.errors import NotFound, StateConflict
from sidecar.gate.wire.base import Proposal, ToolOutput
from sidecar.service.messages import final_message, message
from sidecar.service.task_inputs import CallInput
from sidecar.service.tasks import TaskService


@dataclass
class Admitted:
    """What the task guard said about one proposal.

    :ivar denied: the final text to answer instead of the proposal (None: every
        call may reach n8n).
    :ivar reason: the first denial's reason.
    :ivar calls: ``(tool, decision, reason, None)`` per call, for the decision log.
    :ivar counted: the turn's tokens were counted in a call's transaction.
    """

    denied: str | None = None
    reason: str | None = None
    calls: list[tuple[str, str, str | None, str | None]] = field(default_factory=list)
    counted: bool = False


def output_value(output: Any) -> Any:
    """A tool output as a check reads it: JSON text parsed (the text itself when
    it is not JSON), and n8n's list of one item read as that item (DESIGN §5.1)."""
    value = output
    if isinstance(output, str):
        try:
            value = json.loads(output)
        except (ValueError, RecursionError):
            return output
    return tool_item(value)


class GateCalls:
    """Admits proposals and records outputs for one task guard (see the module)."""

    def __init__(self, tasks: TaskService, settings: Settings) -> None:
        self.tasks = tasks
        self.settings = settings

    def _kind(self, tool: str) -> CallKind:
        configured = self.settings.tools.get(tool)
        return CallKind(configured.kind) if configured is not None else CallKind.READ

    def record_outputs(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        outputs: Sequence[ToolOutput],
        task: Task | None,
        settle: Callable[[Task, ToolOutput], ToolResult | None] | None = None,
    ) -> None:
        """Record the tool outputs a request carries for calls still pending.

        The agent sends its whole history each turn: outputs already recorded
        (or answering calls the gate never admitted) are skipped; of outputs
        under one id (an upstream that reuses ids), the latest answers the
        pending call. A tool with a configured check gets the output as the
        check's input, as ``POST .../result`` with ``result`` does; ``settle``
        gives the result of an output it knows (a guarded write's, DESIGN §5.1).
        """
        if not outputs:
            return
        if task is None:
            task = self.tasks.get(principal, ns, task_id)
        pending = {c.call_id: c.tool for c in task.history() if c.status is CallStatus.PENDING}
        fp = self.tasks.fp
        latest = {out.call_id: out for out in outputs}  # in order, the last output of each id
        for out in latest.values():
            tool = pending.pop(out.call_id, None)
            if tool is None:
                continue
            configured = self.settings.tools.get(tool)
            checked = configured is not None and configured.check is not None
            result = settle(task, out) if settle is not None else None
            if result is None:
                result = ToolResult(
                    status=ResultStatus.OK,
                    result_fp=fp.fingerprint(out.output),
                    result=output_value(out.output) if checked else None,
                )
            try:
                self.tasks.tool_result(principal, ns, task_id, out.call_id, result)
            except (NotFound, StateConflict):
                continue  # recorded meanwhile by another request: nothing to add

    def admit(
        self,
        principal: Principal,
        ns: str,
        task_id: str,
        calls: Sequence[Proposal],
        offered: frozenset[str] | None,
        tokens: int = 0,
    ) -> Admitted:
        """Admit each proposed call in order, up to the first denial.

        A tool configured ``kind: write`` is not admitted here: a write needs an
        operation id, which only the flow can give (a Loop Stop node's Admit
        Tool Call in the tool's sub-workflow); the gate relays it to the flow.

        :param tokens: the proposing turn's tokens, counted first in the first
            call's transaction (one transaction where there were two); whether
            they were is ``counted`` (else the caller counts them).
        """
        flaws = screen_proposal([(c.call_id, c.tool) for c in calls], offered)
        if CallFlaw.INVALID in flaws:  # the malformed call first: nothing else is admitted
            at = flaws.index(CallFlaw.INVALID)
            calls, flaws = [calls[at]], [CallFlaw.INVALID]
        done = Admitted()
        for call, flaw in zip(calls, flaws, strict=True):
            kind = self._kind(call.tool)
            if kind is CallKind.WRITE and flaw is None:
                done.calls.append((call.tool, "left_to_flow", "write", None))
                continue
            if kind is CallKind.WRITE and flaw is CallFlaw.REPEAT:
                return self._deny(done, call.tool, DenyReason.DUPLICATE_CALL)
            try:
                due = 0 if done.counted else tokens
                task, out = self.tasks.tool_call(
                    principal,
                    ns,
                    task_id,
                    CallInput(
                        call.tool, kind, call.args, None, call.call_id or None, flaw, tokens=due
                    ),
                )
                done.counted = True
            except StateConflict:  # an id still pending, proposed again with other arguments
                return self._deny(done, call.tool, DenyReason.DUPLICATE_CALL)
            reason = None if out.reason is None else str(out.reason)
            done.calls.append((call.tool, str(out.decision), reason, None))
            if out.decision is ToolDecision.DENY:
                done.reason = reason
                done.denied = (
                    final_message(task)
                    if task.envelope is not None
                    else denied_text(call.tool, reason)
                )
                return done
        return done

    @staticmethod
    def _deny(done: Admitted, tool: str, reason: DenyReason) -> Admitted:
        done.calls.append((tool, str(ToolDecision.DENY), str(reason), None))
        done.reason, done.denied = str(reason), denied_text(tool, str(reason))
        return done


def denied_text(tool: str, reason: str | None) -> str:
    """The final text answered instead of a call the task guard denied (the task goes on)."""
    why = message(reason) or "Do not repeat it now; continue with what you have."
    return f"[loopstop] The call to {tool} was not admitted ({reason}). {why}"

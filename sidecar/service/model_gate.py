"""The model gate (DESIGN §5): a model endpoint in front of the real model,
so that every model turn and every tool call of an n8n AI Agent is admitted
and counted, and an ended task ends the agent with a plain final message.

Each wire format is one pure adapter (:mod:`sidecar.gate.wire`); the
upstream is reached through :mod:`sidecar.outbound.upstream`. Per request:

1. find the task from the ``loopstop-*`` lines of the agent's System
   Message (:mod:`sidecar.gate.lines`): by id, or by key (created or
   continued as ``POST /v1/tasks`` does);
2. record every tool output the request carries back as that call's
   result (:mod:`sidecar.service.gate_calls`; a tool's configured check
   runs on it; a guarded write's output settles its operation:
   :mod:`sidecar.service.gate_writes`), and put back the exchanges the gate
   answered itself earlier in the task;
3. reserve a model turn and a bound of its cost (:mod:`sidecar.core.cost`;
   under a money budget a request whose cost cannot be bounded is refused);
   when the task has ended, answer a final assistant message in the
   caller's own format and mode without calling the upstream;
4. forward to the upstream (adding a short system message at ``wrap_up``),
   relay its answer (a stream event by event; at most
   ``model_gate.max_answer_bytes``), count the tokens it reports (an
   estimate when a stream is cut before its usage) and settle the
   reservation; a settle the store refuses is retried, then kept and
   applied before this worker's next turn: a reservation is never held for
   ever;
5. admit every tool call the upstream proposes through the task guard
   before it reaches n8n; a denied proposal is not relayed: the answer is
   the final message instead; a guarded write already committed (or being
   written) is answered by the gate itself, and the upstream is asked again
   within the request (a counted turn; a stream continues as one answer).
   Whatever fails once a stream has begun (the store included), the stream
   ends with an error event in the API's shape.

Prompts and completions are never logged or stored.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import urllib3

from sidecar.auth import Principal
from sidecar.config import ModelGateConfig, Settings
from sidecar.core import cost
from sidecar.core.gate_writes import MAX_ASKS_PER_REQUEST
from sidecar.core.tasks import CallFlaw, TurnDecision, TurnReason, screen_proposal
from sidecar.errors import (
    StoreUnavailable,
    UpstreamError,
)
from sidecar.gate.lines import task_lines
from sidecar.gate.wire.base import (
    NO_USAGE,
    ErrorEvent,
    Final,
    Frame,
    Held,
    Inbound,
    NotThisAnswer,
    Passed,
    Proposal,
    Stamp,
    StreamBroken,
    StreamReader,
    Usage,
    WireAdapter,
    estimate_tokens,
)
from sidecar.outbound.upstream import Exchange, Upstream
from sidecar.service.gate_calls import GateCalls
from sidecar.service.gate_money import GateMoney
from sidecar.service.gate_turns import (
    GateAnswer,
    KnownTasks,
    Turn,
    TurnRecord,
    find_task,
    make_upstream,
)
from sidecar.service.gate_writes import GateWrites
from sidecar.service.messages import ASKED_ENOUGH_MESSAGE, WRAP_UP_MESSAGE, final_message
from sidecar.service.tasks import TaskService

log = logging.getLogger(__name__)


class ModelGate:
    """Admits, forwards and counts model turns and the tool calls they propose.

    :param pool: the connection pool to the upstreams
        (:func:`~sidecar.outbound.upstream.upstream_pool`).
    :param environ: where the upstream's API key is read (``api_key_env``).
    :param clock: the injected wall clock (Unix seconds), for the answers'
        ``created`` times.
    """

    def __init__(
        self,
        config: ModelGateConfig,
        tasks: TaskService,
        pool: urllib3.PoolManager,
        environ: Mapping[str, str],
        clock: Callable[[], float],
        settings: Settings | None = None,
    ) -> None:
        self.config = config
        self.tasks = tasks
        self.clock = clock
        self.settings = settings or tasks.settings
        self.pool = pool
        self.environ = environ
        self._upstreams: dict[str, Upstream] = {}
        self.calls = GateCalls(tasks, self.settings)
        #: what this worker learned of tasks that never changes (no read again)
        self.known = KnownTasks()
        self.money = GateMoney(config, tasks)
        self.writes = GateWrites(tasks, self.settings)

    def upstream(self, adapter: WireAdapter) -> Upstream:
        """The upstream of the adapter's API (``model_gate.upstreams.<api>``), made
        on first use (:func:`~sidecar.service.gate_turns.make_upstream`)."""
        found = self._upstreams.get(adapter.api.name)
        if found is None:
            found = make_upstream(self.config, self.pool, self.environ, adapter.api)
            self._upstreams[adapter.api.name] = found
        return found

    def _stamp(self) -> Stamp:
        return Stamp(int(self.clock()), secrets.token_hex(12))

    def models(self, adapter: WireAdapter, inbound: Inbound | None = None) -> dict[str, Any]:
        """The upstream's model list (n8n's credential test and model picker), or the
        configured default model when the upstream answers but cannot list.

        :raises GateNotConfigured: no upstream is configured (n8n's credential
            test fails instead of going green on a gate that refuses every turn).
        :raises UpstreamError: the upstream cannot be reached (502): the test
            fails as every turn would.
        """
        path = inbound.path if inbound is not None else adapter.models_path
        listed = self.upstream(adapter).get_json(adapter, path, inbound)
        return adapter.model_list(listed, self.config.default_model or "loopstop-gate")

    # -- the task --------------------------------------------------------------------

    def _decide(
        self, turn: Turn, body: dict[str, Any], calls: list[Proposal]
    ) -> tuple[str | None, dict[str, Any] | None]:
        """Decide an answer's proposals: ``(text, None)``, the final text to answer
        instead (None: relay the answer), or ``(None, body)``, the request to ask
        the upstream again with (the gate answered a guarded write itself).

        The proposals are numbered against the request as n8n sent it
        (``number_calls``): the exchanges the gate put in never shift the ids
        of the calls n8n sees. The proposal is screened as a whole first
        (:func:`~sidecar.core.tasks.screen_proposal`): a malformed call ends the
        task before any write of it begins; a repeated id is one call."""
        if turn.ns is None or turn.task_id is None:
            return None, None
        calls = turn.adapter.number_calls(turn.received, calls)
        offered = turn.adapter.offered_tools(turn.body)
        flaws = screen_proposal([(c.call_id, c.tool) for c in calls], offered)
        if CallFlaw.INVALID in flaws:
            return self._admit_calls(turn, calls), None
        writes = self.writes.admit(
            turn.principal,
            turn.ns,
            turn.task_id,
            turn.adapter,
            body,
            calls,
            lambda tool, decision, reason, oid: turn.record.tool_calls.append(
                (tool, decision, reason, oid)
            ),
            flaws,
        )
        if writes.final is not None:
            turn.record.decision = TurnDecision.DENY_TOOL_CALL
            turn.record.reason = turn.record.tool_calls[-1][2]
            return writes.final, None
        if writes.again:
            for e in writes.again:
                body = turn.adapter.with_exchange(
                    body, Proposal(e.call_id, e.tool, e.args), e.output
                )
                turn.record.answered.append(
                    {
                        "tool": e.tool,
                        "call_id": e.call_id,
                        "operation_id": e.operation_id,
                        "decision": e.decision,
                    }
                )
            return None, body
        text = self._admit_calls(turn, [c for c in calls if not self.writes.guards(c.tool)])
        if text is not None:
            self.writes.release(turn.principal, turn.ns, writes.workflow, writes.executed)
        return text, None

    def _admit_calls(self, turn: Turn, calls: list[Proposal]) -> str | None:
        """The task guard's word on a proposal: None when every call may reach
        n8n, else the final text to answer instead (:mod:`sidecar.service.gate_calls`)."""
        if turn.ns is None or turn.task_id is None:
            return None
        offered = turn.adapter.offered_tools(turn.body)
        done = self.calls.admit(
            turn.principal, turn.ns, turn.task_id, calls, offered, turn.tokens_due
        )
        if done.counted:
            turn.tokens_due = 0
        turn.record.tool_calls.extend(done.calls)
        if done.denied is not None:
            turn.record.decision, turn.record.reason = TurnDecision.DENY_TOOL_CALL, done.reason
        return done.denied

    # -- serving a turn --------------------------------------------------------------

    def turn(
        self,
        adapter: WireAdapter,
        principal: Principal,
        body: dict[str, Any],
        route: Mapping[str, str] | None = None,
        inbound: Inbound | None = None,
    ) -> GateAnswer:
        """Serve one model request in ``adapter``'s wire format, streamed or not.

        :param route: the path's parameters (a model or deployment named in the path).
        :param inbound: the request's path, query and headers to forward (None: the
            adapter's path, no query, no header).
        :raises MalformedRequest: the body is not the API's shape, names no
            task (unless untracked requests are allowed), or its task lines are wrong.
        :raises NotFound: the task line names no task.
        :raises GateNotConfigured: no upstream is configured (nothing is admitted).
        :raises UpstreamError: the upstream failed before answering; relayed in
            the API's error shape (a failure mid-stream is an error event instead).
        """
        adapter.validate(body)
        self.upstream(adapter).url("")  # a misconfigured gate admits nothing
        self.money.settle_kept()
        stream = adapter.streaming(body)
        model = adapter.model(body, route or {}) or self.config.default_model or ""
        lines = task_lines(adapter.system_texts(body))
        record = TurnRecord(
            TurnDecision.UNTRACKED, None, None, adapter.name, stream, lines.execution
        )
        turn = Turn(adapter, principal, body, model, stream, record, inbound, received=body)
        task = find_task(self.tasks, self.config.allow_untracked, turn, lines, self.known)
        record.task_id = turn.task_id
        if turn.task_id is None or turn.ns is None:
            return self._forward(turn, body)
        outputs = adapter.tool_outputs(body)
        ns, task_id = turn.ns, turn.task_id
        self.calls.record_outputs(
            principal,
            ns,
            task_id,
            outputs,
            task,
            lambda t, o: self.writes.result(principal, ns, t, o),
        )
        if self.writes.tools:  # the kept exchanges count in the turn's cost bound
            task = task if task is not None else self.tasks.get(principal, ns, task_id)
            body = turn.body = self.writes.splice(adapter, body, task)
        held = self.money.reserve(adapter, body, model)
        body = turn.body = held.body
        turn.price, reserve = held.price, held.amount
        task, outcome = self.tasks.model_call(
            principal,
            turn.ns,
            turn.task_id,
            None,
            reserve_cost=reserve,
            execution_id=lines.execution,
            unbudgeted=held.unbudgeted,
        )
        turn.reserved = (reserve or 0.0) if outcome.admitted else 0.0
        if not outcome.admitted:
            record.decision = TurnDecision.DENY
            record.reason = None if outcome.reason is None else str(outcome.reason)
            return self._refusal(turn, final_message(task))
        record.decision = TurnDecision.ADMIT
        record.reason = TurnReason.WRAP_UP if outcome.wrap_up else None
        forward = adapter.with_wrap_up(body, WRAP_UP_MESSAGE) if outcome.wrap_up else body
        return self._forward(turn, forward)

    def _again(self, turn: Turn, body: dict[str, Any]) -> tuple[Turn | None, str, dict[str, Any]]:
        """Reserve one more model turn to ask the upstream again with ``body``:
        the next turn and what to forward, or None and the final text when the
        task's budgets refuse it."""
        assert turn.ns is not None and turn.task_id is not None
        if turn.record.turns >= MAX_ASKS_PER_REQUEST:
            return None, ASKED_ENOUGH_MESSAGE, body
        nxt = Turn(
            turn.adapter,
            turn.principal,
            body,
            turn.model,
            turn.stream,
            turn.record,
            turn.inbound,
            turn.received,
        )
        nxt.ns, nxt.task_id = turn.ns, turn.task_id
        held = self.money.reserve(turn.adapter, body, turn.model)
        body = nxt.body = held.body
        nxt.price, reserve = held.price, held.amount
        task, outcome = self.tasks.model_call(
            turn.principal,
            turn.ns,
            turn.task_id,
            None,
            reserve_cost=reserve,
            execution_id=turn.record.execution,
            unbudgeted=held.unbudgeted,
        )
        if not outcome.admitted:
            return None, final_message(task), body
        nxt.reserved = reserve or 0.0
        forward = turn.adapter.with_wrap_up(body, WRAP_UP_MESSAGE) if outcome.wrap_up else body
        return nxt, "", forward

    def _refusal(self, turn: Turn, text: str) -> GateAnswer:
        """A final message in the caller's format and mode (the upstream is not called)."""
        adapter, stamp = turn.adapter, self._stamp()
        if turn.stream:
            events = adapter.final_stream(text, turn.model, stamp, turn.body)
            return GateAnswer(turn.record, events=iter(events))
        return GateAnswer(turn.record, body=adapter.final_answer(text, turn.model, stamp))

    def _count(
        self,
        turn: Turn,
        usage: Usage,
        estimate: int,
        *,
        answered: bool = True,
        proposals: bool = False,
    ) -> None:
        """Count a turn once, when it is over: its tokens (the reported usage,
        else ``estimate``) and, for a priced model, settle its reservation with
        what it cost (:func:`sidecar.core.cost.settled_cost`). A settle the store
        refuses is retried, then kept for later (:class:`GateMoney`).

        :param proposals: the answer proposes tool calls: an unpriced turn's
            tokens are counted by the first call's admission (one transaction
            for both; :meth:`_count_due` counts them alone when none is made)."""
        if turn.counted:
            return
        turn.counted = True
        tokens = estimate if usage.tokens is None else usage.tokens
        turn.record.tokens += tokens
        turn.record.usage = "estimated" if usage.tokens is None else "reported"
        if turn.ns is None or turn.task_id is None:
            return
        if turn.price is None and proposals and not self.writes.tools:
            turn.tokens_due = tokens
            return
        principal, ns, task_id, once = turn.principal, turn.ns, turn.task_id, turn.settle_id
        if turn.price is None:
            if tokens:
                self.money.settle(
                    lambda: self.tasks.record_tokens(principal, ns, task_id, tokens, turn_id=once)
                )
            return
        spent = cost.settled_cost(turn.price, turn.reserved, usage.split, answered=answered)
        turn.record.cost = spent
        reserved = turn.reserved
        task = self.money.settle(
            lambda: self.tasks.settle_model_call(
                principal, ns, task_id, reserved, spent, tokens, turn_id=once
            )
        )
        over = None if task is None or task.envelope is None else task.envelope.used
        if over is not None and "cost_overshoot" in over:
            turn.record.cost_overshoot = float(over["cost_overshoot"])

    def _count_due(self, turn: Turn) -> None:
        """Count the tokens left to a call's admission that none counted (no
        call reached a transaction, or its transaction failed)."""
        tokens, turn.tokens_due = turn.tokens_due, 0
        if tokens and turn.ns is not None and turn.task_id is not None:
            principal, ns, task_id, once = turn.principal, turn.ns, turn.task_id, turn.settle_id
            self.money.settle(
                lambda: self.tasks.record_tokens(principal, ns, task_id, tokens, turn_id=once)
            )

    def _decide_counted(
        self, turn: Turn, calls: list[Proposal], usage: Usage, estimate: int
    ) -> tuple[str | None, dict[str, Any] | None]:
        """Count the turn and decide its proposals (:meth:`_decide`), the tokens
        of an unpriced turn in the first call's admission."""
        self._count(turn, usage, estimate, proposals=bool(calls))
        try:
            return self._decide(turn, turn.body, calls)
        finally:
            self._count_due(turn)

    def _bad_upstream(self, turn: Turn, message: str) -> UpstreamError:
        turn.record.upstream_failed(TurnReason.BAD_UPSTREAM_RESPONSE)
        exc = UpstreamError(502, turn.adapter.error_body(message, "bad_upstream_response"))
        exc.record = turn.record
        return exc

    def _forward(self, turn: Turn, body: dict[str, Any]) -> GateAnswer:
        adapter = turn.adapter
        payload = adapter.forward_payload(body, turn.model)
        turn.record.turns += 1
        inbound = turn.inbound
        # Nothing of the request changed: its bytes go as they came (parsed once,
        # never written again).
        raw = inbound.raw if inbound is not None and payload == turn.received else None
        try:
            exchange = self.upstream(adapter).post(adapter, payload, turn.stream, inbound, raw)
        except UpstreamError as exc:
            turn.record.upstream_status = exc.status
            turn.record.upstream_failed(str(exc.status))
            exc.record = turn.record
            # The turn was admitted: the request counts, whatever the upstream did.
            self._count(turn, NO_USAGE, estimate_tokens(payload, 0), answered=False)
            raise
        turn.record.upstream_status = exchange.status
        if turn.stream:
            if not exchange.content_type.startswith(adapter.framing.content_type):
                exchange.close()
                self._count(turn, NO_USAGE, estimate_tokens(payload, 0))
                raise self._bad_upstream(
                    turn, "the upstream model answered a stream request without a stream"
                )
            return GateAnswer(turn.record, events=self._relay(turn, payload, exchange))
        try:
            content = exchange.read_all(adapter)
        except UpstreamError as exc:
            self._count(turn, NO_USAGE, estimate_tokens(payload, exc.received))
            turn.record.upstream_failed(exc.reason or str(exc.status))
            exc.record = turn.record
            raise
        try:
            parsed = json.loads(content)
        except (ValueError, RecursionError):
            parsed = None
        try:
            answer = adapter.read_answer(parsed)
        except NotThisAnswer as exc:
            self._count(turn, NO_USAGE, estimate_tokens(payload, len(content)))
            raise self._bad_upstream(turn, str(exc)) from None
        estimate = estimate_tokens(payload, len(content))
        denied, again = self._decide_counted(turn, answer.proposals, answer.usage, estimate)
        if again is not None:
            nxt, denied, forward = self._again(turn, again)
            if nxt is not None:
                return self._forward(nxt, forward)
        if denied is None:  # relayed as it came (parsed once, never written again)
            return GateAnswer(turn.record, body=parsed, raw=content)
        return GateAnswer(
            turn.record, body=adapter.replace_with_text(parsed, denied, self._stamp())
        )

    def _follow(self, turn: Turn, body: dict[str, Any], reader: StreamReader) -> Iterator[bytes]:
        """Ask the upstream again within a stream that has begun: its events
        continue the answer (``reader`` is the last stream's follow-on); a
        failure is an error event."""
        adapter = turn.adapter
        payload = adapter.forward_payload(body, turn.model)
        turn.record.turns += 1
        try:
            exchange = self.upstream(adapter).post(adapter, payload, True, turn.inbound)
        except UpstreamError as exc:
            turn.record.upstream_status = exc.status
            turn.record.upstream_failed(str(exc.status))
            self._count(turn, NO_USAGE, estimate_tokens(payload, 0), answered=False)
            yield adapter.error_event(f"the upstream model answered {exc.status}", "upstream_error")
            return
        if not exchange.content_type.startswith(adapter.framing.content_type):
            exchange.close()
            self._count(turn, NO_USAGE, estimate_tokens(payload, 0))
            turn.record.upstream_failed(TurnReason.BAD_UPSTREAM_RESPONSE)
            yield adapter.error_event(
                "the upstream model answered a stream request without a stream",
                "bad_upstream_response",
            )
            return
        yield from self._relay(turn, payload, exchange, reader)

    def _relay(
        self,
        turn: Turn,
        payload: dict[str, Any],
        exchange: Exchange,
        reader: StreamReader | None = None,
    ) -> Iterator[bytes]:
        """Relay one upstream stream to the agent: text passes as it arrives; the
        events of a tool-call proposal are held until the proposal is complete,
        then the task guard is asked once and the held events or the adapter's
        final message follow. The turn is counted when its usage comes, by an
        estimate when the stream ends before (it is never free); a stream that
        breaks ends with an error event the agent's client understands."""
        adapter = turn.adapter
        reader = reader or adapter.stream_reader(turn.body)
        held: list[Held] = []
        chars = 0
        try:
            for frame in _then_end(exchange.frames(adapter.framing)):
                events = [reader.end()] if frame is None else reader.feed(frame)
                for event in events:
                    if isinstance(event, Passed):
                        chars += event.chars
                        yield event.raw
                    elif isinstance(event, Held):
                        chars += event.chars
                        held.append(event)
                    elif isinstance(event, ErrorEvent):
                        self._count(turn, NO_USAGE, estimate_tokens(payload, chars))
                        turn.record.upstream_failed(TurnReason.ERROR_EVENT)
                        yield event.raw
                        return
                    elif isinstance(event, Final):
                        estimate = estimate_tokens(payload, chars)
                        denied, again = self._decide_counted(
                            turn, event.proposals, event.usage, estimate
                        )
                        if again is not None:
                            nxt, denied, forward = self._again(turn, again)
                            if nxt is not None:
                                exchange.close()
                                yield from self._follow(nxt, forward, reader.follow_on(forward))
                                return
                        yield from reader.finish(held, denied, self._stamp())
                        return
        except StreamBroken as cut:
            self._count(turn, NO_USAGE, estimate_tokens(payload, chars))
            turn.record.upstream_failed(cut.code)
            yield adapter.error_event(str(cut), cut.code)
        except StoreUnavailable:  # deciding the proposal: nothing of it was relayed
            self._count(turn, NO_USAGE, estimate_tokens(payload, chars))
            turn.record.upstream_failed(TurnReason.STORE_UNAVAILABLE)
            yield adapter.error_event(
                "the gate could not decide this turn: its store is unavailable; try again",
                str(TurnReason.STORE_UNAVAILABLE),
            )
        except Exception as exc:  # never a stream that just stops: the client sees an error
            log.error("model gate relay failed: %s", type(exc).__name__)
            self._count(turn, NO_USAGE, estimate_tokens(payload, chars))
            turn.record.upstream_failed(TurnReason.GATE_ERROR)
            yield adapter.error_event(
                "the gate failed while relaying this turn", str(TurnReason.GATE_ERROR)
            )
        finally:
            exchange.close()
            # the agent went away mid-stream: never free
            self._count(turn, NO_USAGE, estimate_tokens(payload, chars))


def _then_end(frames: Iterator[Frame]) -> Iterator[Frame | None]:
    """The frames, then None where the upstream ended the stream."""
    yield from frames
    yield None

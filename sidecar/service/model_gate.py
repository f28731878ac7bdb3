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
   runs on it);
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
   the final message instead. Whatever fails once a stream has begun (the
   store included), the stream ends with an error event in the API's shape.

Prompts and completions are never logged or stored.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from sidecar.auth import Principal
from sidecar.config import ModelGateConfig, Settings
from sidecar.core import cost
from sidecar.core.tasks import Task, TurnDecision, TurnReason
from sidecar.errors import (
    MalformedRequest,
    NotFound,
    StoreUnavailable,
    UpstreamError,
)
from sidecar.gate.lines import TaskLines, task_lines
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
    Usage,
    WireAdapter,
    estimate_tokens,
)
from sidecar.outbound.upstream import Exchange, Upstream
from sidecar.service.gate_calls import GateCalls
from sidecar.service.gate_money import GateMoney
from sidecar.service.messages import WRAP_UP_MESSAGE, final_message
from sidecar.service.task_inputs import CreateInput
from sidecar.service.tasks import TaskService

log = logging.getLogger(__name__)


@dataclass
class TurnRecord:
    """How a turn was decided, for the decision log (filled in as a stream ends).

    :ivar api: the adapter's name (``chat``, ``responses``).
    :ivar usage: ``reported`` (the upstream said), ``estimated`` (it did not:
        a cut stream), or ``none`` (the upstream was not called).
    :ivar tool_calls: ``(tool, decision, reason)`` per proposed call.
    """

    decision: TurnDecision
    reason: str | None
    task_id: str | None
    api: str
    stream: bool
    execution: str | None = None
    tokens: int = 0
    usage: str = "none"
    tool_calls: list[tuple[str, str, str | None]] = field(default_factory=list)
    upstream_status: int | None = None
    cost: float | None = None
    cost_overshoot: float | None = None

    def upstream_failed(self, reason: str) -> None:
        """Record that the upstream failed, and how."""
        self.decision, self.reason = TurnDecision.UPSTREAM_ERROR, reason


@dataclass
class GateAnswer:
    """What the gate answers: a JSON body, or a stream of bytes in the API's framing."""

    record: TurnRecord
    body: Any = None
    events: Iterator[bytes] | None = None


@dataclass
class _Turn:
    """One request being served."""

    adapter: WireAdapter
    principal: Principal
    body: dict[str, Any]
    model: str
    stream: bool
    record: TurnRecord
    inbound: Inbound | None = None
    ns: str | None = None
    task_id: str | None = None
    price: cost.Price | None = None
    reserved: float = 0.0
    counted: bool = False


class ModelGate:
    """Admits, forwards and counts model turns and the tool calls they propose.

    :param session: the HTTP session to the upstream (tests inject theirs).
    :param environ: where the upstream's API key is read (``api_key_env``).
    :param clock: the injected wall clock (Unix seconds), for the answers'
        ``created`` times.
    """

    def __init__(
        self,
        config: ModelGateConfig,
        tasks: TaskService,
        session: requests.Session,
        environ: Mapping[str, str],
        clock: Callable[[], float],
        settings: Settings | None = None,
    ) -> None:
        self.config = config
        self.tasks = tasks
        self.clock = clock
        self.settings = settings or tasks.settings
        self.session = session
        self.environ = environ
        self._upstreams: dict[str, Upstream] = {}
        self.calls = GateCalls(tasks, self.settings)
        self.money = GateMoney(config, tasks)

    def upstream(self, adapter: WireAdapter) -> Upstream:
        """The upstream of the adapter's API (``model_gate.upstreams.<api>``), made
        on first use; one with no URL when the API has none (it raises
        :class:`~sidecar.errors.GateNotConfigured` when used)."""
        api = adapter.api
        found = self._upstreams.get(api.name)
        if found is None:
            entry = self.config.upstream(api.name)
            key = None
            if entry is not None and entry.api_key_env:
                key = self.environ.get(entry.api_key_env) or None
            setting = f"model_gate.upstreams.{api.name}.url"
            if api.name == "openai":
                setting = f"model_gate.upstream_url (or {setting})"
            found = Upstream(
                self.session,
                entry.url if entry else None,
                key,
                self.config.timeout_s,
                self.config.max_answer_bytes,
                api=api,
                setting=setting,
            )
            self._upstreams[api.name] = found
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

    def _find_task(self, turn: _Turn, lines: TaskLines) -> Task | None:
        """The task the lines name (created by key when new), or None when untracked.

        :raises MalformedRequest: no task named and untracked requests are not allowed.
        :raises NotFound: the ``loopstop-task`` line names no task.
        """
        if lines.task_id is not None:
            ns = self.tasks.namespace_of(lines.task_id)
            if ns is None:
                raise NotFound(f"no task {lines.task_id!r}")
            turn.ns, turn.task_id = ns, lines.task_id
            return None  # read only when needed (tool outputs to record)
        if lines.task_key is not None:
            ns = "p"
            task = self._by_key(turn.principal, ns, lines)
            turn.ns, turn.task_id = ns, task.task_id
            return task
        if not self.config.allow_untracked:
            raise MalformedRequest(
                "no 'loopstop-task: <task_id>' or 'loopstop-task-key: <key>' line in "
                f"{turn.adapter.system_where}: add one to the AI Agent's System Message "
                "(or set model_gate.allow_untracked)",
                errors=[{"loc": ["body", "system", "loopstop-task"], "msg": "missing"}],
            )
        return None

    def _by_key(self, principal: Principal, ns: str, lines: TaskLines) -> Task:
        """Continue the task made under the key, or create it as ``POST /v1/tasks`` does.

        A task found by key is continued in its current run: every model turn
        of one agent run names the same key, and starting a new run on each
        would forget its identical calls.
        """
        assert lines.task_key is not None
        found = self.tasks.by_key(principal, ns, lines.workflow, lines.task_key)
        if found is not None:
            return found
        task, _ = self.tasks.create(
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

    def _admit_calls(self, turn: _Turn, calls: list[Proposal]) -> str | None:
        """The task guard's word on a proposal: None when every call may reach
        n8n, else the final text to answer instead (:mod:`sidecar.service.gate_calls`)."""
        if turn.ns is None or turn.task_id is None:
            return None
        offered = turn.adapter.offered_tools(turn.body)
        done = self.calls.admit(turn.principal, turn.ns, turn.task_id, calls, offered)
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
        turn = _Turn(adapter, principal, body, model, stream, record, inbound)
        task = self._find_task(turn, lines)
        record.task_id = turn.task_id
        if turn.task_id is None or turn.ns is None:
            return self._forward(turn, body)
        outputs = adapter.tool_outputs(body)
        self.calls.record_outputs(principal, turn.ns, turn.task_id, outputs, task)
        held = self.money.reserve(adapter, principal, (turn.ns, turn.task_id), body, model, task)
        body = turn.body = held.body
        turn.price, reserve = held.price, held.amount
        task, outcome = self.tasks.model_call(
            principal,
            turn.ns,
            turn.task_id,
            None,
            reserve_cost=reserve,
            execution_id=lines.execution,
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

    def _refusal(self, turn: _Turn, text: str) -> GateAnswer:
        """A final message in the caller's format and mode (the upstream is not called)."""
        adapter, stamp = turn.adapter, self._stamp()
        if turn.stream:
            events = adapter.final_stream(text, turn.model, stamp, turn.body)
            return GateAnswer(turn.record, events=iter(events))
        return GateAnswer(turn.record, body=adapter.final_answer(text, turn.model, stamp))

    def _count(self, turn: _Turn, usage: Usage, estimate: int, *, answered: bool = True) -> None:
        """Count a turn once, when it is over: its tokens (the reported usage,
        else ``estimate``) and, for a priced model, settle its reservation with
        what it cost (:func:`sidecar.core.cost.settled_cost`). A settle the store
        refuses is retried, then kept for later (:class:`GateMoney`)."""
        if turn.counted:
            return
        turn.counted = True
        tokens = estimate if usage.tokens is None else usage.tokens
        turn.record.tokens = tokens
        turn.record.usage = "estimated" if usage.tokens is None else "reported"
        if turn.ns is None or turn.task_id is None:
            return
        principal, ns, task_id = turn.principal, turn.ns, turn.task_id
        if turn.price is None:
            if tokens:
                self.money.settle(lambda: self.tasks.record_tokens(principal, ns, task_id, tokens))
            return
        spent = cost.settled_cost(turn.price, turn.reserved, usage.split, answered=answered)
        turn.record.cost = spent
        reserved = turn.reserved
        task = self.money.settle(
            lambda: self.tasks.settle_model_call(principal, ns, task_id, reserved, spent, tokens)
        )
        over = None if task is None or task.envelope is None else task.envelope.used
        if over is not None and "cost_overshoot" in over:
            turn.record.cost_overshoot = float(over["cost_overshoot"])

    def _bad_upstream(self, turn: _Turn, message: str) -> UpstreamError:
        turn.record.upstream_failed(TurnReason.BAD_UPSTREAM_RESPONSE)
        exc = UpstreamError(502, turn.adapter.error_body(message, "bad_upstream_response"))
        exc.record = turn.record
        return exc

    def _forward(self, turn: _Turn, body: dict[str, Any]) -> GateAnswer:
        adapter = turn.adapter
        payload = adapter.forward_payload(body, turn.model)
        try:
            exchange = self.upstream(adapter).post(adapter, payload, turn.stream, turn.inbound)
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
        self._count(turn, answer.usage, estimate_tokens(payload, len(content)))
        denied = self._admit_calls(turn, adapter.number_calls(turn.body, answer.proposals))
        if denied is None:
            return GateAnswer(turn.record, body=parsed)
        return GateAnswer(
            turn.record, body=adapter.replace_with_text(parsed, denied, self._stamp())
        )

    def _relay(self, turn: _Turn, payload: dict[str, Any], exchange: Exchange) -> Iterator[bytes]:
        """Relay one upstream stream to the agent: text passes as it arrives; the
        events of a tool-call proposal are held until the proposal is complete,
        then the task guard is asked once and the held events or the adapter's
        final message follow. The turn is counted when its usage comes, by an
        estimate when the stream ends before (it is never free); a stream that
        breaks ends with an error event the agent's client understands."""
        adapter = turn.adapter
        reader = adapter.stream_reader(turn.body)
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
                        self._count(turn, event.usage, estimate_tokens(payload, chars))
                        proposals = adapter.number_calls(turn.body, event.proposals)
                        denied = self._admit_calls(turn, proposals)
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

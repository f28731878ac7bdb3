"""``/v1/openai``: the model gate, a model endpoint in front of the real model (DESIGN §5).

Point the n8n OpenAI credential's Base URL at ``<sidecar>/v1/openai`` and use
a loopstop token as its API key; put ``loopstop-task: <task_id>`` (or
``loopstop-task-key: <key>``) in the AI Agent's System Message. One route
table maps each path to its wire adapter (:mod:`sidecar.gate.wire`); a
stream is a generator response, written out event by event by gunicorn's
sync and gthread workers alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from flask import Blueprint, Response, g, has_request_context, jsonify, stream_with_context

from sidecar import metrics
from sidecar.api.body import read_json_object
from sidecar.api.decisions import log_decision
from sidecar.core.tasks import TurnDecision
from sidecar.errors import UpstreamError
from sidecar.gate.wire import OPENAI_CHAT, OPENAI_RESPONSES, WireAdapter
from sidecar.runtime import runtime
from sidecar.service.model_gate import GateAnswer, TurnRecord

bp = Blueprint("model_gate", __name__, url_prefix="/v1/openai")

#: ``POST`` path -> (endpoint, the adapter of its wire format).
TURNS: dict[str, tuple[str, WireAdapter]] = {
    "/chat/completions": ("chat_completions", OPENAI_CHAT),
    "/responses": ("responses", OPENAI_RESPONSES),
}
#: ``GET`` path -> (endpoint, the adapter that lists the upstream's models).
LISTS: dict[str, tuple[str, WireAdapter]] = {
    "/models": ("models", OPENAI_CHAT),
}


def _log(record: TurnRecord) -> None:
    if record.task_id is not None:  # a tracked turn: refused, or admitted whatever followed
        deny = record.decision == TurnDecision.DENY
        metrics.MODEL_TURNS.labels(str(TurnDecision.DENY if deny else TurnDecision.ADMIT)).inc()
    if record.tokens:
        metrics.MODEL_TOKENS.inc(record.tokens)
    log_decision(
        "model_gate",
        record.decision,
        record.reason,
        task_id=record.task_id,
        api=record.api,
        stream=record.stream,
        tokens=record.tokens,
        usage=record.usage,
        cost=record.cost,
        cost_overshoot=record.cost_overshoot,
        execution_id=record.execution,
        upstream_status=record.upstream_status,
        tool_calls=[{"tool": t, "decision": d, "reason": r} for t, d, r in record.tool_calls]
        or None,
    )


def _answer(answer: GateAnswer, adapter: WireAdapter) -> Response:
    if answer.events is None:
        _log(answer.record)
        return jsonify(answer.body)
    events = answer.events

    def relay() -> Iterator[bytes]:
        try:
            yield from events
        finally:
            if has_request_context():  # a stream dropped unread is closed by the collector
                _log(answer.record)

    return Response(
        stream_with_context(relay()),
        mimetype=adapter.framing.content_type,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _turn_view(adapter: WireAdapter) -> Callable[..., Response]:
    def view(**route: str) -> Response:
        body = read_json_object()
        try:
            answer = runtime().model_gate.turn(adapter, g.principal, body, route)
        except UpstreamError as exc:
            if isinstance(exc.record, TurnRecord):
                _log(exc.record)
            raise
        return _answer(answer, adapter)

    return view


def _list_view(adapter: WireAdapter) -> Callable[..., Response]:
    def view(**route: str) -> Response:
        return jsonify(runtime().model_gate.models(adapter))

    return view


for _path, (_endpoint, _adapter) in TURNS.items():
    bp.add_url_rule(_path, _endpoint, _turn_view(_adapter), methods=["POST"])
for _path, (_endpoint, _adapter) in LISTS.items():
    bp.add_url_rule(_path, _endpoint, _list_view(_adapter), methods=["GET"])

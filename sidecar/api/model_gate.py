"""``/v1/openai``: the model gate, an OpenAI-compatible endpoint (DESIGN §5).

Point the n8n OpenAI credential's Base URL at ``<sidecar>/v1/openai`` and use
a loopstop token as its API key; put ``loopstop-task: <task_id>`` (or
``loopstop-task-key: <key>``) in the AI Agent's System Message. Both the
Responses API and Chat Completions are served, streamed or not; a stream is
a generator response, written out event by event by gunicorn's sync and
gthread workers alike.
"""

from __future__ import annotations

from collections.abc import Iterator

from flask import Blueprint, Response, g, has_request_context, jsonify, stream_with_context

from sidecar import metrics
from sidecar.api.body import read_json_object
from sidecar.api.decisions import log_decision
from sidecar.core.tasks import TurnDecision
from sidecar.runtime import runtime
from sidecar.service.model_gate import Api, GateAnswer, TurnRecord, UpstreamError

bp = Blueprint("model_gate", __name__, url_prefix="/v1/openai")


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
        api=str(record.api),
        stream=record.stream,
        tokens=record.tokens,
        usage=record.usage,
        cost=record.cost,
        execution_id=record.execution,
        upstream_status=record.upstream_status,
        tool_calls=[{"tool": t, "decision": d, "reason": r} for t, d, r in record.tool_calls]
        or None,
    )


def _answer(answer: GateAnswer) -> Response:
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
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _turn(api: Api) -> Response:
    body = read_json_object()
    try:
        answer = runtime().model_gate.turn(api, g.principal, body)
    except UpstreamError as exc:
        if exc.record is not None:
            _log(exc.record)
        raise
    return _answer(answer)


@bp.post("/chat/completions")
def chat_completions() -> Response:
    return _turn(Api.CHAT)


@bp.post("/responses")
def responses() -> Response:
    return _turn(Api.RESPONSES)


@bp.get("/models")
def models() -> Response:
    return jsonify(runtime().model_gate.models())

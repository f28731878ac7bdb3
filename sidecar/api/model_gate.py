"""``/v1/openai``: the model gate, an OpenAI-compatible endpoint (DESIGN §5).

Point the n8n OpenAI credential's Base URL at ``<sidecar>/v1/openai`` and use
a loopstop token as its API key; put ``loopstop-task: <task_id>`` in the AI
Agent's System Message.
"""

from __future__ import annotations

from flask import Blueprint, Response, g, jsonify

from sidecar import metrics
from sidecar.api.body import read_json_object
from sidecar.api.decisions import log_decision
from sidecar.runtime import runtime

bp = Blueprint("model_gate", __name__, url_prefix="/v1/openai")


@bp.post("/chat/completions")
def chat_completions() -> Response:
    body = read_json_object()
    answer = runtime().model_gate.chat(g.principal, body)
    if answer.decision in ("admit", "deny"):
        metrics.MODEL_TURNS.labels(answer.decision).inc()
    if answer.tokens:
        metrics.MODEL_TOKENS.inc(answer.tokens)
    log_decision(
        "model_gate", answer.decision, answer.reason, task_id=answer.task_id, tokens=answer.tokens
    )
    return jsonify(answer.completion)


@bp.get("/models")
def models() -> Response:
    return jsonify(runtime().model_gate.models())

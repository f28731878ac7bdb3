"""``/v1/<api>``: the model gate, a model endpoint in front of the real model (DESIGN §5).

Point the n8n chat model credential's Base URL at ``<sidecar>/v1/<api>``
(``openai``, ``anthropic``, ...) and use a loopstop token as its API key;
put ``loopstop-task: <task_id>`` (or ``loopstop-task-key: <key>``) in the
AI Agent's System Message. One route table (:data:`ROUTES`) maps each
API's prefix and path to its wire adapter (:mod:`sidecar.gate.wire`); the
path below the prefix and the query are forwarded as they came; a
stream is a generator response, written out event by event by gunicorn's
sync and gthread workers alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from flask import (
    Blueprint,
    Response,
    current_app,
    g,
    has_request_context,
    jsonify,
    request,
    stream_with_context,
)

from sidecar.api.body import read_json_object, read_raw_body
from sidecar.api.decisions import Scope, record_decision
from sidecar.api.hot import HotScope, HotTurn, lower_headers
from sidecar.core.tasks import TurnDecision
from sidecar.errors import LoopstopError, UpstreamError
from sidecar.gate.wire import (
    ANTHROPIC_MESSAGES,
    AZURE_CHAT,
    AZURE_RESPONSES,
    GEMINI_GENERATE,
    GEMINI_STREAM,
    OLLAMA,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    WireAdapter,
)
from sidecar.gate.wire.base import BEARER, Inbound, TokenFrom
from sidecar.runtime import runtime
from sidecar.service.gate_turns import GateAnswer, TurnRecord

bp = Blueprint("model_gate", __name__)


@dataclass(frozen=True)
class Route:
    """One route of the gate, below its API's prefix: a turn (``POST``) or the
    model list (``GET``, n8n's credential test and model picker)."""

    method: str
    path: str
    endpoint: str
    adapter: WireAdapter


#: Each API's prefix (``/v1/<api name>``) -> its routes. Every adapter of a
#: prefix belongs to the same API (its upstream, key header and token headers).
ROUTES: dict[str, tuple[Route, ...]] = {
    "/v1/openai": (
        Route("POST", "/chat/completions", "chat_completions", OPENAI_CHAT),
        Route("POST", "/responses", "responses", OPENAI_RESPONSES),
        Route("GET", "/models", "models", OPENAI_CHAT),
    ),
    "/v1/anthropic": (
        Route("POST", "/v1/messages", "messages", ANTHROPIC_MESSAGES),
        Route("GET", "/v1/models", "models", ANTHROPIC_MESSAGES),
    ),
    # n8n's Google Gemini Chat Model: its Host is <sidecar>/v1/gemini.
    "/v1/gemini": (
        Route("POST", GEMINI_GENERATE.path, "generate_content", GEMINI_GENERATE),
        Route("POST", GEMINI_STREAM.path, "stream_generate_content", GEMINI_STREAM),
        Route("GET", "/<any(v1beta, v1):version>/models", "models", GEMINI_GENERATE),
    ),
    "/v1/ollama": (
        Route("POST", "/api/chat", "chat", OLLAMA),
        Route("GET", "/api/tags", "tags", OLLAMA),
    ),
    # AI Foundry: no deployment in the path.
    "/v1/azure": (
        Route("POST", "/openai/deployments/<deployment>/chat/completions", "chat", AZURE_CHAT),
        Route("POST", "/openai/deployments/<deployment>/responses", "responses", AZURE_RESPONSES),
        Route("POST", "/chat/completions", "foundry_chat", AZURE_CHAT),
        Route("POST", "/responses", "foundry_responses", AZURE_RESPONSES),
    ),
}


def _prefix_of(path: str) -> str | None:
    for prefix in ROUTES:
        if path == prefix or path.startswith(prefix + "/"):
            return prefix
    return None


def token_sources(path: str) -> tuple[TokenFrom, ...]:
    """Where a request to ``path`` carries its loopstop token: its API's client's
    key header(s) under a gate prefix, ``Authorization: Bearer`` elsewhere."""
    prefix = _prefix_of(path)
    return ROUTES[prefix][0].adapter.api.token_from if prefix is not None else (BEARER,)


def _inbound(body: bool = False) -> Inbound:
    """The request's path below its prefix (a doubled slash after the prefix made
    one: a base URL's trailing slash), its raw query and its headers; with
    ``body``, the body's bytes as read (:func:`read_json_object` read them)."""
    prefix = _prefix_of(request.path) or ""
    raw = read_raw_body(current_app.config["LOOPSTOP_MAX_BODY_BYTES"]) if body else b""
    return Inbound(
        "/" + request.path[len(prefix) :].lstrip("/"),
        request.query_string.decode("utf-8", "replace"),
        lower_headers(request.environ),
        raw if raw.strip() else None,  # an empty body read as {} is sent as {}
    )


def _log(scope: Scope, record: TurnRecord) -> None:
    metrics = scope.runtime.metrics
    if record.task_id is not None:  # a tracked turn: refused, or admitted whatever followed
        deny = record.decision == TurnDecision.DENY
        metrics.model_turns.labels(str(TurnDecision.DENY if deny else TurnDecision.ADMIT)).inc()
    if record.tokens:
        metrics.model_tokens.inc(record.tokens)
    record_decision(
        scope,
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
        tool_calls=[
            {"tool": t, "decision": d, "reason": r, **({"operation_id": o} if o else {})}
            for t, d, r, o in record.tool_calls
        ]
        or None,
        gate_answered=record.answered or None,
        upstream_turns=record.turns if record.turns > 1 else None,
    )


def turn_answer(
    scope: Scope,
    adapter: WireAdapter,
    body: dict[str, Any],
    route: Mapping[str, str],
    inbound: Inbound,
) -> GateAnswer:
    """Serve one turn (:meth:`~sidecar.service.model_gate.ModelGate.turn`): the
    gate's answer; a turn that failed upstream is logged before its error
    goes on. The Flask view and the hot path (:data:`HOT`) both call it.

    :raises LoopstopError: as ``ModelGate.turn`` raises it.
    """
    try:
        return scope.runtime.model_gate.turn(adapter, scope.principal, body, route, inbound)
    except UpstreamError as exc:
        if isinstance(exc.record, TurnRecord):
            _log(scope, exc.record)
        raise


def _answer(answer: GateAnswer, adapter: WireAdapter) -> Response:
    scope = g._get_current_object()
    if answer.events is None:
        _log(scope, answer.record)
        if answer.raw is not None:
            return Response(answer.raw, mimetype="application/json")
        return jsonify(answer.body)
    events = answer.events

    def relay() -> Iterator[bytes]:
        try:
            yield from events
        finally:
            if has_request_context():  # a stream dropped unread is closed by the collector
                _log(scope, answer.record)

    return Response(
        stream_with_context(relay()),
        mimetype=adapter.framing.content_type,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _turn_view(adapter: WireAdapter) -> Callable[..., Response]:
    def view(**route: str) -> Response:
        body = read_json_object()
        answer = turn_answer(g._get_current_object(), adapter, body, route, _inbound(body=True))
        return _answer(answer, adapter)

    return view


def _hot_turn(adapter: WireAdapter, app_json: Callable[[Any], bytes]) -> Callable[..., Any]:
    def serve(scope: HotScope, body: dict[str, Any], inbound: Inbound) -> bytes | None:
        try:
            adapter.validate(body)
            if adapter.streaming(body):
                return None  # a stream is Flask's (its generator response)
        except LoopstopError:
            return None  # Flask refuses it, naming the field
        answer = turn_answer(scope, adapter, body, {}, inbound)
        _log(scope, answer.record)
        return answer.raw if answer.raw is not None else app_json(answer.body)

    return serve


def hot_turns(app_json: Callable[[Any], bytes]) -> list[HotTurn]:
    """The gate's turn routes the hot path serves (:mod:`sidecar.api.hot`): each
    API's routes with no path value, at their own path (not a base URL's doubled
    slash), for a request that asks for no stream; the answer is
    :func:`turn_answer`'s, its JSON written by ``app_json`` (the bytes Flask's
    ``jsonify`` writes) when the gate does not relay the upstream's own.
    """
    return [
        HotTurn(
            prefix + r.path,
            "/" + r.path.lstrip("/"),
            r.adapter.api.token_from,
            _hot_turn(r.adapter, app_json),
        )
        for prefix, routes in ROUTES.items()
        for r in routes
        if r.method == "POST"
        and "<" not in r.path
        and not any(source.query for source in r.adapter.api.token_from)
    ]


def _list_view(adapter: WireAdapter) -> Callable[..., Response]:
    def view(**route: str) -> Response:
        return jsonify(runtime().model_gate.models(adapter, _inbound()))

    return view


for _prefix, _routes in ROUTES.items():
    _api = _prefix.rsplit("/", 1)[-1]
    for _r in _routes:
        _view = _turn_view(_r.adapter) if _r.method == "POST" else _list_view(_r.adapter)
        bp.add_url_rule(_prefix + _r.path, f"{_api}_{_r.endpoint}", _view, methods=[_r.method])
        # A client joining a base URL that ends in "/" sends "<prefix>//<path>" (n8n's
        # Gemini and Azure nodes do): served as is, not redirected (a 308 a client
        # may not follow with its POST body).
        bp.add_url_rule(
            _prefix + "/" + _r.path,
            f"{_api}_{_r.endpoint}_slash",
            _view,
            methods=[_r.method],
            merge_slashes=False,
        )

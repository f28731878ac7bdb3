"""Liveness, readiness, identity and the OpenAPI document."""

from __future__ import annotations

import hashlib
import hmac

from flask import Blueprint, Response, current_app, g, jsonify, request

from sidecar.api import openapi
from sidecar.api.decisions import auth_failure
from sidecar.api.models import Health, Ready, WhoAmI
from sidecar.api.openapi import route
from sidecar.errors import Unauthenticated
from sidecar.runtime import runtime

public = Blueprint("meta", __name__)
v1 = Blueprint("whoami", __name__, url_prefix="/v1")


@route(
    public,
    "/healthz",
    "GET",
    summary="Liveness: the process answers.",
    tag="meta",
    response=Health,
    errors=(),
    auth=False,
)
def healthz() -> Response:
    return jsonify(Health(status="ok").model_dump())


@route(
    public,
    "/readyz",
    "GET",
    summary="Readiness: the store answers (503 when not); n8n's API, a warning only.",
    tag="meta",
    response=Ready,
    errors=(503,),
    auth=False,
)
def readyz() -> Response:
    rt = runtime()
    facts = rt.overview.ping()
    # Whether n8n's API answers: a warning, never "not ready" (decisions do not need it).
    return jsonify(Ready(status="ready", store=facts, n8n=rt.stops.ready()).model_dump())


@public.get("/metrics")
def metrics_route() -> Response:
    """Prometheus exposition; bearer-protected when ``http.metrics_token_env`` is set."""
    rt = runtime()
    env_name = rt.settings.http.metrics_token_env
    if env_name:
        expected = rt.environ.get(env_name, "")
        given = request.headers.get("Authorization", "").partition(" ")[2].strip()
        # Over digests: the comparison takes the same time whatever the length or
        # prefix of what was sent.
        same = hmac.compare_digest(
            hashlib.sha256(expected.encode()).digest(), hashlib.sha256(given.encode()).digest()
        )
        if not expected or not same:
            exc = Unauthenticated("/metrics needs its bearer token")
            auth_failure(exc, request.path, request.remote_addr, None)
            raise exc

    return Response(
        rt.metrics.exposition(
            rt.overview.unknown_operations,
            rt.overview.open_operations,
            rt.overview.running_long_count,
        ),
        content_type=rt.metrics.content_type,
    )


@public.get("/openapi.json")
def openapi_json() -> Response:
    # Built once per app: the document is fixed once the routes are registered, and
    # building it costs tens of milliseconds of CPU, which an unauthenticated
    # client asking for it again and again would otherwise spend on every request.
    cached: bytes | None = current_app.extensions.get("loopstop.openapi")
    if cached is None:
        cached = jsonify(openapi.document()).get_data()
        current_app.extensions["loopstop.openapi"] = cached
    return Response(cached, mimetype="application/json")


@route(
    v1,
    "/whoami",
    "GET",
    summary="The token's name and scope (n8n credential test).",
    tag="meta",
    response=WhoAmI,
    errors=(401, 403),
)
def whoami() -> Response:
    p = g.principal
    view = WhoAmI(
        name=p.name,
        workflows=["*"] if p.workflows is None else sorted(p.workflows),
        admin=p.admin,
        authenticated=p.authenticated,
    )
    return jsonify(view.model_dump())

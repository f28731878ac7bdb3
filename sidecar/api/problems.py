"""RFC 9457 problem details: the one renderer of every error."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from sidecar.errors import (
    PROBLEM_TYPE_PREFIX,
    LoopstopError,
    PayloadTooLarge,
    StoreUnavailable,
    UpstreamError,
)

log = logging.getLogger("loopstop")

PROBLEM_JSON = "application/problem+json"

_SLUGS = {
    400: "malformed-request",
    404: "not-found",
    405: "method-not-allowed",
    413: "payload-too-large",
    415: "unsupported-media-type",
}


def problem(status: int, slug: str, title: str, detail: str, **extra: Any) -> Response:
    """A problem+json response (RFC 9457 §3)."""
    body = {
        "type": PROBLEM_TYPE_PREFIX + slug,
        "title": title,
        "status": status,
        "detail": detail,
        **extra,
    }
    resp = jsonify(body)
    resp.status_code = status
    resp.mimetype = PROBLEM_JSON
    return resp


def register(app: Flask, render_extra: Any, on_store_error: Callable[[], None]) -> None:
    """Install the error handlers.

    :param render_extra: turns domain objects carried by an error (a
        record on a 409) into JSON (``(name, value, request) -> value``).
    :param on_store_error: called once per request answered 503 because the
        store failed (the app's ``store_errors`` counter).
    """

    @app.errorhandler(UpstreamError)
    def _upstream(exc: UpstreamError) -> Response:
        # The upstream model's error, relayed in the API's own shape (made by its adapter).
        resp = jsonify(exc.body)
        resp.status_code = exc.status
        return resp

    @app.errorhandler(LoopstopError)
    def _domain(exc: LoopstopError) -> Response:
        if isinstance(exc, StoreUnavailable):
            log.warning("store unavailable: %s", exc.detail)
            on_store_error()
        extra = {k: render_extra(k, v) for k, v in exc.extra.items()}
        resp = problem(exc.status, exc.slug, exc.title, exc.detail, **extra)
        if exc.status == 401:
            resp.headers["WWW-Authenticate"] = 'Bearer realm="loopstop"'
        if exc.status == 503:
            resp.headers["Retry-After"] = "1"
        return resp

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> Response:
        status = exc.code or 500
        if status == 413:
            exc413 = PayloadTooLarge("the body exceeds the configured limit")
            return problem(413, exc413.slug, exc413.title, exc413.detail)
        slug = _SLUGS.get(status, f"http-{status}")
        detail = {
            404: f"no route {request.path}",
            405: f"{request.method} is not allowed on {request.path}",
        }.get(status, exc.description or exc.name)
        resp = problem(status, slug, exc.name.capitalize(), detail)
        if status == 405 and exc.get_response().headers.get("Allow"):
            resp.headers["Allow"] = exc.get_response().headers["Allow"]
        return resp

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        log.exception("unhandled error")
        return problem(
            500,
            "internal-error",
            "Internal error",
            "the server failed to handle the request; see the server log",
        )

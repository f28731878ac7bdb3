"""The decision routes n8n calls on every item, served without Flask's
per-request machinery.

A begin, a commit, an activation, a tool call and its result are what a
flow sends once per item; each is a few hundred microseconds of the
sidecar's own work, and Flask's request and application contexts, URL
matching, hooks, signals and response object were a third of it.
:class:`HotRoutes` sits in front of the Flask app (its ``wsgi_app``) and
serves a request to one of these routes itself when the request is plain:
``POST`` with a ``Content-Length`` JSON body within the limit, no
``Origin``, no chunked body, path values that match their patterns, and a
caller that authenticates (a token, or, with none configured, a loopback
caller on a loopback ``Host``). It then runs the same *answer function*
the Flask view runs (``begin_answer``, ``activation_answer``...), with
a :class:`HotScope` for Flask's ``g``, and answers with the same status,
headers and JSON text.

Everything else goes to Flask untouched, with the body read so far handed
back: another method or path, a caller refused, a body that fails to parse
or validate. So every refusal is made, logged and counted by the one Flask
path, and the hot path only ever answers what Flask would answer 200. An
error raised by the decision itself (a conflict, a store failure) is
rendered by the app's own error handlers and ``after_request`` hooks, in a
Flask request context made for it.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flask import Flask, g
from pydantic import BaseModel, ValidationError

from sidecar.api.answer import answer_text
from sidecar.api.body import decode_json_object, keep_body
from sidecar.api.decisions import request_id
from sidecar.api.openapi import REGISTRY
from sidecar.auth import Principal, bound_port, check_host, presented_token
from sidecar.errors import LoopstopError
from sidecar.gate.wire.base import BEARER, Inbound, TokenFrom

if TYPE_CHECKING:
    from sidecar.runtime import Runtime

_SEGMENT = re.compile(r"<(?:[a-z]+:)?([a-z_]+)>")

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


@dataclass(slots=True)
class HotScope:
    """What a decision knows of its request on the hot path (Flask's ``g`` on
    the other): :class:`sidecar.api.decisions.Scope`."""

    request_id: str
    started: float
    principal: Principal
    runtime: Runtime
    method: str = "POST"
    ns: str = "p"


@dataclass(frozen=True)
class HotRoute:
    """One route the hot path serves.

    :ivar endpoint: the Flask endpoint whose rule and path patterns it takes
        (``operations.begin``).
    :ivar body: the body's model, validated as the Flask view's ``parse_body``.
    :ivar answer: ``(scope, body, **path values) -> answer model``, the
        route's *answer function*, which the Flask view calls too.
    """

    endpoint: str
    body: type[BaseModel]
    answer: Callable[..., BaseModel]


@dataclass(frozen=True)
class HotTurn:
    """A model gate route the hot path serves (a path with no path value).

    :ivar path: the request's path (``/v1/openai/chat/completions``).
    :ivar below: the path below the API's prefix, forwarded (``/chat/completions``).
    :ivar sources: where its API's client sends the token (headers only).
    :ivar serve: ``(scope, body, inbound) -> answer bytes``, or None before
        doing anything when Flask must serve the request (a stream, a body
        the adapter refuses).
    """

    path: str
    below: str
    sources: tuple[TokenFrom, ...]
    serve: Callable[[HotScope, dict[str, Any], Inbound], bytes | None]


_ENTITY = {"CONTENT_TYPE": "content-type", "CONTENT_LENGTH": "content-length"}


def lower_headers(environ: Mapping[str, Any]) -> dict[str, str]:
    """The request's headers by lower-case name, as werkzeug reads them from the
    WSGI environ (``HTTP_X_API_KEY`` is ``x-api-key``; a blank content type or
    length is no header)."""
    out: dict[str, str] = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            if key not in ("HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"):
                out.setdefault(key[5:].replace("_", "-").lower(), value)
        elif key in _ENTITY and value:
            out.setdefault(_ENTITY[key], value)
    return out


@dataclass(frozen=True)
class _Bound:
    route: HotRoute
    path: re.Pattern[str]
    values: Mapping[str, re.Pattern[str]] = field(default_factory=dict)


class _Broken(io.RawIOBase):
    """A request body whose read failed: every read raises that failure again,
    so Flask answers the request as if it had read it first (not from the
    bytes that arrived before the connection broke)."""

    def __init__(self, failure: Exception) -> None:
        super().__init__()
        self._failure = failure

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        raise self._failure

    def read(self, size: int = -1) -> bytes:
        raise self._failure

    def readline(self, size: int | None = -1) -> bytes:
        raise self._failure


class HotRoutes:
    """A WSGI app: :class:`HotRoute` requests served directly, the rest by ``app``.

    :param app: the Flask app; its ``wsgi_app`` serves what this does not.
    :param routes: the routes to serve (their endpoints must be ``POST`` rules
        declared with :func:`sidecar.api.openapi.route`).
    :param runtime: the app's runtime.
    :raises KeyError: a route's endpoint has no rule or no document.
    :raises ValueError: a route answers another status than 200.
    """

    def __init__(
        self,
        app: Flask,
        routes: Iterable[HotRoute],
        runtime: Runtime,
        turns: Iterable[HotTurn] = (),
    ) -> None:
        self._app = app
        self._turns = {turn.path: turn for turn in turns}
        self._flask: WsgiApp = app.wsgi_app
        self._runtime = runtime
        self._tokens = runtime.tokens
        self._limit: int = app.config["LOOPSTOP_MAX_BODY_BYTES"]
        rules = {rule.endpoint: rule.rule for rule in app.url_map.iter_rules()}
        docs = {(doc.method, doc.path): doc for doc in REGISTRY}
        self._bound: list[_Bound] = []
        self._exact: dict[str, _Bound] = {}
        for route in routes:
            rule = rules[route.endpoint]
            doc = docs[("post", _SEGMENT.sub(r"{\1}", rule))]
            if doc.status != 200:
                raise ValueError(f"{route.endpoint} answers {doc.status}: the hot path answers 200")
            parts = _SEGMENT.split(rule)  # literal, name, literal, name, ..., literal
            pattern = "".join(
                re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)"
                for i, part in enumerate(parts)
            )
            values = {name: re.compile(p) for name, p in doc.path_params.items()}
            bound = _Bound(route, re.compile(pattern + r"\Z"), values)
            if len(parts) == 1:  # no path value: found by the path itself
                self._exact[rule] = bound
            else:
                self._bound.append(bound)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        started = time.perf_counter()
        if environ.get("REQUEST_METHOD") != "POST":
            return self._flask(environ, start_response)
        path = environ.get("PATH_INFO", "")
        turn = self._turns.get(path)
        if turn is not None:
            return self._turn(turn, environ, start_response, started)
        bound = self._exact.get(path)
        if bound is not None:
            values: dict[str, str] = {}
        else:
            for bound in self._bound:
                found = bound.path.match(path)
                if found is not None:
                    break
            else:
                return self._flask(environ, start_response)
            values = found.groupdict()
        checks = bound.values
        if not all(k in checks and checks[k].fullmatch(v) for k, v in values.items()):
            return self._flask(environ, start_response)  # Flask names the wrong value
        authorization = environ.get("HTTP_AUTHORIZATION")
        principal = self._plain(
            environ, {} if authorization is None else {"authorization": authorization}, (BEARER,)
        )
        if principal is None:
            return self._flask(environ, start_response)
        raw = self._body(environ)
        if raw is None:
            return self._flask(environ, start_response)
        route = bound.route
        try:
            body = route.body.model_validate(decode_json_object(raw))
        except (LoopstopError, ValidationError):
            return self._flask(environ, start_response)  # Flask refuses it, with the field
        return self._serve(
            environ,
            start_response,
            HotScope(request_id(environ), started, principal, self._runtime),
            lambda scope: answer_text(route.answer(scope, body, **values)).encode(),
        )

    def _turn(
        self,
        turn: HotTurn,
        environ: dict[str, Any],
        start_response: StartResponse,
        started: float,
    ) -> Iterable[bytes]:
        """A model gate turn (:class:`HotTurn`) when the request is plain and
        its serve function takes it; else Flask, with the body read so far."""
        headers = lower_headers(environ)
        principal = self._plain(environ, headers, turn.sources)
        if principal is None:
            return self._flask(environ, start_response)
        raw = self._body(environ)
        if raw is None:
            return self._flask(environ, start_response)
        try:
            body = decode_json_object(raw)
        except LoopstopError:
            return self._flask(environ, start_response)
        query = environ.get("QUERY_STRING", "").encode("latin-1").decode("utf-8", "replace")
        inbound = Inbound(turn.below, query, headers, raw)
        return self._serve(
            environ,
            start_response,
            HotScope(request_id(environ), started, principal, self._runtime),
            lambda scope: turn.serve(scope, body, inbound),
        )

    def _serve(
        self,
        environ: dict[str, Any],
        start_response: StartResponse,
        scope: HotScope,
        work: Callable[[HotScope], bytes | None],
    ) -> Iterable[bytes]:
        """The answer ``work`` makes in ``scope``: a 200 with its bytes; Flask's
        answer when it makes none (None); the app's error answer when it raises."""
        try:
            answer = work(scope)
        except Exception as exc:
            return self._failed(environ, start_response, scope, exc)
        if answer is None:
            return self._flask(environ, start_response)
        return self._ok(start_response, scope, answer)

    def _body(self, environ: dict[str, Any]) -> bytes | None:
        """The whole body (its length checked by :meth:`_plain`), kept for Flask
        (:func:`~sidecar.api.body.keep_body`); None when Flask must read it: the
        read failed or came short (the stream handed back says so), or it is blank."""
        length = int(environ["CONTENT_LENGTH"])
        try:
            raw: bytes = environ["wsgi.input"].read(length)
        except Exception as exc:  # a broken connection: Flask's read fails the same way
            environ["wsgi.input"] = _Broken(exc)
            return None
        environ["wsgi.input"] = io.BytesIO(raw)  # handed back, for Flask to read
        if len(raw) != length:  # the client went away mid-body: Flask's reader says so
            return None
        keep_body(environ, raw)  # Flask, handed the request, does not read it again
        return raw if raw.strip() else None

    @staticmethod
    def _ok(start_response: StartResponse, scope: HotScope, answer: bytes) -> list[bytes]:
        """A 200 JSON answer with the headers Flask's path gives it, in its order."""
        start_response(
            "200 OK",
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(answer))),
                ("X-Request-Id", scope.request_id),
                ("Cache-Control", "no-store"),
                ("X-Content-Type-Options", "nosniff"),
            ],
        )
        return [answer]

    def _plain(
        self,
        environ: Mapping[str, Any],
        headers: Mapping[str, str],
        sources: tuple[TokenFrom, ...],
    ) -> Principal | None:
        """The caller of a request the hot path may serve, None when Flask must:
        an ``Origin`` (its check), no JSON content type, a chunked body or one
        without a length within the limit, no token that authenticates.

        :param headers: the request's headers where ``sources`` read the token
            (by lower-case name).
        """
        if "HTTP_ORIGIN" in environ or "HTTP_TRANSFER_ENCODING" in environ:
            return None
        ctype: str = environ.get("CONTENT_TYPE", "")
        if ctype.partition(";")[0].lower() != "application/json":  # padded: Flask's to read
            return None
        length: str = environ.get("CONTENT_LENGTH", "")
        if not (
            length.isascii() and length.isdigit() and len(length) <= 12  # int() of it is cheap
        ) or not (0 < int(length) <= self._limit):
            return None
        tokens = self._tokens
        try:
            if tokens.open:  # loopback callers, on a loopback Host (app.py's _authenticate)
                check_host(
                    environ.get("HTTP_HOST"), environ["wsgi.url_scheme"], bound_port(environ)
                )
                return tokens.authenticate_token(None, environ.get("REMOTE_ADDR"))
            token = presented_token(headers, {}, sources)
            if token is None:
                return None
            return tokens.authenticate_token(token, environ.get("REMOTE_ADDR"), sources)
        except LoopstopError:
            return None

    def _failed(
        self,
        environ: dict[str, Any],
        start_response: StartResponse,
        scope: HotScope,
        exc: Exception,
    ) -> Iterable[bytes]:
        """Answer ``exc``, raised by a decision, as the Flask path does: the app's
        error handlers and ``after_request`` hooks, in a request context."""
        app = self._app
        with app.request_context(environ):
            for name in ("request_id", "started", "principal", "method", "runtime", "ns"):
                setattr(g, name, getattr(scope, name))
            try:
                response = app.finalize_request(app.handle_user_exception(exc))
            except Exception as failed:  # as Flask's wsgi_app: a handler failed
                response = app.handle_exception(failed)
            return response(environ, start_response)

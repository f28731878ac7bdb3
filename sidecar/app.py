"""The Flask application factory.

gunicorn runs ``"sidecar.app:create_app()"`` (``loopstop serve`` does this
for you); tests call ``create_app({...}, environ={...})`` with a temporary
store. Nothing is configured at import time.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import requests
from flask import Flask, Request, Response, g, request
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface

from sidecar.api import chains, checks, meta, model_gate, operations, problems, tasks, ui
from sidecar.api.body import current_request
from sidecar.api.decisions import auth_failure, label_values, request_id
from sidecar.api.hot import HotRoutes
from sidecar.api.models import OperationView
from sidecar.auth import TokenTable, bound_port, check_host, check_origin, presented_token
from sidecar.canonical import build_fingerprinter
from sidecar.config import Settings, load_settings
from sidecar.core.operations import Operation
from sidecar.errors import ConfigError, LoopstopError, UnsupportedMediaType
from sidecar.metrics import Metrics
from sidecar.outbound.check_runner import CheckRunner
from sidecar.outbound.upstream import upstream_pool
from sidecar.runtime import Runtime
from sidecar.service.chains import ChainService
from sidecar.service.check_service import CheckService
from sidecar.service.model_gate import ModelGate
from sidecar.service.operations import OperationService
from sidecar.service.overview import Overview
from sidecar.service.sessions import SessionRevocations
from sidecar.service.stops import StopService
from sidecar.service.tasks import TaskService
from sidecar.store import Store, StoreEvents, sqlite_path, store_from_url

log = logging.getLogger("loopstop")

SECRET_FILE_NAME = "loopstop.secret"
#: Set by ``loopstop serve`` for its workers: the store identity the master saw.
STORE_ID_ENV = "LOOPSTOP_STORE_ID_SEEN"


def secret_file_for(store_url: str) -> Path | None:
    """Where the generated secret lives: beside the SQLite database; None for Redis."""
    path = sqlite_path(store_url)
    return None if path is None else path.parent / SECRET_FILE_NAME


def _n8n_session() -> requests.Session:
    """The session n8n's API is called with (no proxy or netrc from the environment)."""
    s = requests.Session()
    s.trust_env = False
    return s


def create_app(
    config: Settings | Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] | None = None,
    store: Store | None = None,
    session: requests.Session | None = None,
    announce: bool = True,
) -> Flask:
    """Build the sidecar.

    :param config: validated :class:`Settings`, a mapping shaped like the
        YAML file, or None to read ``LOOPSTOP_CONFIG`` / ``./loopstop.yaml``.
    :param environ: environment for secrets, tokens and ``LOOPSTOP_STORE``
        (default ``os.environ``).
    :param clock: epoch seconds (default ``time.time``); tests inject one.
    :param store: an already open store (default: from ``settings.store``,
        reporting its round trips and conflicts to this app's metrics; a store
        given here reports to the callbacks it was built with).
    :param session: the HTTP session checks use (default: a new one); the model
        gate has its own connection pool.
    :param announce: log the unauthenticated-mode warning (``loopstop
        serve`` says it once in the master instead).
    :raises ConfigError: on any invalid setting, a missing secret for a
        shared store, or a store schema newer than this server.
    :raises StoreUnavailable: when the store cannot be opened.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    settings = config if isinstance(config, Settings) else load_settings(config, env)
    try:
        fingerprinter = build_fingerprinter(env, secret_file_for(settings.store))
    except (ValueError, OSError) as exc:
        raise ConfigError([("LOOPSTOP_SECRET", str(exc))]) from exc
    # This app's counters, on a registry of its own (or, under `loopstop serve`,
    # written for the multiprocess collector): nothing is counted at import.
    metrics = Metrics(label_values())
    store = store or store_from_url(
        settings.store,
        timeout_s=settings.store_timeout_s,
        wait_replicas=settings.redis.wait_replicas,
        policy_check_s=settings.redis.policy_check_s,
        events=StoreEvents(
            round_trip=metrics.store_round_trips.inc, conflict=metrics.store_conflicts.inc
        ),
    )
    # A worker started by `loopstop serve` knows the identity its master saw:
    # an emptied or replaced store is then refused, not initialised afresh.
    store.ensure_schema(expected_identity=env.get(STORE_ID_ENV) or None)
    tokens = TokenTable(settings.tokens, env)
    clock = clock or time.time
    session = session or requests.Session()
    session.trust_env = False  # no proxy or netrc from the environment for checks
    check_runner = CheckRunner(
        settings.checks,
        session,
        env,
        concurrency=settings.http.checks_concurrency,
        wait_s=settings.http.checks_wait_s,
    )
    ledger_policy = settings.operations.to_core()
    # One check service runs every check: the routes', the tasks' and the ledger's.
    check_service = CheckService(
        store, fingerprinter, check_runner, settings.tasks.retention_s, clock, ledger_policy
    )
    ops = OperationService(
        store,
        fingerprinter,
        ledger_policy,
        settings.operations.lease_s,
        clock,
        check_service,
    )
    task_service = TaskService(store, fingerprinter, settings, ops, check_service, clock, metrics)
    chain_service = ChainService(store, fingerprinter, settings.chains, clock)

    app = _App("sidecar")
    app.session_interface = _PageSessions()
    # The body limit is enforced by sidecar.api.body for Content-Length and
    # chunked bodies alike (werkzeug's own limit truncates chunked bodies).
    app.config["LOOPSTOP_MAX_BODY_BYTES"] = settings.http.max_body_bytes
    # The operator page's session: signed with a key derived from the secret,
    # so every worker and restart accepts it; it holds a token's name only.
    app.secret_key = fingerprinter.mac("loopstop-ui-session")
    app.config.update(
        SESSION_COOKIE_NAME="loopstop_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_SECURE=env.get("LOOPSTOP_UI_SECURE_COOKIE", "") == "1",
        PERMANENT_SESSION_LIFETIME=12 * 3600,
    )
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["loopstop"] = rt = Runtime(
        settings=settings,
        store=store,
        metrics=metrics,
        fingerprinter=fingerprinter,
        tokens=tokens,
        clock=clock,
        environ=env,
        operations=ops,
        chains=chain_service,
        tasks=task_service,
        checks=check_service,
        model_gate=ModelGate(settings.model_gate, task_service, upstream_pool(), env, clock),
        stops=StopService(
            store,
            chain_service,
            task_service,
            settings.n8n,
            env,
            _n8n_session(),
            clock,
            metrics,
            workflow_ttl_s=settings.operations.retention_s,
            task_ttl_s=settings.tasks.retention_s,
        ),
        overview=Overview(
            store,
            clock,
            longest_chain_s=chain_service.longest_chain_s,
            task_horizon_s=settings.tasks.retention_s + settings.limits.deadline_s,
            running_s=settings.outliers.running_s,
        ),
        sessions=SessionRevocations(store, fingerprinter, clock),
    )

    @app.after_request
    def _stamp(resp: Response) -> Response:
        headers = resp.headers
        # One pass over the names (each set or setdefault would scan them again).
        names = {name.lower() for name, _ in headers}  # (name, value) pairs
        request_id = g.get("request_id", "")
        if "x-request-id" in names:
            headers["X-Request-Id"] = request_id
        else:
            headers.add("X-Request-Id", request_id)
        if "cache-control" not in names:
            headers.add("Cache-Control", "no-store")
        if "x-content-type-options" not in names:
            headers.add("X-Content-Type-Options", "nosniff")
        if current_request().path.startswith("/ui"):
            # No page of another site may frame the operator page (clickjacking).
            headers["X-Frame-Options"] = "DENY"
            headers["Content-Security-Policy"] = UI_CSP
        return resp

    @app.before_request
    def _authenticate() -> None:
        """Stamp the request (its start, its id), then check its host, origin,
        content type and token (one hook: Flask runs each hook through a call
        of its own)."""
        scope = g._get_current_object()  # one proxy look-up, not one per attribute
        scope.started = time.perf_counter()
        req = current_request()
        scope.method = req.method
        scope.runtime = rt  # g is the decisions' scope (sidecar.api.decisions.Scope)
        # A request header is its WSGI environ entry (what werkzeug's headers read).
        environ = req.environ
        scope.request_id = request_id(environ)
        path = req.path
        api = path == "/v1" or path.startswith("/v1/")
        try:
            if tokens.open:
                # Without tokens, every route (/metrics, /readyz too) answers loopback
                # names only: a page on a foreign name resolving to 127.0.0.1 reads nothing.
                check_host(environ.get("HTTP_HOST"), req.scheme, bound_port(environ))
            if not api and not path.startswith("/ui"):
                return
            _refuse_web_pages(req, api)
            if api:
                # The gate's routes read the token where their API's client puts its key.
                sources = model_gate.token_sources(path)
                # The query string is parsed only for a source that reads it.
                query = req.args if any(s.query for s in sources) else _NO_QUERY
                scope.principal = tokens.authenticate_token(
                    # werkzeug's headers look a name up case-insensitively: no copy.
                    presented_token(cast("Mapping[str, str]", req.headers), query, sources),
                    req.remote_addr,
                    sources,
                )
        except LoopstopError as exc:
            if exc.status in (401, 403, 421):
                auth_failure(exc, path, req.remote_addr, None)
            raise

    app.register_blueprint(meta.public)
    app.register_blueprint(meta.v1)
    app.register_blueprint(operations.bp)
    app.register_blueprint(chains.bp)
    app.register_blueprint(tasks.bp)
    app.register_blueprint(checks.bp)
    app.register_blueprint(model_gate.bp)
    app.register_blueprint(ui.bp)
    problems.register(app, _render_extra, metrics.store_errors.inc)
    # The routes n8n calls on every item, and the gate's turns, skip Flask's
    # per-request work (sidecar.api.hot).
    app.wsgi_app = HotRoutes(  # type: ignore[method-assign]
        app,
        [*operations.HOT, *chains.HOT, *tasks.HOT],
        rt,
        model_gate.hot_turns(_jsonify_bytes(app)),
    )

    if tokens.open and announce:
        log.warning("no tokens configured: serving WITHOUT authentication, loopback callers only")
    return app


def _jsonify_bytes(app: Flask) -> Callable[[Any], bytes]:
    """The bytes ``jsonify`` answers ``body`` with, in ``app`` (its JSON provider's
    settings), with no app context needed."""

    def write(body: Any) -> bytes:
        return cast(Response, app.json.response(body)).get_data()

    return write


#: The operator page's Content Security Policy: its own inline styles, no
#: scripts, forms only to itself, never framed.
UI_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

_STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: The query of a request whose token sources read none (not parsed).
_NO_QUERY: Mapping[str, str] = {}


def _refuse_web_pages(req: Request, api: bool) -> None:
    """What no web page may do (DESIGN "HTTP conventions"): send a state-changing
    ``/v1`` request a form or a simple ``fetch`` can send (415), or act from
    another origin (403). (Without tokens, a foreign host name, DNS rebinding,
    was refused before this on every route: 421.)

    :raises ForeignOrigin, UnsupportedMediaType:
    """
    environ = req.environ  # a header is its environ entry, as werkzeug's headers read it
    check_origin(environ.get("HTTP_ORIGIN"), environ.get("HTTP_HOST"), req.scheme)
    if api and req.method in _STATE_CHANGING and req.routing_exception is None:
        mimetype = req.mimetype
        if mimetype != "application/json" and not (
            mimetype.startswith("application/") and mimetype.endswith("+json")
        ):
            # Only a preflighted request (which this server never grants) can carry
            # a JSON content type across sites; forms and simple fetches cannot.
            raise UnsupportedMediaType(
                "a state-changing request must be sent as application/json "
                f"(got {mimetype or 'no content type'!r})"
            )


def _render_extra(name: str, value: Any) -> Any:
    """Render domain objects carried by errors (the record on a 409)."""
    if isinstance(value, Operation):
        return OperationView.of(value, g.get("ns", "p")).model_dump(mode="json")
    return value


#: The most functions :class:`_App` remembers the check of (a bound, should a
#: caller pass a new closure per request).
_SYNCED_MAX = 1024


class _App(Flask):
    """Flask, with each view and hook's sync-or-async check made once per function.

    Flask asks :func:`inspect.iscoroutinefunction` of every hook and view on
    every request (:meth:`Flask.ensure_sync`, which Flask documents as the
    method to override); the answer never changes for a function.
    """

    def __init__(self, import_name: str) -> None:
        super().__init__(import_name)
        self._synced: dict[Callable[..., Any], Callable[..., Any]] = {}

    def ensure_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        try:
            return self._synced[func]
        except KeyError:
            synced = super().ensure_sync(func)
            if len(self._synced) < _SYNCED_MAX:  # hooks and views: a few dozen
                self._synced[func] = synced
            return synced
        except TypeError:  # an unhashable callable: asked afresh each time
            return super().ensure_sync(func)


class _PageSessions(SecureCookieSessionInterface):
    """Sessions for the operator page only: API requests never open or set a cookie.

    The cookie is ``Secure`` whenever the request came over TLS (or through a
    trusted proxy that said so), and always with ``LOOPSTOP_UI_SECURE_COOKIE=1``.
    """

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(super().get_cookie_secure(app)) or request.is_secure

    def open_session(self, app: Flask, request: Request) -> SecureCookieSession | None:
        if not request.path.startswith("/ui"):
            return self.null_session_class()
        return super().open_session(app, request)

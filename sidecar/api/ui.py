"""``/ui``: a server-rendered page for operators (Jinja templates, no front-end build).

It lists live chains (depth, activations, last decision, stop), tasks (status,
reason, used budgets as bars against their limits) and operations awaiting
reconciliation, with an activation timeline per chain (inline SVG), and it
refreshes itself. A token is entered once: the signed, HttpOnly,
SameSite=Strict session cookie keeps only the token's *name*, never its value.
Views show only the token's workflows; stop and reconcile need an admin
token and a CSRF token that every form carries, the login form and every
mode included. Without a session the page answers 401 with the login form.

Sessions: each login makes a random session id; logging out records it as
revoked in the store (until the cookie's own lifetime ends), so a cookie
copied before the logout no longer works on any worker. Wrong tokens are
counted per client address: after :data:`FREE_FAILURES` the address waits
(doubling, at most :data:`MAX_WAIT_S`) before its next try, and every
failure is logged and counted.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from flask import (
    Blueprint,
    Response,
    current_app,
    redirect,
    render_template,
    request,
    session,
    url_for,
)

from sidecar.api.decisions import auth_failure, log_decision
from sidecar.api.models import nfc_name
from sidecar.auth import ANONYMOUS, LoginDecision, Principal
from sidecar.core.executions import CancellationState
from sidecar.core.operations import OperationState, ReconcileOutcome
from sidecar.core.stops import StopDecision
from sidecar.errors import (
    Forbidden,
    LoopstopError,
    MalformedRequest,
    Unauthenticated,
    ValidationFailed,
)
from sidecar.runtime import Runtime, runtime
from sidecar.service.stops import Cancellation

bp = Blueprint("ui", __name__, url_prefix="/ui")

REFRESH_S = 15
#: Wrong tokens an address may try before it must wait.
FREE_FAILURES = 5
#: The longest wait between tries (seconds); failures older than this are forgotten.
MAX_WAIT_S = 300.0
#: How long a revoked session id is remembered: the cookie's own lifetime.
SESSION_S = 12 * 3600
LISTED = 50
NS = "p"  # the page shows production executions


def _when(ts: Any) -> str:
    if isinstance(ts, int | float):
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(ts or "")


@bp.app_template_filter("when")
def when_filter(ts: Any) -> str:
    return _when(ts)


class LoginThrottle:
    """Wrong tokens per client address, and how long the address must wait.

    Kept per worker process (a bound on guessing speed, not an account lock).
    """

    def __init__(self) -> None:
        self._failures: dict[str, tuple[int, float]] = {}

    def wait_s(self, address: str, now: float) -> float:
        """Seconds ``address`` must still wait before its next try (0: may try)."""
        count, last = self._failures.get(address, (0, 0.0))
        if count < FREE_FAILURES:
            return 0.0
        delay = min(MAX_WAIT_S, 2.0 ** (count - FREE_FAILURES))
        return max(0.0, last + delay - now)

    def failed(self, address: str, now: float) -> int:
        """Count a wrong token; returns the address's failures so far."""
        count, last = self._failures.get(address, (0, 0.0))
        if now - last > MAX_WAIT_S:
            count = 0
        if len(self._failures) > 10_000:  # a bound on memory under a spray of addresses
            self._failures.clear()
        self._failures[address] = (count + 1, now)
        return count + 1

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)


def _throttle() -> LoginThrottle:
    """This app's throttle (one per worker process)."""
    found = current_app.extensions.get("loopstop.login_throttle")
    if not isinstance(found, LoginThrottle):
        found = current_app.extensions["loopstop.login_throttle"] = LoginThrottle()
    return found


def _revoked(rt: Runtime, sid: str) -> bool:
    return rt.sessions.revoked(sid)


def _principal() -> Principal | None:
    rt = runtime()
    if rt.tokens.open:
        return ANONYMOUS if rt.tokens.loopback(request.remote_addr) else None
    name, sid = session.get("token"), session.get("sid")
    if not isinstance(name, str) or not isinstance(sid, str) or _revoked(rt, sid):
        return None
    return rt.tokens.by_name(name)


def _login_page(error: str | None = None, status: int = 401) -> Response:
    html = render_template("ui/login.html", error=error, principal=None, csrf=_csrf())
    return Response(html, status=status, mimetype="text/html")


def _check_csrf() -> None:
    """:raises Forbidden: the form's CSRF token is missing or not the session's."""
    expected = session.get("csrf", "")
    given = request.form.get("csrf", "")
    if not (expected and hmac.compare_digest(str(expected), given)):
        exc = Forbidden("the form's CSRF token is missing or wrong: reload the page")
        auth_failure(exc, request.path, request.remote_addr, session.get("token"))
        raise exc


def _require_form(admin: bool = True) -> Principal:
    """The principal of a form post, after the CSRF check.

    :raises Unauthenticated: no session. :raises Forbidden: a bad CSRF token,
        or not an admin token when ``admin``.
    """
    principal = _principal()
    if principal is None:
        raise Unauthenticated("log in at /ui first")
    _check_csrf()
    if admin:
        principal.require_admin()
    return principal


def _csrf() -> str:
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(24)
    return str(session["csrf"])


@bp.errorhandler(LoopstopError)
def _error_page(exc: LoopstopError) -> Response:
    """Errors of the page's own forms are pages too (the status kept), not JSON."""
    html = render_template(
        "ui/error.html", principal=None, csrf=None, status=exc.status, detail=exc.detail
    )
    return Response(html, status=exc.status, mimetype="text/html")


@bp.get("/login")
def login_form() -> Response:
    return _login_page(status=200)


@bp.post("/login")
def login() -> Response:
    rt = runtime()
    _check_csrf()
    address = request.remote_addr or "unknown"
    now = rt.clock()
    wait = _throttle().wait_s(address, now)
    if wait > 0:
        resp = _login_page(f"Too many wrong tokens from {address}: try again later.", 429)
        resp.headers["Retry-After"] = str(max(1, round(wait)))
        return resp
    token = request.form.get("token", "")
    try:
        principal = rt.tokens.authenticate(f"Bearer {token}", request.remote_addr)
    except LoopstopError as exc:
        failures = _throttle().failed(address, now)
        auth_failure(exc, request.path, address, None)
        if failures >= FREE_FAILURES:
            log_decision(
                "ui.login", LoginDecision.THROTTLED, None, client=address, failures=failures
            )
        return _login_page("That token matches no configured token.")
    _throttle().succeeded(address)
    session.clear()
    session["token"] = principal.name  # the name only, never the value
    session["sid"] = secrets.token_urlsafe(24)
    session["csrf"] = secrets.token_urlsafe(24)
    log_decision("ui.login", LoginDecision.LOGGED_IN, None, token_name=principal.name)
    return redirect(url_for("ui.index"), code=303)  # type: ignore[return-value]


@bp.post("/logout")
def logout() -> Response:
    _require_form(admin=False)
    sid = session.get("sid")
    if isinstance(sid, str):
        runtime().sessions.revoke(sid, SESSION_S)
    session.clear()
    return redirect(url_for("ui.login_form"), code=303)  # type: ignore[return-value]


#: The messages a redirect after a /ui action may show, by the key its query
#: carries (``?done=<key>``): a link can name one of these, never bring its own
#: text (content spoofing). An unknown key shows nothing.
MESSAGES = {
    "chain_stopped": "Chain stopped",
    "workflow_stopped": "Workflow stopped",
    "workflow_resumed": "Workflow resumed",
    "operation_reconciled": "Operation reconciled",
}
#: Why n8n could not be asked, as :class:`~sidecar.outbound.n8n_api.N8nError` names it.
N8N_REASONS = frozenset({"unreachable", "timeout", "key_refused", "bad_response"})
_STATES = frozenset(str(s) for s in CancellationState)


def _said(result: Cancellation) -> dict[str, Any]:
    """What a /ui stop's cancellation in n8n confirmed, as query parameters of
    fixed values (a state, two counts, a failure's reason word)."""
    confirmed = sum(1 for e in result.executions if e.confirmed)
    said: dict[str, Any] = {"n8n": str(result.state), "confirmed": str(confirmed)}
    said["of"] = str(len(result.executions))
    reason = (result.error or "").split(":", 1)[0]
    if reason in N8N_REASONS:
        said["n8n_error"] = reason
    return said


def message(args: Mapping[str, str]) -> str | None:
    """The text a redirect's query asks ``/ui`` to show, built only from
    :data:`MESSAGES` and fixed values (None: no key, or an unknown one)."""
    text = MESSAGES.get(args.get("done", ""))
    if text is None:
        return None
    state = args.get("n8n", "")
    if state in _STATES:
        text += f"; n8n: {state}"
        confirmed, of = args.get("confirmed", ""), args.get("of", "")
        if _count(confirmed) and _count(of):
            text += f", {int(confirmed)}/{int(of)} executions confirmed"
        if args.get("n8n_error") in N8N_REASONS:
            text += f" ({args['n8n_error']})"
    return text


def _count(value: str) -> bool:
    return value.isascii() and value.isdigit() and len(value) <= 4


def _operations(rt: Runtime, principal: Principal) -> list[Any]:
    scopes: list[str | None] = [None]
    if principal.workflows is not None:
        scopes = list(sorted(principal.workflows))
    items = []
    for workflow in scopes:
        page = rt.operations.list_open(
            principal, NS, OperationState.UNKNOWN, workflow, None, LISTED
        )
        items += page.items
    return items[:LISTED]


@bp.get("")
@bp.get("/")
def index() -> Response:
    principal = _principal()
    if principal is None:
        return _login_page()
    rt = runtime()
    now = rt.clock()
    html = render_template(
        "ui/index.html",
        principal=principal,
        csrf=_csrf(),
        refresh=REFRESH_S,
        chains=rt.overview.chains(principal, NS, now, LISTED),
        tasks=rt.overview.tasks(principal, NS, now, LISTED),
        operations=_operations(rt, principal),
        counts=rt.overview.open_counts(principal, NS, now),
        max_open=rt.settings.operations.max_open_per_workflow,
        running_long=rt.overview.running_long(principal, NS, now, LISTED),
        running_s=int(rt.settings.outliers.running_s),
        # Stops are an admin's: the executions they could not confirm are listed to admins.
        unconfirmed=rt.stops.unconfirmed(NS, LISTED) if principal.admin else [],
        message=message(request.args),
    )
    return Response(html, mimetype="text/html")


@bp.get("/chains/<chain_id>")
def chain(chain_id: str) -> Response:
    principal = _principal()
    if principal is None:
        return _login_page()
    rt = runtime()
    info = rt.chains.chain(principal, NS, chain_id)
    recent = list(info.chain.recent)
    width = max(300, 60 + 40 * len(recent))
    depths = max([a.get("depth") or 0 for a in recent] + [info.chain.depth, 1])
    height = 40 + 30 * depths

    def y(depth: int | None) -> int:
        return 20 + 30 * (depths - (depth or 0))

    points = [
        {
            "x": 70 + 40 * i,
            "y": y(a.get("depth")),
            "decision": a["decision"],
            "reason": a["reason"],
            "at": _when(a["at"]),
        }
        for i, a in enumerate(recent)
    ]
    axis = [(y(d), d) for d in range(depths + 1)]
    html = render_template(
        "ui/chain.html",
        principal=principal,
        csrf=_csrf(),
        chain=info.chain,
        stop=info.stop,
        cancellation=rt.stops.recorded(NS, "chain", chain_id),
        points=points,
        axis=axis,
        width=width,
        height=height,
        refresh=REFRESH_S,
    )
    return Response(html, mimetype="text/html")


@bp.post("/chains/<chain_id>/stop")
def stop_chain(chain_id: str) -> Response:
    principal = _require_form()
    reason = request.form.get("reason", "").strip()[:500] or "stopped from /ui"
    _, cancellation = runtime().stops.stop_chain(principal, "production", chain_id, reason)
    said = _said(cancellation)
    log_decision("ui.chains.stop", StopDecision.STOPPED, reason, chain_id=chain_id)
    return redirect(
        url_for("ui.index", done="chain_stopped", **said),  # type: ignore[return-value]
        code=303,
    )


@bp.post("/workflows")
def stop_workflow() -> Response:
    principal = _require_form()
    reason = request.form.get("reason", "").strip()[:500] or "stopped from /ui"
    try:  # checked and in NFC as the API's workflow, never cut to fit
        workflow = nfc_name(request.form.get("workflow", "").strip())
    except ValueError as exc:
        raise ValidationFailed([{"loc": ["form", "workflow"], "msg": str(exc)}]) from exc
    stopped = request.form.get("action", "stop") != "resume"
    decision = StopDecision.STOPPED if stopped else StopDecision.RESUMED
    said: dict[str, Any] = {}
    if stopped:
        _, cancellation = runtime().stops.stop_workflow(principal, "production", workflow, reason)
        said = _said(cancellation)
    else:
        runtime().chains.stop_workflow(principal, NS, workflow, reason, stopped=False)
    log_decision(
        f"ui.workflows.{'stop' if stopped else 'resume'}", decision, reason, workflow=workflow
    )
    return redirect(
        url_for("ui.index", done=f"workflow_{decision}", **said),  # type: ignore[return-value]
        code=303,
    )


@bp.post("/operations/<operation_id>/reconcile")
def reconcile(operation_id: str) -> Response:
    principal = _require_form()
    try:
        outcome = ReconcileOutcome(request.form.get("outcome", ""))
    except ValueError:
        raise MalformedRequest(
            "outcome must be committed or not_committed: choose one in the form"
        ) from None
    evidence = {"note": request.form.get("evidence", "").strip()[:1000], "via": "ui"}
    workflow = request.form.get("workflow", "").strip()[:200] or None
    runtime().operations.reconcile(principal, NS, operation_id, outcome, None, evidence, workflow)
    log_decision("ui.operations.reconcile", outcome, None, operation_id=operation_id)
    return redirect(
        url_for("ui.index", done="operation_reconciled"),  # type: ignore[return-value]
        code=303,
    )

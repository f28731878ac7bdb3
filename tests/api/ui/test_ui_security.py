"""The operator page's sessions (first hardening, items 13 and 16): logout revokes
everywhere, login needs CSRF and is slowed, secure cookies over TLS, a bad reconcile
outcome is a 400 page."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from flask.testing import FlaskClient
from ui_session import login, login_csrf

from conftest import ADMIN_TOKEN, Api, AppFactory, Clock

OP = "/v1/operations"


def begin(api: Api, op_id: str, **fields: Any) -> dict[str, Any]:
    return api.begin(op_id, {"x": 1}, **fields)


pytestmark = pytest.mark.security


# -- 13. operator-page sessions -------------------------------------------------


def test_logout_revokes_the_session_everywhere(make_app: AppFactory) -> None:
    app = make_app()
    client = app.test_client()
    login(client, ADMIN_TOKEN)
    cookie = client.get_cookie("loopstop_session")
    assert cookie is not None
    stolen = app.test_client()
    stolen.set_cookie("loopstop_session", cookie.value)
    assert stolen.get("/ui").status_code == 200
    page = client.get("/ui").get_data(as_text=True)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf and client.post("/ui/logout", data={"csrf": csrf.group(1)}).status_code == 303
    r = stolen.get("/ui")
    assert r.status_code == 401 and 'name="token"' in r.get_data(as_text=True)
    # Another app over the same store (another worker) refuses it too.
    other = make_app().test_client()
    other.set_cookie("loopstop_session", cookie.value)
    assert other.get("/ui").status_code == 401


def test_login_needs_its_csrf_token_and_wrong_tokens_are_slowed(
    make_app: AppFactory, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_app().test_client()
    r = client.post("/ui/login", data={"token": ADMIN_TOKEN})
    assert r.status_code == 403  # no CSRF token from the login form: refused
    csrf = login_csrf(client)
    with caplog.at_level(logging.WARNING, logger="loopstop"):
        for _ in range(5):
            r = client.post("/ui/login", data={"token": "guess-000000000000", "csrf": csrf})
            assert r.status_code == 401
    refused = [m for m in caplog.messages if "matches no configured token" in m]
    assert len(refused) == 5 and all("127.0.0.1" in m and "/ui/login" in m for m in refused)
    r = client.post("/ui/login", data={"token": ADMIN_TOKEN, "csrf": csrf})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1  # even the right one
    clock.advance(3)
    r = client.post("/ui/login", data={"token": ADMIN_TOKEN, "csrf": csrf})
    assert r.status_code == 303


def test_session_cookie_is_secure_over_tls(make_app: AppFactory) -> None:
    app = make_app()
    tls = app.test_client()
    csrf = login_csrf_at(tls, "https://localhost")
    r = tls.post(
        "/ui/login", data={"token": ADMIN_TOKEN, "csrf": csrf}, base_url="https://localhost"
    )
    assert r.status_code == 303 and "Secure" in r.headers["Set-Cookie"]
    plain = app.test_client()
    plain.post("/ui/login", data={"token": ADMIN_TOKEN, "csrf": login_csrf(plain)})
    r = plain.get("/ui/login")
    assert "Secure" not in r.headers.get("Set-Cookie", "")


def login_csrf_at(client: FlaskClient, base_url: str) -> str:
    page = client.get("/ui/login", base_url=base_url).get_data(as_text=True)
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match
    return match.group(1)


# -- 16. the page's reconcile with a bad outcome --------------------------------


def test_ui_reconcile_with_a_bad_outcome_is_a_400_page(make_app: AppFactory) -> None:
    app = make_app()
    api = Api(app.test_client())
    begin(api, "pay:1", workflow="wf-pay")
    api.post(f"{OP}/pay:1/fail", {"attempt": 1, "outcome": "unknown", "workflow": "wf-pay"})
    client = app.test_client()
    csrf = login(client, ADMIN_TOKEN)
    for outcome in ("maybe", ""):
        r = client.post(
            "/ui/operations/pay:1/reconcile",
            data={"outcome": outcome, "evidence": "e", "csrf": csrf, "workflow": "wf-pay"},
        )
        assert r.status_code == 400 and r.mimetype == "text/html"
        assert "outcome must be committed or not_committed" in r.get_data(as_text=True)
    assert api.get(f"{OP}/pay:1", workflow="wf-pay")[1]["operation"]["state"] == "unknown"

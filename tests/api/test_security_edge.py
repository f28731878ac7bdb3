"""Web pages cannot drive the sidecar (attack item 2 of the first hardening): cross-site
forms, DNS rebinding, foreign hosts and origins, a framed operator page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask import Flask

from conftest import N8N_TOKEN, Api, AppFactory

OP = "/v1/operations"
AUTH = {"Authorization": f"Bearer {N8N_TOKEN}"}
EVIL = "http://evil.example"


def problem(status: int, body: Any, slug: str) -> None:
    assert isinstance(body, dict) and body.get("status") == status, body
    assert str(body["type"]).endswith(slug), body


def begin(api: Api, op_id: str, **fields: Any) -> dict[str, Any]:
    return api.begin(op_id, {"x": 1}, **fields)


pytestmark = pytest.mark.security


# -- 2. web pages cannot drive the sidecar -------------------------------------


@pytest.fixture
def open_app(make_app: AppFactory) -> Flask:
    """No tokens: loopback only (the test client calls from 127.0.0.1, Host localhost)."""
    return make_app(tokens=False)


def test_cross_site_form_cannot_reconcile_stop_or_resume(open_app: Flask) -> None:
    api = Api(open_app.test_client(), token=None)
    begin(api, "mail:1", workflow="wf-mail")
    api.post(f"{OP}/mail:1/fail", {"attempt": 1, "outcome": "unknown", "workflow": "wf-mail"})
    client = open_app.test_client()
    form = {"outcome": "not_committed", "evidence": "x", "workflow": "wf-mail"}
    # A form posted from another site carries its Origin: refused.
    r = client.post(f"{OP}/mail:1/reconcile", data=form, headers={"Origin": EVIL})
    problem(403, r.get_json(), "foreign-origin")
    # A form or simple fetch whose Origin a browser hides (privacy settings): not JSON.
    r = client.post(f"{OP}/mail:1/reconcile", data=form)
    problem(415, r.get_json(), "unsupported-media-type")
    r = client.post("/v1/workflows/wf-mail/stop", data="reason=pwned", content_type="text/plain")
    problem(415, r.get_json(), "unsupported-media-type")
    r = client.post(
        "/v1/workflows/wf-mail/resume",
        data='{"reason": "x"}',
        content_type="text/plain",
        headers={"Origin": "null"},
    )
    assert r.status_code in (403, 415)
    # Nothing changed: the write is still unknown, never executed again.
    out = begin(api, "mail:1", workflow="wf-mail")
    assert out["decision"] == "reconcile"
    assert api.get("/v1/workflows/wf-mail")[1]["stopped"] is None
    # The server's own origin with JSON is served.
    r = client.post(
        "/v1/workflows/wf-mail/stop",
        json={"reason": "operator"},
        headers={"Origin": "http://localhost"},
    )
    assert r.status_code == 200, r.get_json()


def test_dns_rebinding_host_is_refused_without_tokens(open_app: Flask) -> None:
    client = open_app.test_client()
    for host in ("evil.example", "evil.example:8765", "127.0.0.1.nip.io", "10.0.0.5"):
        r = client.get(f"{OP}?state=unknown", headers={"Host": host})
        problem(421, r.get_json(), "misdirected-request")
        assert client.get("/ui", headers={"Host": host}).status_code == 421
    for host in ("localhost", "127.0.0.1:8765", "[::1]:8765"):
        assert client.get(f"{OP}?state=unknown", headers={"Host": host}).status_code == 200


def test_without_tokens_no_route_answers_a_foreign_host(open_app: Flask) -> None:
    """A rebinding page reads nothing either: metrics, readiness, the API document."""
    client = open_app.test_client()
    for path in ("/metrics", "/readyz", "/healthz", "/openapi.json"):
        r = client.get(path, headers={"Host": "evil.example"})
        assert r.status_code == 421, (path, r.status_code)
        problem(421, r.get_json(), "misdirected-request")
        assert client.get(path, headers={"Host": "127.0.0.1:8765"}).status_code == 200, path


def test_with_tokens_the_host_is_free_but_the_origin_is_not(make_app: AppFactory) -> None:
    client = make_app().test_client()
    r = client.get("/v1/whoami", headers={**AUTH, "Host": "loopstop.internal:8765"})
    assert r.status_code == 200
    r = client.post(f"{OP}/o/begin", json={"payload": 1}, headers={**AUTH, "Origin": EVIL})
    problem(403, r.get_json(), "foreign-origin")
    r = client.post(
        f"{OP}/o/begin",
        json={"payload": 1},
        headers={**AUTH, "Host": "ls.example:443", "Origin": "http://ls.example:443"},
    )
    assert r.status_code == 200


def test_model_gate_keeps_working_for_an_openai_client(make_app: AppFactory) -> None:
    """n8n's OpenAI client sends JSON with no Origin: it passes the web-page rules
    (here it reaches the gate, which has no upstream configured)."""
    client = make_app().test_client()
    r = client.post(
        "/v1/openai/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        headers={**AUTH, "User-Agent": "OpenAI/JS 4.0"},
    )
    assert r.get_json()["type"].endswith("model-gate-not-configured"), r.get_json()


def test_ui_cannot_be_framed_and_needs_csrf_without_tokens(open_app: Flask) -> None:
    client = open_app.test_client()
    r = client.get("/ui")
    assert r.status_code == 200 and r.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
    assert "default-src 'none'" in r.headers["Content-Security-Policy"]
    r = client.post("/ui/workflows", data={"workflow": "wf-x", "reason": "r"})
    assert r.status_code == 403  # no CSRF token: refused even without tokens
    assert Api(client, token=None).get("/v1/workflows/wf-x")[1]["stopped"] is None
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/ui").get_data(as_text=True))
    assert csrf
    r = client.post(
        "/ui/workflows", data={"workflow": "wf-x", "reason": "r", "csrf": csrf.group(1)}
    )
    assert r.status_code == 303

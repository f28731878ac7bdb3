"""The operator page through the app: login, cookie, CSRF, scopes, actions."""

from __future__ import annotations

import pytest
from ui_session import login, login_csrf

from conftest import ADMIN_TOKEN, N8N_TOKEN, SCOPED_TOKEN, Api, AppFactory


def test_page_needs_a_token_and_shows_the_login_form(make_app: AppFactory) -> None:
    client = make_app().test_client()
    r = client.get("/ui")
    assert r.status_code == 401 and 'name="token"' in r.get_data(as_text=True)
    r = client.post("/ui/login", data={"token": "wrong", "csrf": login_csrf(client)})
    assert r.status_code == 401 and "matches no configured token" in r.get_data(as_text=True)


def test_page_lists_chains_tasks_and_operations(make_app: AppFactory) -> None:
    app = make_app()
    api = Api(app.test_client())
    first = api.post(
        "/v1/activations", {"workflow": "wf-loop", "event_key": "e1", "content": {"a": 1}}
    )[1]
    api.post(
        "/v1/chains/" + first["chain_id"] + "/stop", {"reason": "runaway sheet"}, token=ADMIN_TOKEN
    )
    api.post("/v1/tasks", {"workflow": "wf-agent", "task_key": "ticket-9"})
    api.begin("mail:1", {"to": "x"}, workflow="wf-mail")
    api.post(
        "/v1/operations/mail:1/fail",
        {"attempt": 1, "outcome": "unknown", "detail": "SMTP timeout", "workflow": "wf-mail"},
    )
    client = app.test_client()
    login(client, N8N_TOKEN)
    page = client.get("/ui").get_data(as_text=True)
    assert first["chain_id"] in page and "stopped: runaway sheet" in page
    assert "ticket-9" in page and "mail:1" in page and "SMTP timeout" in page
    assert 'http-equiv="refresh"' in page
    assert "reconcile</button>" not in page  # not an admin: no actions
    chain = client.get(f"/ui/chains/{first['chain_id']}").get_data(as_text=True)
    assert "<svg" in chain and "new_chain" in chain


def test_scoped_token_sees_only_its_workflows(make_app: AppFactory) -> None:
    app = make_app()
    api = Api(app.test_client())
    mine = api.post("/v1/activations", {"workflow": "wf-sheets", "content": {"a": 1}})[1]
    other = api.post("/v1/activations", {"workflow": "wf-crm", "content": {"a": 1}})[1]
    client = app.test_client()
    login(client, SCOPED_TOKEN)
    page = client.get("/ui").get_data(as_text=True)
    assert mine["chain_id"] in page and other["chain_id"] not in page
    assert client.get(f"/ui/chains/{other['chain_id']}").status_code == 403


def test_admin_actions_need_csrf(make_app: AppFactory) -> None:
    app = make_app()
    api = Api(app.test_client())
    client = app.test_client()
    csrf = login(client, ADMIN_TOKEN)
    r = client.post("/ui/workflows", data={"workflow": "wf-x", "reason": "loop"})
    assert r.status_code == 403
    r = client.post("/ui/workflows", data={"workflow": "wf-x", "reason": "loop", "csrf": csrf})
    assert r.status_code == 303
    out = api.post("/v1/activations", {"workflow": "wf-x", "content": {"a": 1}})[1]
    assert out["reason"] == "stopped"
    n8n = app.test_client()
    csrf = login(n8n, N8N_TOKEN)
    r = n8n.post("/ui/workflows", data={"workflow": "wf-y", "reason": "x", "csrf": csrf})
    assert r.status_code == 403  # not an admin


def test_reconcile_from_the_page(make_app: AppFactory) -> None:
    app = make_app()
    api = Api(app.test_client())
    api.begin("pay:1", {"x": 1}, workflow="wf-pay")
    api.post(
        "/v1/operations/pay:1/fail", {"attempt": 1, "outcome": "unknown", "workflow": "wf-pay"}
    )
    client = app.test_client()
    csrf = login(client, ADMIN_TOKEN)
    assert 'name="workflow" value="wf-pay"' in client.get("/ui").get_data(as_text=True)
    r = client.post(
        "/ui/operations/pay:1/reconcile",
        data={
            "outcome": "not_committed",
            "evidence": "no charge in Stripe",
            "csrf": csrf,
            "workflow": "wf-pay",  # the page's form carries the operation's workflow
        },
    )
    assert r.status_code == 303
    op = api.get("/v1/operations/pay:1", workflow="wf-pay")[1]["operation"]
    assert op["state"] == "not_committed" and op["reconciliation"]["actor"] == "operator"


@pytest.mark.security
def test_item16_ui_messages_come_from_a_fixed_set(make_app: AppFactory) -> None:
    """Attack item 16: ``/ui/?done=...`` printed any text from the query string (content
    spoofing through a link). The query names a message key; unknown keys show nothing,
    and the n8n summary is made of fixed values only."""
    client = make_app().test_client()
    login(client, ADMIN_TOKEN)
    spoof = "Your session expired: call +1 555 0100"
    page = client.get("/ui/", query_string={"done": spoof}).get_data(as_text=True)
    assert "555 0100" not in page and 'id="message"' not in page
    page = client.get(
        "/ui/",
        query_string={
            "done": "chain_stopped",
            "n8n": "partial",
            "confirmed": "1",
            "of": "2",
            "n8n_error": "call +1 555 0100",
        },
    ).get_data(as_text=True)
    said = "Chain stopped; n8n: partial, 1/2 executions confirmed"
    assert f'<p id="message" class="ok">{said}</p>' in page
    assert "555 0100" not in page
    page = client.get("/ui/", query_string={"done": "workflow_stopped", "n8n": "pwned"}).get_data(
        as_text=True
    )
    assert '<p id="message" class="ok">Workflow stopped</p>' in page and "pwned" not in page

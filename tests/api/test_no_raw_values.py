"""Raw payload values never reach the logs or the operator page."""

from __future__ import annotations

import logging

import pytest
from ui_session import login

from conftest import ADMIN_TOKEN, Api, AppFactory

PLANTED = "sk-live-PLANTED-4f9a2c7e1b"


def test_planted_value_appears_in_no_log_line_and_no_page(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    api = Api(app.test_client())
    with caplog.at_level(logging.DEBUG):
        out = api.begin("op-planted", {"card": PLANTED}, workflow="wf-pay")
        api.post(
            "/v1/operations/op-planted/fail",
            {"attempt": 1, "outcome": "unknown", "workflow": "wf-pay"},
        )
        act = api.post(
            "/v1/activations",
            {
                "workflow": "wf-pay",
                "event_key": "k",
                "event": {"body": PLANTED, "headers": {"x": PLANTED}},
            },
        )[1]
        api.post(
            "/v1/effects",
            {"chain_id": act["chain_id"], "target_key": "t", "content": {"secret": PLANTED}},
        )
        task = api.post("/v1/tasks", {"workflow": "wf-pay"})[1]["task"]["task_id"]
        call = api.post(
            f"/v1/tasks/{task}/tool-calls",
            {"tool": "charge", "kind": "read", "args": {"card": PLANTED}},
        )[1]
        api.post(
            f"/v1/tasks/{task}/tool-calls/{call['call_id']}/result",
            {"status": "ok", "result": {"echo": "fine"}},
        )
        api.post("/v1/checks/none", {"input": {"x": PLANTED}})
    assert out["decision"] == "execute"
    assert PLANTED not in caplog.text
    assert '"payload_fp":"' in caplog.text  # fingerprints, not values
    client = app.test_client()
    login(client, ADMIN_TOKEN)
    pages = client.get("/ui").get_data(as_text=True)
    pages += client.get(f"/ui/chains/{act['chain_id']}").get_data(as_text=True)
    assert "op-planted" in pages and PLANTED not in pages
    for path in ("/v1/operations/op-planted", f"/v1/chains/{act['chain_id']}", f"/v1/tasks/{task}"):
        assert PLANTED not in str(api.get(path)[1])

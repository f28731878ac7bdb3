"""Exact names and numbers (first hardening, item 14): a final newline is a 422, workflows
are NFC-normalised, attempts are strict integers, duplicate JSON keys are a 400."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import N8N_TOKEN, SECRET, Api, Clock
from sidecar.app import create_app

OP = "/v1/operations"
AUTH = {"Authorization": f"Bearer {N8N_TOKEN}"}


def problem(status: int, body: Any, slug: str) -> None:
    assert isinstance(body, dict) and body.get("status") == status, body
    assert str(body["type"]).endswith(slug), body


def begin(api: Api, op_id: str, **fields: Any) -> dict[str, Any]:
    return api.begin(op_id, {"x": 1}, **fields)


pytestmark = pytest.mark.security


# -- 14. exact names and numbers ------------------------------------------------


@pytest.mark.parametrize("workflow", ["wf\n", "wf\r\n", "wf\x00", ""])
def test_a_name_with_a_final_newline_is_422(api: Api, workflow: str) -> None:
    _, body = api.post(f"{OP}/o/begin", {"payload": 1, "workflow": workflow})
    problem(422, body, "validation-failed")
    assert body["errors"][0]["loc"] == ["body", "workflow"]


def test_an_operation_id_with_a_final_newline_is_422(api: Api) -> None:
    task = api.post("/v1/tasks", {"workflow": "wf"})[1]["task"]["task_id"]
    _, body = api.post(
        f"/v1/tasks/{task}/tool-calls",
        {"tool": "send", "kind": "write", "args": {}, "operation_id": "mail:1\n"},
    )
    problem(422, body, "validation-failed")
    assert body["errors"][0]["loc"] == ["body", "operation_id"]
    assert api.client.post(f"{OP}/A%0A/begin", json={"payload": 1}, headers=AUTH).status_code == 422


def test_workflow_names_are_nfc_normalised(store_url: str, clock: Clock) -> None:
    tokens = [{"name": "cafe", "env": "LOOPSTOP_TOKEN_CAFE", "workflows": ["Cafe\u0301"]}]
    env = {"LOOPSTOP_SECRET": SECRET, "LOOPSTOP_TOKEN_CAFE": "tok-cafe-0123456789"}
    app = create_app({"store": store_url, "tokens": tokens}, environ=env, clock=clock)
    api = Api(app.test_client(), token="tok-cafe-0123456789")
    first = api.begin("o", 1, workflow="Caf\u00e9")
    assert first["decision"] == "execute" and first["operation"]["workflow"] == "Caf\u00e9"
    again = api.begin("o", 1, workflow="Cafe\u0301")
    assert again["decision"] == "in_progress"


@pytest.mark.parametrize("attempt", ["1", True, 1.5, 1.0, None])
def test_attempt_is_a_strict_integer(api: Api, attempt: Any) -> None:
    begin(api, "o")
    _, body = api.post(f"{OP}/o/commit", {"attempt": attempt, "receipt": "r"})
    problem(422, body, "validation-failed")
    assert body["errors"][0]["loc"] == ["body", "attempt"]
    assert api.get(f"{OP}/o")[1]["operation"]["state"] == "in_progress"


def test_duplicate_keys_are_400(api: Api) -> None:
    begin(api, "o")
    raw = b'{"attempt": 1, "receipt": "a", "receipt": "b"}'
    r = api.client.post(f"{OP}/o/commit", data=raw, content_type="application/json", headers=AUTH)
    problem(400, r.get_json(), "malformed-request")
    assert "receipt" in r.get_json()["detail"]
    nested = b'{"payload": {"to": "a", "to": "b"}}'
    r = api.client.post(f"{OP}/p/begin", data=nested, content_type="application/json", headers=AUTH)
    assert r.status_code == 400
    assert api.get(f"{OP}/o")[1]["operation"]["state"] == "in_progress"


@pytest.mark.parametrize("field", [{"task_key": "ticket-9\n"}, {"chain_id": "c" + "0" * 20 + "\n"}])
def test_task_key_and_chain_id_with_a_final_newline_are_422(
    api: Api, field: dict[str, str]
) -> None:
    _, body = api.post("/v1/tasks", {"workflow": "wf", **field})
    problem(422, body, "validation-failed")
    assert body["errors"][0]["loc"] == ["body", next(iter(field))]

"""What the gate sends upstream: a request it does not change goes as the bytes
it received (parsed once, never written again); one it changes (the wrap-up
note) is written anew as JSON."""

from __future__ import annotations

import json
from typing import Any

from fake_llm import FakeLLM
from test_model_gate import CHAT, gate_app, llm, request

from conftest import N8N_TOKEN, Api, AppFactory

__all__ = ["llm"]


def _sent_bodies(llm: FakeLLM) -> list[bytes]:
    """Every request body the upstream receives from now on, as it arrived, in order."""
    llm.bodies.clear()
    return llm.bodies


def _post_raw(app: Any, raw: bytes) -> int:
    headers = {"Authorization": f"Bearer {N8N_TOKEN}", "Content-Type": "application/json"}
    return int(app.test_client().post(CHAT, data=raw, headers=headers).status_code)


def test_an_unchanged_request_is_forwarded_as_received(make_app: AppFactory, llm: FakeLLM) -> None:
    llm.mode = "final"
    app = gate_app(make_app, llm)
    sent = _sent_bodies(llm)
    _, created = Api(app.test_client()).post("/v1/tasks", {})
    body = request(created["task"]["task_id"])
    body["messages"][1]["content"] = "Où est ma commande ?"
    raw = json.dumps(body, indent=1, ensure_ascii=False).encode()  # no serialiser's bytes
    assert _post_raw(app, raw) == 200
    assert sent == [raw]
    assert llm.requests[-1] == body


def test_a_changed_request_is_written_anew(make_app: AppFactory, llm: FakeLLM) -> None:
    llm.mode = "final"
    # every turn of this budget is past the wrap-up point: the note is added
    app = gate_app(make_app, llm, limits={"max_model_calls": 2, "wrap_up_ratio": 0.5})
    sent = _sent_bodies(llm)
    _, created = Api(app.test_client()).post("/v1/tasks", {})
    body = request(created["task"]["task_id"])
    raw = json.dumps(body, indent=1).encode()
    assert _post_raw(app, raw) == 200
    assert len(sent) == 1 and sent[0] != raw
    forwarded = json.loads(sent[0])
    assert forwarded == llm.requests[-1]
    assert len(forwarded["messages"]) == len(body["messages"]) + 1


def test_an_unchanged_answer_is_relayed_as_the_upstream_sent_it(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    """An answer the gate admits whole goes to n8n as the upstream's bytes (the
    stand-in writes ``json.dumps``' spacing and its key order), not written again."""
    llm.mode = "tool_call"
    app = gate_app(make_app, llm)
    _, created = Api(app.test_client()).post("/v1/tasks", {})
    headers = {"Authorization": f"Bearer {N8N_TOKEN}"}
    answer = app.test_client().post(CHAT, json=request(created["task"]["task_id"]), headers=headers)
    assert answer.status_code == 200 and answer.mimetype == "application/json"
    relayed = answer.get_json()
    assert relayed["choices"][0]["message"]["tool_calls"]
    assert answer.data == json.dumps(relayed).encode()

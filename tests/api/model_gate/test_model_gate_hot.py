"""The model gate's turns on the hot path (sidecar.api.hot): a turn that asks
for no stream, at an API's own path, is served without Flask's per-request
machinery and answers exactly as the Flask path answers (the relayed answer,
the gate's own final message, an upstream's error), with the same decision
line; a stream, a body the adapter refuses and every request that is not
plain go to Flask."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import gate_apis
import pytest
from fake_llm import FakeLLM
from flask import Flask
from test_model_gate import CHAT, RESPONSES, gate_app, llm, request, responses_request
from werkzeug.test import TestResponse

from conftest import N8N_TOKEN, Api, AppFactory, flask_only, served_by_flask

__all__ = ["llm"]

BEARER = {"Authorization": f"Bearer {N8N_TOKEN}"}


@pytest.fixture
def app(make_app: AppFactory, llm: FakeLLM) -> Flask:
    return gate_app(make_app, llm)


@pytest.fixture
def flask_served(app: Flask) -> Iterator[list[str]]:
    with served_by_flask(app) as seen:
        yield seen


def _task(app: Flask) -> str:
    _, created = Api(app.test_client()).post("/v1/tasks", {})
    return str(created["task"]["task_id"])


def _post(client: Any, path: str, body: Any, **headers: str) -> TestResponse:
    return client.post(path, json=body, headers={**BEARER, **headers})  # type: ignore[no-any-return]


def _same(hot: TestResponse, flask: TestResponse, tasks: tuple[str, str] = ("", "")) -> None:
    """One answer: status, header names in order, headers but the request id and
    length, and the body but its random ids, the hot turn's task id read as the
    Flask turn's (``tasks``)."""
    assert hot.status == flask.status
    assert [k for k, _ in hot.headers] == [k for k, _ in flask.headers]
    varying = ("X-Request-Id", "Content-Length")
    assert {k: v for k, v in hot.headers if k not in varying} == {
        k: v for k, v in flask.headers if k not in varying
    }
    text = hot.get_data(as_text=True).replace(*tasks) if tasks[0] else hot.get_data(as_text=True)
    assert _masked(json.loads(text)) == _masked(flask.json)


#: Values that differ between two turns of the same kind (ids, times).
VARYING = frozenset({"id", "created", "created_at", "call_id", "ts", "request_id", "latency_ms"})


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "*" if k in VARYING else _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


#: One non-streamed turn of each API the hot path serves: its path and body.
def _turns(task_id: str) -> dict[str, tuple[str, dict[str, Any]]]:
    system = f"You are an agent.\nloopstop-task: {task_id}"
    chat = request(task_id)
    return {
        "chat": (CHAT, chat),
        "responses": (RESPONSES, responses_request(task_id)),
        "anthropic": gate_apis.build("anthropic", system, False, chat),
        "ollama": gate_apis.build("ollama", system, False, chat),
        "azure (AI Foundry)": ("/v1/azure/chat/completions?api-version=2025-03-01-preview", chat),
    }


@pytest.mark.parametrize(
    "which", ["chat", "responses", "anthropic", "ollama", "azure (AI Foundry)"]
)
def test_a_turn_that_asks_for_no_stream_is_served_without_flask(
    app: Flask, llm: FakeLLM, flask_served: list[str], which: str
) -> None:
    llm.mode = "tool_call"
    path, body = _turns(_task(app))[which]
    flask_served.clear()
    r = _post(app.test_client(), path, body)
    assert r.status_code == 200, r.json
    assert flask_served == []
    assert r.headers["Content-Type"] == "application/json"
    assert r.headers["Cache-Control"] == "no-store"
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert int(r.headers["Content-Length"]) == len(r.get_data())
    assert llm.paths[-1].split("?")[0].endswith(path.split("?")[0].split("/", 3)[3])


def test_anthropics_key_header_authenticates_a_hot_turn(
    app: Flask, llm: FakeLLM, flask_served: list[str]
) -> None:
    path, body = _turns(_task(app))["anthropic"]
    flask_served.clear()
    r = app.test_client().post(path, json=body, headers={"x-api-key": N8N_TOKEN})
    assert r.status_code == 200, r.json
    assert flask_served == []
    # The loopstop token never reaches the upstream; its version header does.
    sent = llm.headers[-1]
    assert N8N_TOKEN not in json.dumps(sent)


@pytest.mark.parametrize("mode", ["final", "tool_call"])
def test_hot_turns_answer_and_log_as_flask_does(
    make_app: AppFactory, llm: FakeLLM, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    """The same turn through the hot path and through Flask alone, each on a task
    of its own, until the task ends: the answers (relayed, then the gate's own
    final message) and the decision lines are one but for their random ids."""
    llm.mode = mode
    app = gate_app(make_app, llm, limits={"max_model_calls": 2})
    hot, flask = app.test_client(), flask_only(app)
    tasks = _task(app), _task(app)
    with caplog.at_level(logging.INFO, logger="loopstop.decisions"):
        for _ in range(3):  # the third turn is past the budget on both
            answers = [
                _post(client, CHAT, request(task))
                for client, task in zip((hot, flask), tasks, strict=True)
            ]
            _same(*answers, tasks)
    assert answers[0].json["choices"][0]["message"]["content"]  # type: ignore[index]
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "loopstop.decisions"]
    lines = [line for line in lines if line["route"] == "model_gate"]
    assert len(lines) == 6
    assert {line["decision"] for line in lines} >= {"admit", "deny"}
    for hot_line, flask_line in zip(lines[::2], lines[1::2], strict=True):
        assert hot_line.pop("task_id") == tasks[0] and flask_line.pop("task_id") == tasks[1]
        assert _masked(hot_line) == _masked(flask_line)


def test_an_upstream_error_is_the_flask_error(app: Flask, llm: FakeLLM) -> None:
    llm.mode = "500"
    hot, flask = app.test_client(), flask_only(app)
    answers = [_post(client, CHAT, request(_task(app))) for client in (hot, flask)]
    assert answers[0].status_code == 500
    _same(*answers)


def test_a_stream_is_flasks(app: Flask, llm: FakeLLM, flask_served: list[str]) -> None:
    llm.mode = "final"
    body = request(_task(app), stream=True)
    flask_served.clear()
    r = _post(app.test_client(), CHAT, body)
    assert r.status_code == 200 and r.mimetype == "text/event-stream"
    assert flask_served == [CHAT]


LEFT_TO_FLASK = {
    "a body the adapter refuses": ({}, {"model": "m", "messages": []}, 400),
    "an Origin": ({"Origin": "https://evil.example"}, None, 403),
    "a wrong token": ({"Authorization": "Bearer nope-0123456789"}, None, 401),
    "no token": ({"Authorization": ""}, None, 401),
}


@pytest.mark.parametrize("case", list(LEFT_TO_FLASK))
def test_a_turn_that_is_not_plain_goes_to_flask(
    app: Flask, flask_served: list[str], case: str
) -> None:
    extra, body, status = LEFT_TO_FLASK[case]
    headers = {k: v for k, v in {**BEARER, **extra}.items() if v}
    flask_served.clear()
    r = app.test_client().post(CHAT, json=body or request(_task(app)), headers=headers)
    assert r.status_code == status, r.json
    assert flask_served[-1] == CHAT


def test_a_base_urls_doubled_slash_is_flasks(
    app: Flask, llm: FakeLLM, flask_served: list[str]
) -> None:
    llm.mode = "final"
    body = request(_task(app))
    flask_served.clear()
    r = _post(app.test_client(), "/v1/openai//chat/completions", body)
    assert r.status_code == 200, r.json
    assert flask_served == ["/v1/openai//chat/completions"]

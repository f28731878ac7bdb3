"""The model gate on Anthropic's Messages API (``/v1/anthropic``), driven by the official
``anthropic`` SDK as the client, against the Flask app served for real (a werkzeug
server thread) with the stand-in model as the upstream: a looping model is stopped
(``same_call`` after 2 tool executions), streamed and not; the credential test's
model list; the token read from ``x-api-key`` or ``Authorization: Bearer`` and
never forwarded; errors in Anthropic's shape."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
import requests
from fake_llm import FakeLLM, serve
from flask import Flask
from task_agent import Agent
from werkzeug.serving import make_server

from conftest import N8N_TOKEN, Api, AppFactory

GATE = {"default_model": "fake-model", "timeout_s": 1}
KEY = "sk-ant-upstream-secret"
TOOLS = [
    {
        "name": "echo",
        "description": "Echoes q back.",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
]


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with serve() as fake:
        yield fake


@pytest.fixture
def served() -> Iterator[Any]:
    """Serve apps for real: ``served(app)`` -> its base URL, shut down after the test."""
    servers: list[Any] = []

    def start(app: Flask) -> str:
        server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()


def gate_app(make_app: AppFactory, llm: FakeLLM | None, **gate: Any) -> Flask:
    upstreams = {"anthropic": {"url": llm.root, "api_key_env": "ANTHROPIC_KEY"}} if llm else {}
    return make_app(
        model_gate={**GATE, "upstreams": upstreams, **gate}, environ={"ANTHROPIC_KEY": KEY}
    )


def client(base: str, **kw: Any) -> anthropic.Anthropic:
    """The SDK pointed at the gate, as n8n's credential Base URL is: ``<loopstop>/v1/anthropic``."""
    kw.setdefault("api_key", N8N_TOKEN)
    return anthropic.Anthropic(base_url=base + "/v1/anthropic", max_retries=0, **kw)


def run_agent(
    sdk: anthropic.Anthropic, task_id: str, stream: bool, max_iterations: int = 10
) -> tuple[str, int, list[str]]:
    """Drive the SDK as n8n's AI Agent does: run every proposed tool, send its output
    back as a ``tool_result``, until the model answers text or Max Iterations.

    :returns: the final text, how many tool executions ran, and the texts streamed.
    """
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Echo a."}]
    ran, streamed = 0, []
    for _ in range(max_iterations):
        kw: dict[str, Any] = {
            "model": "claude-sonnet-4-6",
            "max_tokens": 1024,
            "system": f"You are X.\nloopstop-task: {task_id}",
            "messages": messages,
            "tools": TOOLS,
        }
        if stream:
            with sdk.messages.stream(**kw) as s:
                streamed.extend(s.text_stream)
                answer = s.get_final_message()
        else:
            answer = sdk.messages.create(**kw)
        calls = [b for b in answer.content if b.type == "tool_use"]
        if not calls:
            return "".join(b.text for b in answer.content if b.type == "text"), ran, streamed
        for call in calls:
            ran += 1
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": call.id,
                            "name": call.name,
                            "input": {**call.input, "id": call.id},  # type: ignore[dict-item]
                        }
                    ],
                }
            )
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": call.id, "content": f"[{ran}]"}
                    ],
                }
            )
    return "", ran, streamed


def task_of(api: Api, task_id: str) -> dict[str, Any]:
    """The task's view and its ``envelope`` (None while it runs)."""
    out = api.get(f"/v1/tasks/{task_id}")[1]
    return {**out["task"], "envelope": out.get("envelope")}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_looping_model_is_stopped_at_same_call(
    make_app: AppFactory, llm: FakeLLM, served: Any, stream: bool
) -> None:
    app = gate_app(make_app, llm)
    api, base = Api(app.test_client()), served(app)
    a = Agent(api)
    text, ran, _ = run_agent(client(base), a.id, stream)
    assert ran == 2 and len(llm.requests) == 3
    assert text.startswith("[loopstop] This task has ended: partial (same_call)")
    task = task_of(api, a.id)
    assert task["envelope"]["status"] == "partial" and task["envelope"]["reason"] == "same_call"
    assert task["used"]["model_calls"] == 3 and task["used"]["tokens"] == 30  # 7 in + 3 out
    assert all(r.get("stream", False) is stream for r in llm.requests)
    # the upstream got the real key in x-api-key, the SDK's version as sent, never the token
    assert llm.paths == ["/v1/messages"] * 3
    version = client(base).default_headers["anthropic-version"]
    for headers in llm.headers:
        assert headers["x-api-key"] == KEY and headers["anthropic-version"] == version
        assert "authorization" not in headers
    assert N8N_TOKEN not in json.dumps(llm.headers) + json.dumps(llm.requests)
    # an ended task: the gate answers itself, the upstream is not called
    again, ran, _ = run_agent(client(base), a.id, stream)
    assert again.startswith("[loopstop] This task has ended") and ran == 0
    assert len(llm.requests) == 3


def test_the_model_s_text_streams_before_the_held_call(
    make_app: AppFactory, llm: FakeLLM, served: Any
) -> None:
    app = gate_app(make_app, llm)
    api, base = Api(app.test_client()), served(app)
    llm.mode = "text_then_tool"
    a = Agent(api)
    _, ran, streamed = run_agent(client(base), a.id, stream=True)
    assert ran == 2 and "".join(streamed).startswith("FINAL answer" * 3)


def test_the_sdk_s_bearer_token_and_beta_headers(
    make_app: AppFactory, llm: FakeLLM, served: Any
) -> None:
    app = gate_app(make_app, llm)
    api, base = Api(app.test_client()), served(app)
    a = Agent(api)
    llm.mode = "final"
    sdk = anthropic.Anthropic(
        base_url=base + "/v1/anthropic",
        auth_token=N8N_TOKEN,
        max_retries=0,
        default_headers={"anthropic-beta": "prompt-caching-2024-07-31"},
    )
    assert run_agent(sdk, a.id, stream=False)[0] == "FINAL answer"
    assert llm.headers[-1]["anthropic-beta"] == "prompt-caching-2024-07-31"
    assert llm.headers[-1]["x-api-key"] == KEY and "authorization" not in llm.headers[-1]
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client(base, api_key="sk-wrong-0123456789").messages.create(
            model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.status_code == 401
    for headers in ({}, {"Authorization": "Basic eA=="}, {"x-goog-api-key": N8N_TOKEN}):
        r = requests.post(base + "/v1/anthropic/v1/messages", json={}, headers=headers, timeout=10)
        assert r.status_code == 401 and "x-api-key" in r.json()["detail"], r.text
    # the scope is the token's: a token of other workflows cannot act for this task
    other = Agent(api, workflow="wf-other")
    r = requests.post(
        base + "/v1/anthropic/v1/messages",
        json={
            "messages": [{"role": "user", "content": "x"}],
            "system": f"loopstop-task: {other.id}",
        },
        headers={"x-api-key": "tok-scoped-0123456789"},
        timeout=10,
    )
    assert r.status_code == 403 and r.headers["Content-Type"] == "application/problem+json"
    assert len(llm.requests) == 1


def test_the_credential_test_lists_models_only_with_an_upstream(
    make_app: AppFactory, llm: FakeLLM, served: Any
) -> None:
    base = served(gate_app(make_app, llm))
    assert [m.id for m in client(base).models.list().data] == ["fake-model"]
    # n8n's credential test: GET {url}/v1/models with x-api-key and anthropic-version
    r = requests.get(
        base + "/v1/anthropic/v1/models",
        headers={"x-api-key": N8N_TOKEN, "anthropic-version": "2023-06-01"},
        timeout=10,
    )
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "fake-model"
    path, headers = llm.lists[-1]
    assert path == "/v1/models" and headers["x-api-key"] == KEY
    assert N8N_TOKEN not in json.dumps(llm.lists)
    bare = served(gate_app(make_app, None))
    with pytest.raises(anthropic.InternalServerError) as caught:
        client(bare).models.list()
    assert caught.value.status_code == 503
    r = requests.get(bare + "/v1/anthropic/v1/models", headers={"x-api-key": N8N_TOKEN}, timeout=10)
    assert r.status_code == 503 and "model_gate.upstreams.anthropic.url" in r.json()["detail"]
    # the OpenAI routes are another API: no upstream there either
    assert (
        requests.get(
            base + "/v1/openai/models", headers={"Authorization": f"Bearer {N8N_TOKEN}"}, timeout=10
        ).status_code
        == 503
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    ("mode", "status", "error", "kind"),
    [
        ("429", 429, anthropic.RateLimitError, "rate_limit_error"),
        ("500", 500, anthropic.InternalServerError, "api_error"),
        ("502_html", 502, anthropic.InternalServerError, "api_error"),
        ("slow", 504, anthropic.InternalServerError, "timeout_error"),
    ],
)
def test_upstream_errors_are_relayed_in_anthropic_s_shape(
    make_app: AppFactory,
    llm: FakeLLM,
    served: Any,
    stream: bool,
    mode: str,
    status: int,
    error: type[anthropic.APIStatusError],
    kind: str,
) -> None:
    app = gate_app(make_app, llm)
    api, base = Api(app.test_client()), served(app)
    a = Agent(api)
    llm.mode = mode
    with pytest.raises(error) as caught:
        run_agent(client(base), a.id, stream)
    assert caught.value.status_code == status
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == kind
    if mode == "429":
        assert body["error"]["message"] == "fake 429"  # the upstream's own body
    assert task_of(api, a.id)["used"]["model_calls"] == 1


def test_a_stream_that_breaks_ends_with_an_error_event_the_sdk_raises(
    make_app: AppFactory, llm: FakeLLM, served: Any
) -> None:
    app = gate_app(make_app, llm)
    api, base = Api(app.test_client()), served(app)
    a = Agent(api)
    llm.mode = "cut"
    with pytest.raises(anthropic.APIError) as caught:
        run_agent(client(base), a.id, stream=True)
    assert "broke" in str(caught.value) or "message_stop" in str(caught.value)
    assert task_of(api, a.id)["used"]["tokens"] > 0  # never free


def test_a_bad_body_is_a_problem_naming_its_field(
    make_app: AppFactory, llm: FakeLLM, served: Any
) -> None:
    app = gate_app(make_app, llm)
    api, base = Api(app.test_client()), served(app)
    a = Agent(api)
    for body, field in (
        ({"system": f"loopstop-task: {a.id}"}, ["body", "messages"]),
        ({"messages": [{"role": "user", "content": 3}]}, ["body", "messages", "0", "content"]),
        ({"messages": [{"role": "user", "content": "x"}], "system": 3}, ["body", "system"]),
    ):
        r = requests.post(
            base + "/v1/anthropic/v1/messages",
            json=body,
            headers={"x-api-key": N8N_TOKEN},
            timeout=10,
        )
        assert r.status_code == 400 and r.json()["errors"][0]["loc"] == field, r.text
    r = requests.post(
        base + "/v1/anthropic/v1/messages",
        json={"messages": [{"role": "user", "content": "x"}], "system": "no task line"},
        headers={"x-api-key": N8N_TOKEN},
        timeout=10,
    )
    assert r.status_code == 400 and "loopstop-task" in r.json()["detail"]
    assert llm.requests == []


def test_a_money_budget_prices_the_turn_from_input_and_output_tokens(
    make_app: AppFactory, llm: FakeLLM, served: Any
) -> None:
    prices = {"claude-sonnet-4-6": {"input_per_mtok": 1_000_000, "output_per_mtok": 1_000_000}}
    app = gate_app(make_app, llm, prices=prices)
    api, base = Api(app.test_client()), served(app)
    a = Agent(api, limits={"max_cost": 1_000_000})
    llm.mode = "final"
    run_agent(client(base), a.id, stream=True)
    assert task_of(api, a.id)["used"]["cost"] == pytest.approx(10)  # (7 + 3) tokens at 1 each
    unpriced = Agent(api, limits={"max_cost": 5})
    with pytest.raises(anthropic.UnprocessableEntityError):
        client(base).messages.create(
            model="claude-unpriced",
            max_tokens=10,
            system=f"loopstop-task: {unpriced.id}",
            messages=[{"role": "user", "content": "x"}],
        )

"""The model gate: an OpenAI-compatible endpoint that admits and counts every
model turn, and ends a stopped task with a plain final message (both stores)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fake_llm import FakeLLM, serve
from test_tasks_api import Agent

from conftest import N8N_TOKEN, Api, AppFactory

CHAT = "/v1/openai/chat/completions"


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with serve() as fake:
        yield fake


@pytest.fixture
def api(make_app: AppFactory, llm: FakeLLM) -> Api:
    app = make_app(
        model_gate={
            "upstream_url": llm.base,
            "api_key_env": "UPSTREAM_KEY",
            "default_model": "fake-model",
            "timeout_s": 1,
        },
        environ={"UPSTREAM_KEY": "sk-upstream-secret"},
    )
    return Api(app.test_client())


def request(task_id: str | None, **extra: Any) -> dict[str, Any]:
    system = "You are a support agent." + (f"\nloopstop-task: {task_id}" if task_id else "")
    return {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Where is my order ORD-7?"},
        ],
        "tools": [{"type": "function", "function": {"name": "echo", "parameters": {}}}],
        **extra,
    }


def chat(api: Api, body: dict[str, Any], token: str | None = "default") -> tuple[int, Any]:
    return api.post(CHAT, body, token=token)


def test_turns_are_admitted_forwarded_and_counted(api: Api, llm: FakeLLM) -> None:
    a = Agent(api)
    for _ in range(3):
        status, out = chat(api, request(a.id))
        assert status == 200 and out["choices"][0]["finish_reason"] == "tool_calls"
    task = api.get(a.base)[1]["task"]
    assert task["used"]["model_calls"] == 3 and task["used"]["tokens"] == 30
    assert len(llm.requests) == 3
    assert llm.auth[-1] == "Bearer sk-upstream-secret"


def test_model_budget_answers_a_final_message_without_the_upstream(api: Api, llm: FakeLLM) -> None:
    a = Agent(api, limits={"max_model_calls": 2})
    for _ in range(2):
        assert chat(api, request(a.id))[0] == 200
    status, out = chat(api, request(a.id))
    assert status == 200
    choice = out["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert "partial (model_budget)" in choice["message"]["content"]
    assert len(llm.requests) == 2
    assert api.get(a.base)[1]["envelope"]["reason"] == "model_budget"


def test_token_budget_ends_the_task_before_the_next_turn(api: Api, llm: FakeLLM) -> None:
    a = Agent(api, limits={"max_tokens": 25})
    for _ in range(3):
        chat(api, request(a.id))
    assert len(llm.requests) == 3  # 10 + 10 + 10 tokens: the third turn crossed the budget
    status, out = chat(api, request(a.id))
    assert status == 200 and "token_budget" in out["choices"][0]["message"]["content"]
    assert len(llm.requests) == 3


def test_a_task_stopped_through_its_tools_ends_the_agent(api: Api, llm: FakeLLM) -> None:
    a = Agent(api, limits={"max_same_call": 1})
    chat(api, request(a.id))
    a.result(a.call("echo", {"note": "again"}), result={"ok": True})
    assert a.call("echo", {"note": "again"})["reason"] == "same_call"
    status, out = chat(api, request(a.id))
    assert status == 200 and "same_call" in out["choices"][0]["message"]["content"]
    assert len(llm.requests) == 1


def test_wrap_up_is_injected_at_the_ratio(api: Api, llm: FakeLLM) -> None:
    a = Agent(api, limits={"max_model_calls": 4, "wrap_up_ratio": 0.5})
    chat(api, request(a.id))
    assert not any("Conclude now" in str(m) for m in llm.requests[-1]["messages"])
    chat(api, request(a.id))
    last = llm.requests[-1]["messages"][-1]
    assert last["role"] == "system" and "Conclude now" in last["content"]


def test_auth_task_line_and_streaming(api: Api, make_app: AppFactory, llm: FakeLLM) -> None:
    a = Agent(api)
    assert chat(api, request(a.id), token=None)[0] == 401
    assert chat(api, request(a.id), token="sk-wrong")[0] == 401
    status, out = chat(api, request(None))
    assert status == 400 and "loopstop-task" in out["detail"]
    status, out = chat(api, request(a.id, stream=True))
    assert status == 400 and "streaming" in out["detail"]
    status, out = chat(api, request("t00000000000000000000"))
    assert status == 404
    assert chat(api, {"model": "x", "messages": []})[0] == 400
    assert llm.requests == []
    loose = Api(
        make_app(model_gate={"upstream_url": llm.base, "allow_untracked": True}).test_client()
    )
    assert chat(loose, request(None))[0] == 200 and len(llm.requests) == 1


@pytest.mark.parametrize(("mode", "status"), [("429", 429), ("500", 500), ("slow", 504)])
def test_upstream_errors_are_relayed_openai_style(
    api: Api, llm: FakeLLM, mode: str, status: int
) -> None:
    a = Agent(api)
    llm.mode = mode
    got, out = chat(api, request(a.id))
    assert got == status and isinstance(out["error"], dict) and out["error"]["message"]


def test_models_list_and_no_prompt_in_logs(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    status, out = api.get("/v1/openai/models")
    assert status == 200 and out["data"][0]["id"] == "fake-model"
    a = Agent(api)
    with caplog.at_level(logging.INFO, logger="loopstop.decisions"):
        chat(api, request(a.id))
    text = caplog.text
    assert "model_gate" in text and "ORD-7" not in text and "support agent" not in text


def test_gate_without_upstream_is_a_clear_problem(make_app: AppFactory) -> None:
    api = Api(make_app().test_client())
    a = Agent(api)
    status, out = chat(api, request(a.id))
    assert status == 503 and out["type"].endswith("model-gate-not-configured")
    assert api.get(a.base)[1]["task"]["used"]["model_calls"] == 0  # nothing admitted


def test_the_n8n_credential_sends_the_token_as_api_key(api: Api) -> None:
    r = api.client.get("/v1/openai/models", headers={"Authorization": f"Bearer {N8N_TOKEN}"})
    assert r.status_code == 200

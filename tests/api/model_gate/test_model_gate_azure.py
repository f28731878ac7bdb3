"""The model gate speaking Azure OpenAI (DESIGN §5): OpenAI's formats under
``/v1/azure/openai/deployments/{deployment}/chat/completions`` and
``.../responses`` (``?api-version=``, the token in ``api-key``) and AI Foundry's
``/v1/azure/chat/completions`` (the token as a bearer), driven by the official
``openai`` client (``AzureOpenAI`` for the classic endpoint) against the app
served for real, with the stand-in model (its Azure paths) as the upstream."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import requests
from fake_llm import FakeLLM, serve
from flask import Flask
from test_model_gate_ollama import served

from conftest import N8N_TOKEN, Api, AppFactory

API_VERSION = "2025-03-01-preview"
REAL_KEY = "azure-upstream-secret"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "echo",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with serve() as fake:
        yield fake


def gate_app(make_app: AppFactory, llm: FakeLLM | None) -> Flask:
    upstreams = {"azure": {"url": llm.root, "api_key_env": "AZ_KEY"}} if llm is not None else {}
    return make_app(
        model_gate={"timeout_s": 2, "upstreams": upstreams}, environ={"AZ_KEY": REAL_KEY}
    )


@pytest.fixture
def gate(make_app: AppFactory, llm: FakeLLM) -> Iterator[tuple[str, Flask]]:
    app = gate_app(make_app, llm)
    with served(app) as base:
        yield base, app


def classic(base: str, token: str = N8N_TOKEN) -> openai.AzureOpenAI:
    """The client as n8n's classic credential makes it: Endpoint, API Version, api-key."""
    return openai.AzureOpenAI(
        api_key=token, api_version=API_VERSION, azure_endpoint=base + "/v1/azure", max_retries=0
    )


def system(key: str) -> dict[str, Any]:
    return {"role": "system", "content": f"You are a support agent.\nloopstop-task-key: {key}"}


def run_agent(c: openai.OpenAI, model: str, key: str, stream: bool) -> tuple[str, int]:
    """n8n's agent loop on Chat Completions: each call run, echoed back with
    ``content: []`` and the call id in its arguments, then its tool message."""
    messages: list[Any] = [system(key), {"role": "user", "content": "Echo a."}]
    executed = 0
    for _ in range(10):
        if stream:
            text, calls = "", {}
            for chunk in c.chat.completions.create(
                model=model, messages=messages, tools=TOOLS, stream=True
            ):
                for choice in chunk.choices:
                    text += choice.delta.content or ""
                    for call in choice.delta.tool_calls or []:
                        calls.setdefault(call.index, call)
            found = [(tc.id, tc.function.name) for tc in calls.values() if tc.function]
        else:
            answer = c.chat.completions.create(model=model, messages=messages, tools=TOOLS)
            message = answer.choices[0].message
            text = message.content or ""
            found = [(tc.id, tc.function.name) for tc in message.tool_calls or []]
        if not found:
            return text, executed
        for call_id, name in found:
            executed += 1
            args = json.dumps({"q": "again", "id": call_id})
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
            messages.append({"role": "assistant", "content": [], "tool_calls": [call]})
            messages.append({"role": "tool", "content": "[]", "tool_call_id": call_id})
    return "", executed


def task_by_key(app: Flask, key: str) -> dict[str, Any]:
    status, out = Api(app.test_client()).post("/v1/tasks", {"task_key": key})
    assert status in (200, 201)
    return dict(out)


@pytest.mark.parametrize("stream", [False, True], ids=["not-streamed", "streamed"])
def test_a_looping_model_is_stopped_on_the_classic_endpoint(
    gate: tuple[str, Flask], llm: FakeLLM, stream: bool
) -> None:
    base, app = gate
    text, executed = run_agent(classic(base), "gpt4o-dep", "az-1", stream)
    assert executed == 2 and len(llm.requests) == 3
    assert text.startswith("[loopstop] This task has ended: partial (same_call)")
    envelope = task_by_key(app, "az-1")["envelope"]
    assert (envelope["status"], envelope["reason"]) == ("partial", "same_call")
    # the path and its api-version query go upstream unchanged, the real key in api-key
    expected = f"/openai/deployments/gpt4o-dep/chat/completions?api-version={API_VERSION}"
    assert llm.paths == [expected] * 3
    for headers in llm.headers:
        assert headers["api-key"] == REAL_KEY and "authorization" not in headers
        assert not any(N8N_TOKEN in v for v in headers.values())


def test_a_codex_deployment_s_responses_route_and_ai_foundry_s_bearer_route(
    gate: tuple[str, Flask], llm: FakeLLM
) -> None:
    """n8n switches to the Responses API for a deployment named ``...codex...``
    (``{endpoint}/openai/deployments/{deployment}/responses``); AI Foundry sends the
    key as a bearer token to ``{endpoint}/chat/completions``."""
    base, app = gate
    llm.mode = "final"
    codex = openai.OpenAI(
        api_key="unused",
        base_url=base + "/v1/azure/openai/deployments/my-codex-dep",
        default_headers={"api-key": N8N_TOKEN},
        default_query={"api-version": API_VERSION},
        max_retries=0,
    )
    answer = codex.responses.create(
        model="my-codex-dep", input=[system("az-2"), {"role": "user", "content": "hi"}]
    )
    assert answer.output_text == "FINAL answer"
    foundry = openai.OpenAI(api_key=N8N_TOKEN, base_url=base + "/v1/azure", max_retries=0)
    done = foundry.chat.completions.create(
        model="gpt-4o", messages=[system("az-2"), {"role": "user", "content": "hi"}]
    )
    assert done.choices[0].message.content == "FINAL answer"
    assert llm.paths == [
        f"/openai/deployments/my-codex-dep/responses?api-version={API_VERSION}",
        "/chat/completions",
    ]
    assert [r["model"] for r in llm.requests] == ["my-codex-dep", "gpt-4o"]
    assert task_by_key(app, "az-2")["task"]["used"]["model_calls"] == 2


def test_an_endpoint_ending_in_a_slash_is_tolerated(gate: tuple[str, Flask], llm: FakeLLM) -> None:
    """n8n sends ``{endpoint}//openai/...`` for an Endpoint ending in ``/``; the
    upstream gets the path with one slash."""
    base, _ = gate
    llm.mode = "final"
    r = requests.post(
        f"{base}/v1/azure//openai/deployments/dep/chat/completions?api-version={API_VERSION}",
        json={"model": "dep", "messages": [system("az-3"), {"role": "user", "content": "hi"}]},
        headers={"api-key": N8N_TOKEN},
        timeout=10,
        allow_redirects=False,
    )
    assert r.status_code == 200, r.text
    assert llm.paths == [f"/openai/deployments/dep/chat/completions?api-version={API_VERSION}"]


def test_a_wrong_or_missing_key_is_a_401_and_nothing_reaches_the_upstream(
    gate: tuple[str, Flask], llm: FakeLLM
) -> None:
    base, _ = gate
    with pytest.raises(openai.AuthenticationError):
        run_agent(classic(base, "not-a-token-0123456789"), "dep", "az-4", stream=False)
    r = requests.post(
        f"{base}/v1/azure/openai/deployments/dep/chat/completions?api-version={API_VERSION}",
        json={"messages": [system("az-4")]},
        timeout=10,
    )
    assert r.status_code == 401
    assert llm.requests == []


def test_without_an_upstream_every_azure_turn_is_a_503(make_app: AppFactory) -> None:
    with (
        served(gate_app(make_app, None)) as base,
        pytest.raises(openai.InternalServerError) as caught,
    ):
        run_agent(classic(base), "dep", "az-5", stream=False)
    assert caught.value.status_code == 503


@pytest.mark.parametrize("stream", [False, True], ids=["not-streamed", "streamed"])
def test_an_upstream_429_is_relayed_in_openai_s_shape(
    gate: tuple[str, Flask], llm: FakeLLM, stream: bool
) -> None:
    base, _ = gate
    llm.mode = "429"
    with pytest.raises(openai.RateLimitError) as caught:
        run_agent(classic(base), "dep", f"az-6-{uuid.uuid4().hex[:6]}", stream)
    assert caught.value.message.endswith("fake 429")

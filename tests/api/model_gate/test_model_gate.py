"""The model gate: an OpenAI-compatible endpoint (Responses API and Chat
Completions, streamed or not) that admits and counts every model turn and
every tool call the model proposes, and ends an ended task with a plain
final message in the caller's own format. Driven through the app against a
real local fake upstream (tests/fake_llm.py)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gate_apis
import pytest
import requests
import sseclient
from fake_llm import FakeLLM, serve
from flask import Flask
from served import Sidecar
from task_agent import Agent

from conftest import ADMIN_TOKEN, N8N_TOKEN, REPO, SCOPED_TOKEN, Api, AppFactory, free_port
from sidecar.service import keys

CHAT = "/v1/openai/chat/completions"
RESPONSES = "/v1/openai/responses"
APIS = ["chat", "responses"]
GATE = {"default_model": "fake-model", "api_key_env": "UPSTREAM_KEY", "timeout_s": 1}


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with serve() as fake:
        yield fake


def gate_app(make_app: AppFactory, llm: FakeLLM, **config: Any) -> Flask:
    gate = {
        **GATE,
        "upstream_url": llm.base,
        "upstreams": gate_apis.upstreams(llm),
        **config.pop("model_gate", {}),
    }
    return make_app(model_gate=gate, environ={"UPSTREAM_KEY": "sk-upstream-secret"}, **config)


@pytest.fixture
def api(make_app: AppFactory, llm: FakeLLM) -> Api:
    return Api(gate_app(make_app, llm).test_client())


def system_text(task_id: str | None, extra: str = "") -> str:
    return "You are a support agent." + (f"\nloopstop-task: {task_id}" if task_id else "") + extra


def request(task_id: str | None, **extra: Any) -> dict[str, Any]:
    """A chat completions request as n8n's OpenAI Chat Model sends it."""
    return {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": system_text(task_id, extra.pop("system_extra", ""))},
            {"role": "user", "content": "Where is my order ORD-7?"},
            *extra.pop("history", []),
        ],
        "tools": [{"type": "function", "function": {"name": "echo", "parameters": {}}}],
        **extra,
    }


def responses_request(task_id: str | None, **extra: Any) -> dict[str, Any]:
    """A Responses API request as n8n 2.x's OpenAI Chat Model (v1.3) sends it: the
    System Message as a ``system`` input item."""
    return {
        "model": "fake-model",
        "input": [
            {
                "type": "message",
                "role": "system",
                "content": system_text(task_id, extra.pop("system_extra", "")),
            },
            {"type": "message", "role": "user", "content": "Where is my order ORD-7?"},
            *extra.pop("history", []),
        ],
        "tools": [{"type": "function", "name": "echo", "parameters": {}, "strict": None}],
        **extra,
    }


def build(which: str, task_id: str | None, **extra: Any) -> tuple[str, dict[str, Any]]:
    """A turn's path and body in ``which`` (``chat``, ``responses`` or one of
    :data:`gate_apis.OTHER`)."""
    if which == "chat":
        return CHAT, request(task_id, **extra)
    if which in gate_apis.OTHER:
        stream_it = bool(extra.pop("stream", False))
        system = system_text(task_id, extra.pop("system_extra", ""))
        if which == "azure":
            return gate_apis.build(
                which, system, stream_it, request(task_id, stream=stream_it, **extra)
            )
        return gate_apis.build(which, system, stream_it, {}, **extra)
    return RESPONSES, responses_request(task_id, **extra)


def chat(api: Api, body: dict[str, Any], token: str | None = "default") -> tuple[int, Any]:
    return api.post(CHAT, body, token=token)


def turn(api: Api, which: str, task_id: str | None, **extra: Any) -> tuple[int, Any]:
    path, body = build(which, task_id, **extra)
    return api.post(path, body)


def text_of(which: str, answer: dict[str, Any]) -> str:
    """The assistant text of a completion or a Response."""
    if which == "chat":
        return str(answer["choices"][0]["message"]["content"] or "")
    return "".join(
        part["text"]
        for item in answer["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


def calls_of(which: str, answer: dict[str, Any]) -> list[str]:
    """The call ids an answer proposes."""
    if which == "chat":
        return [c["id"] for c in answer["choices"][0]["message"].get("tool_calls") or []]
    return [i["call_id"] for i in answer["output"] if i["type"] == "function_call"]


def output_item(which: str, call_id: str, output: str) -> list[dict[str, Any]]:
    """The history an agent sends back after running a proposed call."""
    if which == "chat":
        return [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "echo", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": output},
        ]
    return [
        {"type": "function_call", "call_id": call_id, "name": "echo", "arguments": "{}"},
        {"type": "function_call_output", "call_id": call_id, "output": output},
    ]


def task_doc(api: Api, task_id: str) -> dict[str, Any]:
    """The stored task (its call history is not part of the HTTP view)."""
    app = api.client.application
    doc = app.extensions["loopstop"].store.get(keys.task("p", task_id))
    assert doc is not None
    return dict(doc)


def used(api: Api, task_id: str) -> dict[str, Any]:
    return dict(api.get(f"/v1/tasks/{task_id}")[1]["task"]["used"])


def stream(api: Api, path: str, body: dict[str, Any]) -> tuple[int, list[sseclient.Event], Any]:
    """Send a streamed request; returns the status, the events and the raw response."""
    r = api.client.post(path, json=body, headers={"Authorization": f"Bearer {N8N_TOKEN}"})
    if r.status_code != 200:
        return r.status_code, [], r.get_json(silent=True)
    assert r.mimetype == "text/event-stream"
    return 200, list(sseclient.SSEClient([r.get_data()]).events()), r


def jsons(events: list[sseclient.Event]) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in events if e.data != "[DONE]"]


# -- item 1: both APIs, counted ---------------------------------------------------------------


@pytest.mark.parametrize("which", APIS)
def test_turns_are_admitted_forwarded_and_counted(api: Api, llm: FakeLLM, which: str) -> None:
    a = Agent(api)
    llm.mode = "final"
    for _ in range(3):
        status, out = turn(api, which, a.id)
        assert status == 200 and text_of(which, out) == "FINAL answer"
    assert used(api, a.id)["model_calls"] == 3
    # Responses: input_tokens + output_tokens (7 + 3); chat: total_tokens (10)
    assert used(api, a.id)["tokens"] == 30
    assert len(llm.requests) == 3
    assert llm.paths == ["/v1" + ("/chat/completions" if which == "chat" else "/responses")] * 3
    assert llm.auth[-1] == "Bearer sk-upstream-secret"


def test_the_task_line_may_stand_in_instructions_or_a_developer_item(
    api: Api, llm: FakeLLM
) -> None:
    a = Agent(api)
    llm.mode = "final"
    body = {"model": "m", "instructions": f"Be brief.\nloopstop-task: {a.id}", "input": "hi"}
    assert api.post(RESPONSES, body)[0] == 200
    body = {
        "model": "m",
        "input": [
            {
                "role": "developer",
                "content": [{"type": "input_text", "text": f"loopstop-task: {a.id}"}],
            },
            {"role": "user", "content": "hi"},
        ],
    }
    assert api.post(RESPONSES, body)[0] == 200
    assert used(api, a.id)["model_calls"] == 2


@pytest.mark.parametrize("which", APIS)
def test_model_budget_answers_a_final_message_without_the_upstream(
    api: Api, llm: FakeLLM, which: str
) -> None:
    a = Agent(api, limits={"max_model_calls": 2})
    llm.mode = "final"
    for _ in range(2):
        assert turn(api, which, a.id)[0] == 200
    status, out = turn(api, which, a.id)
    assert status == 200
    assert "partial (model_budget)" in text_of(which, out)
    assert f"GET /v1/tasks/{a.id}" in text_of(which, out)
    if which == "chat":
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    else:
        assert out["object"] == "response" and out["status"] == "completed"
        (item,) = out["output"]
        assert (item["type"], item["role"], item["content"][0]["type"]) == (
            "message",
            "assistant",
            "output_text",
        )
        assert item["content"][0]["annotations"] == []  # n8n's client maps over them
    assert len(llm.requests) == 2
    assert api.get(a.base)[1]["envelope"]["reason"] == "model_budget"


@pytest.mark.parametrize("which", APIS)
def test_token_budget_ends_the_task_before_the_next_turn(
    api: Api, llm: FakeLLM, which: str
) -> None:
    a = Agent(api, limits={"max_tokens": 25})
    llm.mode = "final"
    for _ in range(3):
        turn(api, which, a.id)
    assert len(llm.requests) == 3  # 10 + 10 + 10 tokens: the third turn crossed the budget
    status, out = turn(api, which, a.id)
    assert status == 200 and "token_budget" in text_of(which, out)
    assert len(llm.requests) == 3


def test_a_task_stopped_through_its_tools_ends_the_agent(api: Api, llm: FakeLLM) -> None:
    a = Agent(api, limits={"max_same_call": 1})
    llm.mode = "final"
    chat(api, request(a.id))
    a.result(a.call("echo", {"note": "again"}), result={"ok": True})
    assert a.call("echo", {"note": "again"})["reason"] == "same_call"
    status, out = chat(api, request(a.id))
    assert status == 200 and "same_call" in out["choices"][0]["message"]["content"]
    assert len(llm.requests) == 1


@pytest.mark.parametrize("which", APIS)
def test_wrap_up_is_injected_at_the_ratio(api: Api, llm: FakeLLM, which: str) -> None:
    a = Agent(api, limits={"max_model_calls": 4, "wrap_up_ratio": 0.5})
    llm.mode = "final"
    key = "messages" if which == "chat" else "input"
    turn(api, which, a.id)
    assert not any("Conclude now" in str(m) for m in llm.requests[-1][key])
    turn(api, which, a.id)
    last = llm.requests[-1][key][-1]
    assert last["role"] == "system" and "Conclude now" in last["content"]


# -- item 2: streaming -------------------------------------------------------------------------


def test_a_responses_stream_is_relayed_and_its_usage_counted(api: Api, llm: FakeLLM) -> None:
    a = Agent(api)
    llm.mode = "final"
    status, events, _ = stream(api, RESPONSES, responses_request(a.id, stream=True))
    assert status == 200
    kinds = [e.event for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    deltas = [d["delta"] for d in jsons(events) if d["type"] == "response.output_text.delta"]
    assert deltas == ["FINAL ", "ans", "wer"]
    assert llm.requests[-1]["stream"] is True
    assert used(api, a.id) | {"tokens": used(api, a.id)["tokens"]} == used(api, a.id)
    assert (used(api, a.id)["model_calls"], used(api, a.id)["tokens"]) == (1, 10)


@pytest.mark.parametrize("client_asks", [False, True])
def test_a_chat_stream_asks_for_usage_and_shows_it_only_when_asked(
    api: Api, llm: FakeLLM, client_asks: bool
) -> None:
    a = Agent(api)
    llm.mode = "final"
    extra = {"stream_options": {"include_usage": True}} if client_asks else {}
    status, events, _ = stream(api, CHAT, request(a.id, stream=True, **extra))
    assert status == 200 and events[-1].data == "[DONE]"
    assert llm.requests[-1]["stream_options"]["include_usage"] is True
    chunks = jsons(events)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "FINAL answer"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    usage_chunks = [c for c in chunks if c.get("usage")]
    assert len(usage_chunks) == (1 if client_asks else 0)
    assert used(api, a.id)["tokens"] == 10


@pytest.mark.parametrize("which", APIS)
def test_text_is_relayed_before_the_upstream_has_finished(
    api: Api, llm: FakeLLM, which: str
) -> None:
    """The first text event reaches the agent while the upstream still holds the rest."""
    a = Agent(api)
    llm.mode = "text_then_tool"
    llm.hold = threading.Event()
    path, body = build(which, a.id, stream=True)
    r = api.client.post(
        path, json=body, headers={"Authorization": f"Bearer {N8N_TOKEN}"}, buffered=False
    )
    seen = b""
    chunks = iter(r.response)
    while b"FINAL " not in seen:
        seen += next(chunks)
    assert not llm.stream_done.is_set()  # the upstream is held after its first text event
    assert b'"function_call"' not in seen and b'"tool_calls"' not in seen  # held until decided
    llm.hold.set()
    rest = b"".join(chunks)
    r.close()
    # the upstream sent the rest (the gate may finish at its final event, before the
    # upstream's own thread has marked it: wait for the mark instead of racing it)
    assert llm.stream_done.wait(5)
    assert (b'"function_call"' if which == "responses" else b'"tool_calls"') in rest


@pytest.mark.parametrize("which", APIS)
def test_a_refused_streamed_turn_is_a_valid_stream(api: Api, llm: FakeLLM, which: str) -> None:
    a = Agent(api, limits={"max_model_calls": 1})
    llm.mode = "final"
    path, body = build(which, a.id, stream=True)
    assert stream(api, path, body)[0] == 200
    status, events, _ = stream(api, path, body)
    assert status == 200 and len(llm.requests) == 1
    if which == "responses":
        kinds = [e.event for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert "response.output_text.delta" in kinds
        done = jsons(events)[-1]["response"]
        assert done["status"] == "completed"
        assert "partial (model_budget)" in text_of("responses", done)
        assert [d["sequence_number"] for d in jsons(events)] == list(range(len(events)))
    else:
        chunks = jsons(events)
        assert events[-1].data == "[DONE]"
        assert "model_budget" in chunks[0]["choices"][0]["delta"]["content"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("which", APIS)
@pytest.mark.parametrize("mode", ["cut", "garbage"])
def test_a_broken_stream_ends_with_an_error_and_is_never_free(
    api: Api, llm: FakeLLM, which: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    a = Agent(api)
    llm.mode = mode
    path, body = build(which, a.id, stream=True)
    with caplog.at_level(logging.INFO, logger="loopstop.decisions"):
        status, events, _ = stream(api, path, body)
    assert status == 200  # the stream had begun: the error is its last event
    last = json.loads(events[-1].data)
    assert last["error"]["code"] in ("upstream_stream_cut", "bad_upstream_response")
    assert last["error"]["message"]
    assert used(api, a.id)["model_calls"] == 1
    assert used(api, a.id)["tokens"] > 0  # estimated
    line = json.loads(caplog.records[-1].getMessage())
    assert line["usage"] == "estimated" and line["decision"] == "upstream_error"


# -- item 3: tool calls at the gate ----------------------------------------------------------------


@pytest.mark.parametrize("which", APIS)
def test_a_repeated_tool_call_is_ended_at_max_same_call(api: Api, llm: FakeLLM, which: str) -> None:
    """The model repeats one call: the first ``max_same_call`` are relayed (and their
    outputs recorded as results), the next proposal is answered with the final message."""
    a = Agent(api, limits={"max_same_call": 2})
    llm.mode = "tool_call"
    history: list[dict[str, Any]] = []
    proposed: list[str] = []
    for n in range(2):
        status, out = turn(api, which, a.id, history=history)
        assert status == 200
        (call_id,) = calls_of(which, out)
        proposed.append(call_id)
        history = history + output_item(which, call_id, f"note {n} added")
    status, out = turn(api, which, a.id, history=history)
    assert status == 200 and calls_of(which, out) == []
    assert "partial (same_call)" in text_of(which, out)
    envelope = api.get(a.base)[1]["envelope"]
    assert (envelope["status"], envelope["reason"]) == ("partial", "same_call")
    calls = task_doc(api, a.id)["calls"]
    # the upstream's call ids are the task's call ids; both outputs came back as results
    assert [c["call_id"] for c in calls] == proposed
    assert [c["status"] for c in calls] == ["ok", "ok"]
    assert used(api, a.id)["tool_calls"] == 2


@pytest.mark.parametrize("which", APIS)
def test_an_output_identical_to_one_seen_is_idle(api: Api, llm: FakeLLM, which: str) -> None:
    a = Agent(api, limits={"max_same_call": 2, "max_idle": 3})
    llm.mode = "tool_call"
    history: list[dict[str, Any]] = []
    for _ in range(2):
        (call_id,) = calls_of(which, turn(api, which, a.id, history=history)[1])
        history = history + output_item(which, call_id, "the same output")
    turn(api, which, a.id, history=history)
    assert used(api, a.id)["idle"] == 1
    assert task_doc(api, a.id)["validated_revision"] == 0  # a model's output is never evidence


@pytest.mark.parametrize("which", APIS)
def test_a_streamed_proposal_is_decided_before_it_is_relayed(
    api: Api, llm: FakeLLM, which: str
) -> None:
    a = Agent(api, limits={"max_same_call": 1})
    llm.mode = "text_then_tool"
    path, body = build(which, a.id, stream=True)
    status, events, _ = stream(api, path, body)
    assert status == 200
    first = jsons(events)
    if which == "responses":
        assert [i["type"] for i in first[-1]["response"]["output"]] == ["message", "function_call"]
        (call_id,) = calls_of(which, first[-1]["response"])
    else:
        (call_id,) = [
            c["id"]
            for ch in first
            if ch["choices"]
            for c in ch["choices"][0]["delta"].get("tool_calls") or []
            if c.get("id")
        ]
    path, body = build(which, a.id, stream=True, history=output_item(which, call_id, "done"))
    status, events, _ = stream(api, path, body)
    assert status == 200
    raw = "".join(e.data for e in events)
    assert "function_call_arguments" not in raw and '"tool_calls"' not in raw
    assert "FINAL answer" in raw.replace('"', "").replace(",", "") or "FINAL " in raw
    assert "partial (same_call)" in raw
    if which == "responses":
        done = jsons(events)[-1]
        assert done["type"] == "response.completed"
        assert [i["type"] for i in done["response"]["output"]] == ["message", "message"]
    else:
        assert events[-1].data == "[DONE]"
        finishes = [c["choices"][0]["finish_reason"] for c in jsons(events) if c["choices"]]
        assert finishes[-1] == "stop" and "tool_calls" not in finishes
    assert api.get(a.base)[1]["envelope"]["reason"] == "same_call"


def test_a_tool_outside_the_policy_is_denied(make_app: AppFactory, llm: FakeLLM) -> None:
    api = Api(
        gate_app(make_app, llm, policies={"narrow": {"tools": ["search_orders"]}}).test_client()
    )
    a = Agent(api, policy="narrow")
    status, out = chat(api, request(a.id))
    assert status == 200 and "blocked (policy_denied)" in out["choices"][0]["message"]["content"]
    assert "tool_calls" not in out["choices"][0]["message"]


def test_the_configured_kind_of_a_tool_is_used(make_app: AppFactory, llm: FakeLLM) -> None:
    """A poll is exempt from the identical-call rule; a write is left to the flow's
    Loop Stop node (it needs an operation id) and relayed unadmitted."""
    app = gate_app(make_app, llm, tools={"echo": {"kind": "poll"}, "send": {"kind": "write"}})
    api = Api(app.test_client())
    a = Agent(api, limits={"max_same_call": 1})
    for _ in range(3):
        assert calls_of("chat", chat(api, request(a.id))[1])
    assert used(api, a.id)["polls"] == 3
    body = request(a.id)
    body["tools"] = [{"type": "function", "function": {"name": "send", "parameters": {}}}]
    out = chat(api, body)[1]
    assert out["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "send"
    assert used(api, a.id)["tool_calls"] == 3


# -- item 4: a task by key ---------------------------------------------------------------------


@pytest.mark.parametrize("which", APIS)
def test_a_task_key_line_creates_then_continues_the_task(
    make_app: AppFactory, llm: FakeLLM, which: str
) -> None:
    api = Api(
        gate_app(
            make_app, llm, policies={"tight": {"limits": {"max_model_calls": 2}}}
        ).test_client()
    )
    llm.mode = "final"
    lines = "\nloopstop-task-key: wf-9-T-1\nloopstop-workflow: wf-9\nloopstop-policy: tight"
    for _ in range(2):
        status, out = turn(api, which, None, system_extra=lines)
        assert status == 200 and text_of(which, out) == "FINAL answer"
    status, out = turn(api, which, None, system_extra=lines)
    assert "partial (model_budget)" in text_of(which, out)
    status, created = api.post("/v1/tasks", {"task_key": "wf-9-T-1", "workflow": "wf-9"})
    assert status == 200  # the same task: made by the gate under that key
    task = created["task"]
    assert (task["policy"], task["used"]["model_calls"]) == ("tight", 2)
    assert task_doc(api, task["task_id"])["attempt"] == 1  # every turn in one run
    assert len(llm.requests) == 2


def test_a_task_key_is_checked_as_post_tasks_checks_it(make_app: AppFactory, llm: FakeLLM) -> None:
    api = Api(gate_app(make_app, llm).test_client())
    status, out = chat(
        api, request(None, system_extra="\nloopstop-task-key: k\nloopstop-policy: nope")
    )
    assert status == 422 and "nope" in out["detail"]
    scoped = Api(api.client, token=SCOPED_TOKEN)
    status, _ = chat(
        scoped, request(None, system_extra="\nloopstop-task-key: k\nloopstop-workflow: wf-x")
    )
    assert status == 403
    status, out = chat(api, request(None, system_extra="\nloopstop-task-key: \x07"))
    assert status == 400
    assert llm.requests == []


# -- items 6 and 7: the credential test, bad input, bad upstreams -------------------------------


def test_auth_task_line_and_bad_bodies(api: Api, make_app: AppFactory, llm: FakeLLM) -> None:
    a = Agent(api)
    assert chat(api, request(a.id), token=None)[0] == 401
    assert chat(api, request(a.id), token="sk-wrong")[0] == 401
    status, out = chat(api, request(None))
    assert status == 400 and "loopstop-task" in out["detail"]
    status, out = chat(api, request("t00000000000000000000"))
    assert status == 404
    for path, body, field in [
        (CHAT, {"model": "x", "messages": []}, "messages"),
        (CHAT, {"model": "x", "input": "hi"}, "messages"),
        (CHAT, {"messages": [{"content": "no role"}]}, "messages.0.role"),
        (CHAT, {**request(a.id), "stream": "yes"}, "stream"),
        (RESPONSES, {"model": "x", "messages": [{"role": "user", "content": "hi"}]}, "input"),
        (RESPONSES, {"model": "x", "input": []}, "input"),
        (RESPONSES, {"model": "x", "input": ["text"]}, "input.0"),
        (RESPONSES, {"model": "x", "input": "hi", "instructions": 3}, "instructions"),
        (RESPONSES, {"model": 7, "input": "hi"}, "model"),
    ]:
        status, out = api.post(path, body)
        assert status == 400, (path, body, out)
        assert out["type"].endswith("malformed-request")
        assert out["errors"][0]["loc"] == ["body", *field.split(".")], out
    assert llm.requests == []
    assert used(api, a.id)["model_calls"] == 0
    loose = Api(
        make_app(model_gate={"upstream_url": llm.base, "allow_untracked": True}).test_client()
    )
    llm.mode = "final"
    assert chat(loose, request(None))[0] == 200
    assert loose.post(RESPONSES, responses_request(None))[0] == 200
    assert len(llm.requests) == 2


@pytest.mark.parametrize("which", APIS)
@pytest.mark.parametrize(
    ("mode", "status"),
    [("429", 429), ("500", 500), ("slow", 504), ("garbage", 502), ("502_html", 502), ("cut", 502)],
)
def test_upstream_errors_are_relayed_openai_style_and_counted(
    api: Api, llm: FakeLLM, which: str, mode: str, status: int
) -> None:
    a = Agent(api)
    llm.mode = mode
    got, out = turn(api, which, a.id)
    assert got == status and isinstance(out["error"], dict) and out["error"]["message"]
    assert used(api, a.id)["model_calls"] == 1 and used(api, a.id)["tokens"] > 0


@pytest.mark.parametrize("which", APIS)
def test_a_stream_that_never_comes_is_an_error_in_time(api: Api, llm: FakeLLM, which: str) -> None:
    a = Agent(api)
    llm.mode = "slow"  # 2 s; the gate's timeout_s is 1
    path, body = build(which, a.id, stream=True)
    status, _, out = stream(api, path, body)
    assert status == 504 and out["error"]["code"] == "timeout"


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
    status, out = api.get("/v1/openai/models")
    assert status == 503 and out["type"].endswith("model-gate-not-configured")
    a = Agent(api)
    for path, body in (build("chat", a.id), build("responses", a.id)):
        status, out = api.post(path, body)
        assert status == 503 and out["type"].endswith("model-gate-not-configured")
    assert api.get(a.base)[1]["task"]["used"]["model_calls"] == 0  # nothing admitted


def test_an_unreachable_upstream_fails_the_credential_test(make_app: AppFactory) -> None:
    """n8n's credential test lists models: it must not go green on a gate whose
    every turn would fail."""
    from conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}/v1"
    api = Api(
        make_app(
            model_gate={**GATE, "upstream_url": dead}, environ={"UPSTREAM_KEY": "k"}
        ).test_client()
    )
    status, out = api.get("/v1/openai/models")
    assert status == 502 and out["error"]["code"] == "upstream_unreachable"


def test_the_n8n_credential_sends_the_token_as_api_key(api: Api) -> None:
    r = api.client.get("/v1/openai/models", headers={"Authorization": f"Bearer {N8N_TOKEN}"})
    assert r.status_code == 200


# -- under gunicorn: sync and gthread workers ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("which", APIS)
def test_streams_are_relayed_under_gunicorn(
    tmp_path: Path, llm: FakeLLM, threads: int, which: str
) -> None:
    """The first text event is relayed through a real server while the upstream holds
    the rest, under the sync worker (1 thread) and the gthread worker alike."""
    config = tmp_path / "loopstop.yaml"
    config.write_text(f"model_gate: {{upstream_url: '{llm.base}', timeout_s: 10}}\n")
    env = {"LOOPSTOP_CONFIG": str(config), "LOOPSTOP_STORE": f"sqlite:///{tmp_path / 'g.db'}"}
    server = Sidecar(tmp_path, env, workers=1, extra=("--threads", str(threads))).start()
    try:
        task_id = requests.post(server.base + "/v1/tasks", json={}, timeout=5).json()["task"][
            "task_id"
        ]
        llm.mode = "final"
        llm.hold = threading.Event()
        path, body = build(which, task_id, stream=True)
        with requests.post(
            server.base + path,
            json=body,
            stream=True,
            timeout=10,
        ) as r:
            assert r.status_code == 200 and r.headers["Content-Type"].startswith(
                "text/event-stream"
            )
            seen = b""
            chunks = r.iter_content(chunk_size=None)
            while b"FINAL " not in seen:
                seen += next(chunks)
            assert not llm.stream_done.is_set()
            llm.hold.set()
            rest = b"".join(chunks)
        assert (b"response.completed" if which == "responses" else b"[DONE]") in rest
        used_now = requests.get(f"{server.base}/v1/tasks/{task_id}", timeout=5).json()
        assert used_now["task"]["used"]["tokens"] == 10
    finally:
        server.stop()


# -- money (DESIGN §3 max_cost, §5): reserve the worst case, settle the real cost -------

#: 1 currency unit per output token, input free: a turn's cost is its output tokens.
PRICED = {"prices": {"fake-model": {"input_per_mtok": 0, "output_per_mtok": 1_000_000}}}


def _money_body(which: str) -> dict[str, Any]:
    # Each turn allows at most 5 output tokens: its reservation is 5.
    if which in gate_apis.OTHER:
        return gate_apis.money_body(which, 5)
    return {"max_tokens": 5} if which == "chat" else {"max_output_tokens": 5}


@pytest.mark.parametrize("which", APIS)
def test_a_money_budget_ends_the_task_before_a_turn_could_pass_it(
    make_app: AppFactory, llm: FakeLLM, which: str
) -> None:
    """Reported usage costs 3 a turn and each turn reserves 5: with max_cost 10 the
    third turn (6 spent + 5 reserved) is refused without calling the upstream."""
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    a = Agent(api, limits={"max_cost": 10})
    llm.mode = "final"
    for _ in range(2):
        status, out = turn(api, which, a.id, **_money_body(which))
        assert status == 200 and text_of(which, out) == "FINAL answer"
    status, out = turn(api, which, a.id, **_money_body(which))
    assert status == 200 and "partial (cost_budget)" in text_of(which, out)
    assert len(llm.requests) == 2
    task = api.get(f"/v1/tasks/{a.id}")[1]
    assert task["envelope"]["reason"] == "cost_budget"
    assert task["task"]["used"]["cost"] == 6.0 and task["task"]["used"]["tokens"] == 20


@pytest.mark.parametrize("which", APIS)
def test_a_turn_without_usage_is_charged_its_reservation(
    make_app: AppFactory, llm: FakeLLM, which: str
) -> None:
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    a = Agent(api, limits={"max_cost": 12})
    llm.mode = "no_usage"
    for _ in range(2):
        assert turn(api, which, a.id, **_money_body(which))[0] == 200
    assert used(api, a.id)["cost"] == 10.0  # never free: the worst case of each turn
    status, out = turn(api, which, a.id, **_money_body(which))
    assert (
        status == 200 and "partial (cost_budget)" in text_of(which, out) and len(llm.requests) == 2
    )


@pytest.mark.parametrize("which", APIS)
def test_an_upstream_error_costs_no_money_but_counts_the_turn(
    make_app: AppFactory, llm: FakeLLM, which: str
) -> None:
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    a = Agent(api, limits={"max_cost": 10})
    llm.mode = "429"
    status, _ = turn(api, which, a.id, **_money_body(which))
    assert status == 429
    spent = used(api, a.id)
    assert (spent["cost"], spent["model_calls"]) == (0.0, 1)
    llm.mode = "final"
    assert text_of(which, turn(api, which, a.id, **_money_body(which))[1]) == "FINAL answer"


def test_an_unpriced_model_is_refused_when_the_task_has_a_money_budget(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    a = Agent(api, limits={"max_cost": 10})
    status, out = turn(api, "chat", a.id, model="unpriced-model")
    assert status == 422 and out["errors"][0]["loc"] == ["body", "model"]
    assert llm.requests == [] and used(api, a.id)["model_calls"] == 0
    b = Agent(api)  # no money budget: an unpriced model is counted in tokens only
    llm.mode = "final"
    assert turn(api, "chat", b.id, model="unpriced-model")[0] == 200


def test_a_money_budget_given_at_resume_refuses_an_unpriced_model_from_then_on(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    """A task without a money budget may use an unpriced model; once a resume gives it
    one (``extend.max_cost``), the same worker refuses that model: a task's limits are
    read each turn, never kept from an earlier one."""
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    a = Agent(api)
    llm.mode = "final"
    assert turn(api, "chat", a.id, model="unpriced-model")[0] == 200
    admin = Api(api.client, token=ADMIN_TOKEN)
    assert admin.post(f"/v1/tasks/{a.id}/stop", {"reason": "budget it"})[0] == 200
    status, out = admin.post(
        f"/v1/tasks/{a.id}/resume", {"reason": "with a budget", "extend": {"max_cost": 10}}
    )
    assert status == 200, out
    status, out = turn(api, "chat", a.id, model="unpriced-model")
    assert status == 422 and out["errors"][0]["loc"] == ["body", "model"], out
    assert len(llm.requests) == 1


def test_a_task_its_own_tool_outputs_end_answers_its_end_whatever_the_models_price(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    """The money-budget check reads the task the turn is admitted on: a turn whose
    tool outputs end the task (here ``no_progress``) gets the task's final message,
    not a 422 for its unpriced model, by key line as by id line."""
    policy = {"money": {"limits": {"max_cost": 10, "max_idle": 1, "max_same_call": 5}}}
    api = Api(gate_app(make_app, llm, model_gate=PRICED, policies=policy).test_client())
    lines = "\nloopstop-task-key: k-1\nloopstop-workflow: wf-9\nloopstop-policy: money"
    llm.mode = "tool_call"
    history: list[dict[str, Any]] = []
    for _ in range(2):
        status, out = turn(api, "chat", None, system_extra=lines, history=history, max_tokens=5)
        assert status == 200, out
        (call_id,) = calls_of("chat", out)
        history = history + output_item("chat", call_id, "the same output")
    asked = len(llm.requests)
    status, out = turn(
        api, "chat", None, system_extra=lines, history=history, model="unpriced-model"
    )
    assert status == 200, out
    assert "has ended: partial (no_progress)" in text_of("chat", out)
    assert len(llm.requests) == asked


@pytest.mark.all_stores  # a race on the store
def test_concurrent_turns_of_one_task_never_overspend(make_app: AppFactory, llm: FakeLLM) -> None:
    """Eight turns at once, each reserving 5 against max_cost 12: at most two are
    forwarded, and what was settled never passes the budget."""
    from concurrent.futures import ThreadPoolExecutor

    app = gate_app(make_app, llm, model_gate=PRICED)
    api = Api(app.test_client())
    a = Agent(api, limits={"max_cost": 12})
    llm.mode = "slow"

    def one(_: int) -> int:
        return Api(app.test_client()).post(*build("chat", a.id, max_tokens=5))[0]

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(one, range(8)))
    assert set(statuses) <= {200, 504}
    assert len(llm.requests) <= 2
    assert used(api, a.id)["cost"] <= 12


@pytest.mark.all_stores  # a race on the store
def test_concurrent_answered_turns_settle_within_the_budget(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    """Eight turns at once that the upstream answers (after 2 s, each costing 3 and
    reserving 5) against max_cost 12: the in-flight reservations refuse all but two,
    the two settle their real cost, and the money spent never passes the budget."""
    from concurrent.futures import ThreadPoolExecutor

    app = gate_app(make_app, llm, model_gate={**PRICED, "timeout_s": 10})
    api = Api(app.test_client())
    a = Agent(api, limits={"max_cost": 12})
    llm.mode = "slow"

    def one(_: int) -> tuple[int, str]:
        status, out = Api(app.test_client()).post(*build("chat", a.id, max_tokens=5))
        return status, text_of("chat", out)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(8)))
    assert {status for status, _ in answers} == {200}
    forwarded = len(llm.requests)
    assert forwarded == 2  # 5 + 5 reserved at once; a third would make 15
    refused = [text for _, text in answers if "partial (cost_budget)" in text]
    assert len(refused) == 8 - forwarded
    spent = used(api, a.id)
    assert spent["cost"] == 3.0 * forwarded <= 12
    assert spent["model_calls"] == forwarded


@pytest.mark.parametrize(
    "arguments",
    ['{"q": NaN}', "[" * 100_000 + "]" * 100_000, '{"q": "\\ud800"}', "\ud800", "not json"],
)
def test_odd_tool_call_arguments_are_fingerprinted_never_a_500(api: Api, arguments: str) -> None:
    """Whatever a model writes as a call's arguments, the call can be admitted."""
    from sidecar.gate.wire import OPENAI_CHAT

    answer = {
        "choices": [
            {
                "message": {
                    "tool_calls": [{"id": "c1", "function": {"name": "s", "arguments": arguments}}]
                }
            }
        ]
    }
    (call,) = OPENAI_CHAT.read_answer(answer).proposals
    a = Agent(api)
    out = a.call(call.tool, call.args, call_id="c1")
    assert out["decision"] == "execute"


@pytest.mark.parametrize(
    "answer",
    [
        {"choices": [{"message": {"tool_calls": [{"id": "c1", "function": "search"}]}}]},
        {"choices": [{"message": "a string"}]},
        {"choices": "nope"},
        {"output": "nope"},
    ],
)
def test_malformed_proposals_are_read_as_none_or_empty(answer: dict[str, Any]) -> None:
    from sidecar.gate.wire import OPENAI_CHAT, OPENAI_RESPONSES
    from sidecar.gate.wire.base import NotThisAnswer

    for adapter in (OPENAI_CHAT, OPENAI_RESPONSES):
        try:
            read = adapter.read_answer(answer)
        except NotThisAnswer:
            continue  # not this API's answer at all: refused as a bad upstream answer
        for call in read.proposals:
            assert call.tool == ""


def _dripping_upstream(stream: bool) -> type:
    """An upstream that answers 200 and then drips: SSE comments, or one byte of a body."""
    from local_http import JsonHandler

    class Drip(JsonHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            if stream:
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "1000")
            self.end_headers()
            try:
                for _ in range(50):
                    piece = b": ping\n\n" if stream else b" "
                    if stream:
                        piece = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                    self.wfile.write(piece)
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass  # the gate gave up: what this test wants

    return Drip


@pytest.mark.parametrize("stream_it", [True, False])
def test_an_upstream_that_drips_is_cut_at_the_gate_timeout(
    make_app: AppFactory, stream_it: bool
) -> None:
    """``timeout_s`` bounds the whole exchange, not each read: keep-alive comments
    or a trickled body cannot hold a worker (the turn is still counted)."""
    from local_http import running

    with running(_dripping_upstream(stream_it)) as base:
        api = Api(
            make_app(
                model_gate={**GATE, "upstream_url": base}, environ={"UPSTREAM_KEY": "k"}
            ).test_client()
        )
        a = Agent(api)
        started = time.monotonic()
        path, body = build("chat", a.id, stream=stream_it)
        if stream_it:
            status, events, _ = stream(api, path, body)
            assert status == 200 and any("timeout" in e.data for e in events)
        else:
            status, out = api.post(path, body)
            assert status == 504 and out["error"]["code"] == "timeout"
        assert time.monotonic() - started < 5  # timeout_s is 1; the drip would take 10 s
        assert used(api, a.id)["model_calls"] == 1 and used(api, a.id)["tokens"] > 0


# -- the docs' offline walk-through, with the shipped files ----------------------------------------

EXAMPLES = REPO / "workflows-examples"


@pytest.mark.slow  # runs the CLI in a process
@pytest.mark.slow
def test_the_offline_walk_through_ends_a_looping_model(tmp_path: Path) -> None:
    """docs/loops/model-gate.md, "Try it without a model account": the stand-in model as
    its command starts it, the sidecar on the examples' configuration as shipped (only
    the stand-in's port moved to a free one); the same turn three times: two proposals of
    the tool call, then the gate's final message (the third proposal denied); a fourth
    turn is answered by the gate without calling the model."""
    port = free_port()
    model = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "stand-in" / "model.py"), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert model.stdout is not None
        assert f"127.0.0.1:{port}/v1" in model.stdout.readline()  # listening
        config = tmp_path / "loopstop.yaml"
        shipped = (EXAMPLES / "loopstop.yaml").read_text()
        assert "http://127.0.0.1:8791/v1" in shipped
        config.write_text(shipped.replace(":8791/", f":{port}/"))
        token = "try-it-token-0123456789"
        env = {
            "LOOPSTOP_CONFIG": str(config),
            "LOOPSTOP_STORE": f"sqlite:///{tmp_path / 'loopstop.db'}",
            "LOOPSTOP_TOKEN_N8N": token,
        }
        server = Sidecar(tmp_path, env, workers=1).start()
        try:
            headers = {"Authorization": f"Bearer {token}"}
            body = {
                "model": "gpt-5-mini",
                "input": [
                    {"role": "system", "content": "loopstop-task-key: try-1"},
                    {"role": "user", "content": "Add a note to ticket T-1."},
                ],
                "tools": [
                    {
                        "type": "function",
                        "name": "add_note",
                        "parameters": {
                            "type": "object",
                            "properties": {"note": {"type": "string"}},
                        },
                    }
                ],
            }
            answers = [
                requests.post(
                    server.base + "/v1/openai/responses", json=body, headers=headers, timeout=30
                ).json()["output"]
                for _ in range(3)
            ]
            assert [[o["type"] for o in a] for a in answers] == [
                ["function_call"],
                ["function_call"],
                ["message"],
            ]
            assert answers[0][0]["name"] == "add_note"
            text = answers[2][0]["content"][0]["text"]
            assert text.startswith("[loopstop] This task has ended: partial (same_call)")
            task = requests.post(
                server.base + "/v1/tasks", json={"task_key": "try-1"}, headers=headers, timeout=10
            ).json()
            assert (task["envelope"]["status"], task["envelope"]["reason"]) == (
                "partial",
                "same_call",
            )
            assert task["task"]["used"]["model_calls"] == 3  # the third proposal was denied
            fourth = requests.post(
                server.base + "/v1/openai/responses", json=body, headers=headers, timeout=30
            ).json()["output"]
            assert fourth[0]["content"][0]["text"] == text  # the gate answers it itself
            task = requests.post(
                server.base + "/v1/tasks", json={"task_key": "try-1"}, headers=headers, timeout=10
            ).json()
            assert task["task"]["used"]["model_calls"] == 3  # the model was not called again
        finally:
            server.stop()
    finally:
        model.terminate()
        model.wait(10)
        if model.stdout is not None:
            model.stdout.close()


# -- a hostile upstream (attack items 3-15) --------------------------------------------------------

STREAMS = [False, True]
#: Every API the gate speaks, each through its own adapter.
EVERY_API = [*APIS, *gate_apis.OTHER]


def ask(
    api: Api, which: str, stream_it: bool, task_id: str | None, **extra: Any
) -> tuple[int, str, list[str], Any]:
    """One turn, streamed or not: the status, the assistant text, the call ids that
    reached the agent, and the answer (its body, or its events)."""
    path, body = build(which, task_id, stream=stream_it, **extra)
    if which in gate_apis.OTHER:
        return gate_apis.ask(api, which, stream_it, path, body)
    if not stream_it:
        status, out = api.post(path, body)
        if status != 200:
            return status, "", [], out
        return status, text_of(which, out), calls_of(which, out), out
    status, events, raw = stream(api, path, body)
    if status != 200:
        return status, "", [], raw
    chunks = jsons(events)
    if which == "chat":
        deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
        text = "".join(d.get("content") or "" for d in deltas)
        ids = [t["id"] for d in deltas for t in d.get("tool_calls") or [] if "id" in t]
        return status, text, ids, events
    text = "".join(c["delta"] for c in chunks if c.get("type") == "response.output_text.delta")
    ids = [
        c["item"]["call_id"]
        for c in chunks
        if c.get("type") == "response.output_item.added" and c["item"]["type"] == "function_call"
    ]
    return status, text, ids, events


def ends_with_error(which: str, events: list[sseclient.Event], code: str) -> None:
    """The stream's last event is an error the API's client raises, naming ``code``."""
    last = json.loads(events[-1].data)
    assert last.get("type") == "error" and last["error"]["code"] == code, last


@pytest.mark.security
@pytest.mark.parametrize("stream_it", STREAMS)
@pytest.mark.parametrize("which", EVERY_API)
def test_item3_a_call_id_repeated_in_one_proposal_is_one_call(
    api: Api, llm: FakeLLM, which: str, stream_it: bool
) -> None:
    """Attack item 3: 5 copies of one call (same id and arguments) in one proposal,
    max_tool_calls 3, max_same_call 2: no copy reaches the agent, the repeat is a
    denied duplicate and counted (2 calls), the task goes on.

    An API without call ids (Gemini, Ollama) cannot repeat one: the gate numbers
    the 5 copies apart, so they are 5 identical calls, and the identical-call
    rule ends the task at the third (2 counted); nothing reaches the agent either way."""
    a = Agent(api, limits={"max_tool_calls": 3, "max_same_call": 2})
    llm.mode = "repeat_call"
    status, text, ids, _ = ask(api, which, stream_it, a.id)
    assert status == 200 and ids == []
    assert used(api, a.id)["tool_calls"] == 2
    envelope = api.get(a.base)[1]["envelope"]
    if which in gate_apis.ID_LESS:
        assert "partial (same_call)" in text and envelope["reason"] == "same_call"
    else:
        assert "duplicate_call" in text and envelope is None


@pytest.mark.security
@pytest.mark.parametrize("stream_it", STREAMS)
@pytest.mark.parametrize("which", APIS)
def test_item4_an_upstream_that_reuses_call_ids_makes_new_calls(
    api: Api, llm: FakeLLM, which: str, stream_it: bool
) -> None:
    """Attack item 4: ``call_0`` every turn with new arguments: each turn's call is a
    new call, relayed and counted, its output recorded on it."""
    a = Agent(api, limits={"max_tool_calls": 5})
    llm.mode = "fresh_ids"
    history: list[dict[str, Any]] = []
    for n in range(3):
        status, _, ids, _ = ask(api, which, stream_it, a.id, history=history)
        assert status == 200 and ids == ["call_0"]
        history = history + output_item(which, "call_0", f"page {n}")
    ask(api, which, stream_it, a.id, history=history)
    assert used(api, a.id)["tool_calls"] == 4
    assert [c["status"] for c in task_doc(api, a.id)["calls"]] == ["ok"] * 3 + ["pending"]


@pytest.mark.security
@pytest.mark.parametrize("stream_it", STREAMS)
@pytest.mark.parametrize("which", APIS)
def test_item4_one_id_with_two_argument_sets_in_one_proposal_is_denied(
    api: Api, llm: FakeLLM, which: str, stream_it: bool
) -> None:
    """Attack item 4: one id, two argument sets, one proposal: a denial in the API's
    own shape (never a 409, never a stream that just stops)."""
    a = Agent(api)
    llm.mode = "split_id"
    status, text, ids, out = ask(api, which, stream_it, a.id)
    assert status == 200 and ids == [] and "duplicate_call" in text
    if stream_it and which == "chat":
        assert out[-1].data == "[DONE]"
    elif stream_it:
        assert json.loads(out[-1].data)["type"] == "response.completed"


def _redis_gate(tmp_path: Path, llm: FakeLLM, **gate: Any) -> tuple[Any, Api, Any]:
    from conftest import SECRET, TOKENS_CONFIG, TOKENS_ENV, RedisServer
    from sidecar.app import create_app

    server = RedisServer(tmp_path / "redis").start()
    config = {
        "store": server.url,
        "store_timeout_s": 0.3,
        "tokens": TOKENS_CONFIG,
        "model_gate": {**GATE, "upstream_url": llm.base, "timeout_s": 10, **gate},
    }
    env = {"LOOPSTOP_SECRET": SECRET, "UPSTREAM_KEY": "sk-upstream-secret", **TOKENS_ENV}
    app = create_app(config, environ=env)
    return server, Api(app.test_client()), app


def _paused_while_answering(server: Any, api: Api, path: str, body: dict[str, Any]) -> list[Any]:
    """Send a streamed turn, pause the store once it is admitted, let the upstream
    answer and read the whole stream; the store is let go after."""
    import os
    import signal

    r = api.client.post(
        path, json=body, headers={"Authorization": f"Bearer {N8N_TOKEN}"}, buffered=False
    )
    assert r.status_code == 200
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        data = b"".join(r.response)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    return list(sseclient.SSEClient([data]).events())


@pytest.mark.security
@pytest.mark.parametrize("which", APIS)
def test_item4_a_store_outage_mid_stream_ends_the_stream_with_an_error_event(
    tmp_path: Path, llm: FakeLLM, which: str
) -> None:
    """Attack item 4: the store fails while a streamed proposal is decided: the
    stream ends with an error event in the API's shape, nothing of the proposal
    relayed."""
    server, api, _ = _redis_gate(tmp_path, llm)
    try:
        a = Agent(api)
        llm.mode = "tool_call"
        events = _paused_while_answering(server, api, *build(which, a.id, stream=True))
        ends_with_error(which, events, "store_unavailable")
        raw = "".join(e.data for e in events)
        assert "function_call_arguments" not in raw and '"tool_calls"' not in raw
    finally:
        server.stop()


@pytest.mark.security
@pytest.mark.parametrize("which", APIS)
def test_item11_a_settle_the_store_refused_is_applied_once_it_is_back(
    tmp_path: Path, llm: FakeLLM, which: str
) -> None:
    """Attack item 11: the store pauses while the upstream answers: the turn's settle
    is retried, kept, and applied before the worker's next turn (its tokens and cost
    counted, its reservation released), never held for ever."""
    server, api, _ = _redis_gate(tmp_path, llm, **PRICED)
    try:
        a = Agent(api, limits={"max_cost": 100})
        llm.mode = "final"
        llm.hold = threading.Event()
        llm.hold.set()
        path, body = build(which, a.id, stream=True, **_money_body(which))
        events = _paused_while_answering(server, api, path, body)
        assert "FINAL " in "".join(e.data for e in events)
        assert used(api, a.id)["reserved_cost"] == 5.0  # not yet settled: the store was away
        assert ask(api, which, False, a.id, **_money_body(which))[0] == 200
        spent = used(api, a.id)
        assert (spent["tokens"], spent["cost"], spent["reserved_cost"]) == (20, 6.0, 0.0)
    finally:
        server.stop()


@pytest.mark.security
def test_item5_a_call_streamed_only_as_item_events_is_decided(api: Api, llm: FakeLLM) -> None:
    """Attack item 5: a Responses stream whose response.completed leaves out a call it
    streamed as item events: that call is admitted and counted, so the same call is
    ended at max_same_call as any other."""
    a = Agent(api, limits={"max_same_call": 2})
    llm.mode = "hidden_call"
    history: list[dict[str, Any]] = []
    relayed = []
    for n in range(4):
        status, _, ids, _ = ask(api, "responses", True, a.id, history=history)
        assert status == 200
        relayed += ids
        for call_id in ids:
            history = history + output_item("responses", call_id, f"note {n}")
    assert len(relayed) == 2 and used(api, a.id)["tool_calls"] == 2
    assert api.get(a.base)[1]["envelope"]["reason"] == "same_call"


@pytest.mark.security
def test_item6_every_choice_is_reserved(make_app: AppFactory, llm: FakeLLM) -> None:
    """Attack item 6: ``n: 4`` with at most 5 output tokens reserves 4 x 5: against
    max_cost 19 the turn is refused without calling the upstream."""
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    a = Agent(api, limits={"max_cost": 19})
    llm.mode = "final"
    status, text, _, _ = ask(api, "chat", False, a.id, n=4, max_tokens=5)
    assert status == 200 and "partial (cost_budget)" in text and llm.requests == []
    b = Agent(api, limits={"max_cost": 20})
    assert ask(api, "chat", False, b.id, n=4, max_tokens=5)[1] == "FINAL answer"


@pytest.mark.security
def test_item6_a_request_whose_cost_is_held_upstream_is_refused_under_a_money_budget(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    """Attack item 6: ``previous_response_id`` (context held upstream) or an image by
    URL cannot be bounded: under a money budget a 422 naming the field, nothing
    forwarded or counted; without one the turn goes on."""
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    a = Agent(api, limits={"max_cost": 1000})
    status, out = turn(api, "responses", a.id, previous_response_id="resp_1")
    assert status == 422 and out["errors"][0]["loc"] == ["body", "previous_response_id"]
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    history = [{"role": "user", "content": [{"type": "text", "text": "see"}, image]}]
    status, out = turn(api, "chat", a.id, history=history)
    assert status == 422 and out["errors"][0]["loc"] == ["body", "messages", "2", "content", "1"]
    assert llm.requests == [] and used(api, a.id)["model_calls"] == 0
    llm.mode = "final"
    assert turn(api, "responses", Agent(api).id, previous_response_id="resp_1")[0] == 200


@pytest.mark.security
@pytest.mark.parametrize("which", EVERY_API)
def test_item6_a_turn_that_costs_past_the_budget_ends_the_task_and_names_the_overshoot(
    make_app: AppFactory, llm: FakeLLM, which: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Attack item 6: an upstream that reports 50 output tokens on a turn allowed 5:
    the money is counted as spent, and the task ends at that turn, cost_budget, the
    overshoot in the envelope's used and the decision log."""
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    a = Agent(api, limits={"max_cost": 40})
    llm.mode = "overspend"
    with caplog.at_level(logging.INFO):
        assert ask(api, which, False, a.id, **_money_body(which))[0] == 200
    envelope = api.get(a.base)[1]["envelope"]
    assert envelope is not None and envelope["reason"] == "cost_budget"
    assert envelope["used"]["cost"] == 50.0 and envelope["used"]["cost_overshoot"] == 10.0
    assert any('"cost_overshoot":10.0' in r.getMessage() for r in caplog.records)


@pytest.mark.security
def test_item6_a_priced_request_without_output_limit_is_sent_the_reserved_one(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    """Attack item 6: the output a reservation assumes is the limit the upstream is sent."""
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    llm.mode = "final"
    assert turn(api, "chat", Agent(api, limits={"max_cost": 10_000}).id)[0] == 200
    assert turn(api, "responses", Agent(api, limits={"max_cost": 10_000}).id)[0] == 200
    assert llm.requests[0]["max_completion_tokens"] == 4096
    assert llm.requests[1]["max_output_tokens"] == 4096


@pytest.mark.security
@pytest.mark.parametrize(
    ("which", "field"),
    [
        ("anthropic", "max_tokens"),
        ("gemini", "generationConfig.maxOutputTokens"),
        ("ollama", "options.num_predict"),
        ("azure", "max_completion_tokens"),
    ],
)
def test_item6_every_api_is_sent_the_reserved_output_limit_in_its_own_field(
    make_app: AppFactory, llm: FakeLLM, which: str, field: str
) -> None:
    """Attack item 6 through each adapter: a priced request that sets no limit (an
    Anthropic body without max_tokens, Ollama's -1) is sent the reserved 4096."""
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    llm.mode = "final"
    unset = {"anthropic": {"max_tokens": None}, "ollama": {"options": {"num_predict": -1}}}
    a = Agent(api, limits={"max_cost": 10_000})
    assert ask(api, which, False, a.id, **unset.get(which, {}))[1] == "FINAL answer"
    sent: Any = llm.requests[-1]
    for key in field.split("."):
        sent = sent[key]
    assert sent == 4096
    assert used(api, a.id)["cost"] == 3.0


@pytest.mark.security
@pytest.mark.parametrize(
    ("which", "extra", "loc"),
    [
        ("anthropic", {"container": "container_1"}, ["container"]),
        (
            "anthropic",
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            ["tools", "0", "type"],
        ),
        ("gemini", {"cachedContent": "cachedContents/1"}, ["cachedContent"]),
        ("gemini", {"tools": [{"googleSearch": {}}]}, ["tools", "0", "googleSearch"]),
        (
            "azure",
            {
                "history": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "https://e/a.png"}}],
                    }
                ]
            },
            ["messages", "2", "content", "0"],
        ),
    ],
)
def test_item6_a_cost_no_request_bounds_is_refused_under_a_money_budget_in_every_api(
    make_app: AppFactory, llm: FakeLLM, which: str, extra: dict[str, Any], loc: list[str]
) -> None:
    """Attack item 6 through each adapter: context held upstream, a tool the provider
    runs and bills, media by URL: a 422 naming the field, nothing forwarded or
    counted; without a money budget the turn goes on."""
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    a = Agent(api, limits={"max_cost": 1000})
    status, _, _, out = ask(api, which, False, a.id, **extra)
    assert status == 422 and out["errors"][0]["loc"] == ["body", *loc]
    assert llm.requests == [] and used(api, a.id)["model_calls"] == 0
    llm.mode = "final"
    assert ask(api, which, False, Agent(api).id, **extra)[0] == 200


@pytest.mark.security
@pytest.mark.parametrize("which", APIS)
def test_item7_a_tool_output_through_the_gate_feeds_the_tools_check(
    make_app: AppFactory, llm: FakeLLM, which: str
) -> None:
    """Attack item 7: three pages of new records through the gate pass the tool's
    cursor check (the output, n8n's list of one item, is the check's input): the
    task progresses to revision 3 instead of ending no_progress."""
    checks = {"all_pages": {"kind": "cursor", "cursor": "next_cursor", "records": "items[].id"}}
    tools = {"list_orders": {"kind": "read", "check": "all_pages"}}
    api = Api(gate_app(make_app, llm, checks=checks, tools=tools).test_client())
    a = Agent(api, limits={"max_idle": 2, "max_same_call": 2})
    llm.mode = "tool_call"
    offered = (
        [{"type": "function", "function": {"name": "list_orders", "parameters": {}}}]
        if which == "chat"
        else [{"type": "function", "name": "list_orders", "parameters": {}}]
    )
    history: list[dict[str, Any]] = []
    for n in range(3):
        status, _, ids, _ = ask(api, which, False, a.id, history=history, tools=offered)
        assert status == 200 and len(ids) == 1
        page = json.dumps([{"next_cursor": "opaque", "items": [{"id": n}]}])
        history = history + output_item(which, ids[0], page)
    ask(api, which, False, a.id, history=history, tools=offered)
    task = api.get(a.base)[1]
    assert task["envelope"] is None and task["task"]["validated_revision"] == 3


@pytest.mark.security
@pytest.mark.parametrize("which", APIS)
def test_item10_numbers_past_any_bound_are_refused_or_read_as_no_usage(
    make_app: AppFactory, llm: FakeLLM, which: str
) -> None:
    """Attack item 10: ``max_tokens`` 1.7e308 is a 400 naming it; a usage of 10^308 or
    10^400 is not a count: the turn is charged its reservation (never a 500), and
    no reservation is left held."""
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    a = Agent(api, limits={"max_cost": 1000})
    limit = "max_tokens" if which == "chat" else "max_output_tokens"
    status, out = turn(api, which, a.id, **{limit: 1.7e308})
    assert status == 400 and out["errors"][0]["loc"] == ["body", limit]
    status, out = turn(api, which, a.id, **{limit: 10**30})
    assert status == 400 and out["errors"][0]["loc"] == ["body", limit]
    status, out = turn(api, which, a.id, **{limit: 10**309})  # past any double: the parser's
    assert status == 422 and out["errors"][0]["loc"] == ["body", limit]
    assert llm.requests == [] and used(api, a.id)["model_calls"] == 0
    llm.mode = "huge_usage"
    for tokens in (10**308, 10**400, 10**308):
        llm.usage_tokens = tokens
        assert turn(api, which, a.id, **_money_body(which))[0] == 200
    spent = used(api, a.id)
    assert (spent["model_calls"], spent["cost"], spent["reserved_cost"]) == (3, 15.0, 0.0)


@pytest.mark.security
def test_item13_a_chat_chunk_with_error_null_is_no_error(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    """Attack item 13: chunks carrying ``"error": null`` are ordinary chunks: the
    stream finishes with [DONE], and the turn costs its reported usage."""
    api = Api(gate_app(make_app, llm, model_gate=PRICED).test_client())
    a = Agent(api, limits={"max_cost": 100})
    llm.mode = "null_error"
    status, text, _, events = ask(api, "chat", True, a.id, max_tokens=5)
    assert status == 200 and text == "FINAL answer" and events[-1].data == "[DONE]"
    assert used(api, a.id)["cost"] == 3.0


@pytest.mark.security
@pytest.mark.parametrize("stream_it", STREAMS)
@pytest.mark.parametrize(
    ("which", "mode"),
    [
        *(
            (w, m)
            for w in EVERY_API
            if w not in gate_apis.ID_LESS
            for m in ("empty_id", "unoffered")
        ),
        *((w, "unoffered") for w in gate_apis.ID_LESS),  # the gate names their calls
    ],
)
def test_item14_a_call_without_id_or_of_a_tool_not_offered_ends_the_task_invalid_call(
    api: Api, llm: FakeLLM, which: str, stream_it: bool, mode: str
) -> None:
    """Attack item 14 and DESIGN §5: a call whose id is empty, or that names a tool
    the request did not offer, is never relayed: the task ends blocked, invalid_call
    (nothing left pending). In every API, through its adapter."""
    a = Agent(api)
    llm.mode = mode
    status, text, ids, _ = ask(api, which, stream_it, a.id)
    assert status == 200 and ids == [] and "blocked (invalid_call)" in text
    assert api.get(a.base)[1]["envelope"]["reason"] == "invalid_call"
    assert task_doc(api, a.id)["calls"] == [] and used(api, a.id)["tool_calls"] == 0


@pytest.mark.security
@pytest.mark.parametrize("stream_it", STREAMS)
@pytest.mark.parametrize("gzip_it", [False, True])
@pytest.mark.parametrize("which", ["chat", *gate_apis.OTHER])
def test_item15_an_answer_past_max_answer_bytes_is_a_502_and_counted(
    make_app: AppFactory, llm: FakeLLM, which: str, stream_it: bool, gzip_it: bool
) -> None:
    """Attack item 15: an answer bigger than model_gate.max_answer_bytes (counted
    decompressed) is a 502 in the API's shape (streamed: an error event), the turn
    counted; in every API."""
    api = Api(gate_app(make_app, llm, model_gate={"max_answer_bytes": 1 << 20}).test_client())
    a = Agent(api)
    llm.mode, llm.big_bytes, llm.gzip = "big", 3 << 20, gzip_it
    status, _, _, out = ask(api, which, stream_it, a.id)
    if which == "chat" and stream_it:
        assert status == 200
        ends_with_error("chat", out, "answer_too_large")
    elif which == "chat":
        assert status == 502 and out["error"]["code"] == "answer_too_large"
    elif stream_it:  # the last event is the API's error, naming the bound
        last = out[-1]
        assert (
            status == 200 and "error" in json.dumps(last) and "max_answer_bytes" in json.dumps(last)
        )
    else:
        assert status == 502 and "max_answer_bytes" in json.dumps(out)
    spent = used(api, a.id)
    assert spent["model_calls"] == 1 and spent["tokens"] > 0

"""The model gate speaking Ollama (DESIGN §5): ``POST /v1/ollama/api/chat``
(NDJSON streams by default, ``stream: false``) and ``GET /v1/ollama/api/tags``,
driven by the official ``ollama`` client as n8n's Ollama Chat Model drives it,
against the app served for real (a werkzeug server thread) with the stand-in
model (its Ollama routes) as the upstream."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ollama
import pytest
from fake_llm import FakeLLM, serve
from flask import Flask
from werkzeug.serving import make_server

from conftest import N8N_TOKEN, SCOPED_TOKEN, Api, AppFactory

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Echoes q back.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]
REAL_KEY = "ollama-upstream-secret"


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with serve() as fake:
        yield fake


@contextmanager
def served(app: Flask) -> Iterator[str]:
    """The app on a free loopback port in a thread; yields its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def gate_app(make_app: AppFactory, llm: FakeLLM | None, key: bool = False, **gate: Any) -> Flask:
    upstreams = {"ollama": {"url": llm.root}} if llm is not None else {}
    if key and llm is not None:
        upstreams["ollama"]["api_key_env"] = "OLLAMA_KEY"
    return make_app(
        model_gate={"timeout_s": 2, "upstreams": upstreams, **gate},
        environ={"OLLAMA_KEY": REAL_KEY},
    )


@pytest.fixture
def gate(make_app: AppFactory, llm: FakeLLM) -> Iterator[tuple[str, Flask]]:
    app = gate_app(make_app, llm)
    with served(app) as base:
        yield base, app


def client(base: str, token: str | None = N8N_TOKEN) -> ollama.Client:
    """The ollama client as n8n's credential makes it (Base URL, API Key as Bearer)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return ollama.Client(host=base + "/v1/ollama", headers=headers, timeout=10)


def opening(key: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": f"You are a support agent.\nloopstop-task-key: {key}"},
        {"role": "user", "content": "Echo a."},
    ]


def one_turn(
    c: ollama.Client, messages: list[dict[str, Any]], stream: bool
) -> tuple[str, list[Any]]:
    """One model turn: its text and its tool calls (a stream's lines joined)."""
    if not stream:
        answer = c.chat(model="fake-model", messages=messages, tools=TOOLS, stream=False)
        return answer.message.content or "", list(answer.message.tool_calls or [])
    text, calls = "", []
    lines = list(c.chat(model="fake-model", messages=messages, tools=TOOLS, stream=True))
    assert lines[-1].done and not any(x.done for x in lines[:-1])
    for x in lines:
        text += x.message.content or ""
        calls.extend(x.message.tool_calls or [])
    return text, calls


def run_agent(c: ollama.Client, key: str, stream: bool, max_iterations: int = 10) -> Any:
    """An agent loop as n8n's runs it: each proposed call executed, then echoed back
    (one assistant message per call, LangChain's uuid as its id and in its
    arguments) with a ``role: "tool"`` message holding only the output."""
    messages = opening(key)
    executed = 0
    for _ in range(max_iterations):
        text, calls = one_turn(c, messages, stream)
        if not calls:
            return text, executed
        for call in calls:
            executed += 1
            made = str(uuid.uuid4())
            args = {**call.function.arguments, "id": made}
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": made,
                            "type": "function",
                            "function": {"name": call.function.name, "arguments": args},
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "content": f'[{{"response":"{executed}"}}]'})
    return None, executed


def task_by_key(app: Flask, key: str) -> dict[str, Any]:
    status, out = Api(app.test_client()).post("/v1/tasks", {"task_key": key})
    assert status in (200, 201)
    return dict(out)


@pytest.mark.parametrize("stream", [False, True], ids=["not-streamed", "streamed"])
def test_a_looping_model_is_stopped_after_two_tool_executions(
    gate: tuple[str, Flask], llm: FakeLLM, stream: bool
) -> None:
    base, app = gate
    text, executed = run_agent(client(base), "loop-1", stream)
    assert executed == 2 and len(llm.requests) == 3
    assert text.startswith("[loopstop] This task has ended: partial (same_call)")
    out = task_by_key(app, "loop-1")
    assert (out["envelope"]["status"], out["envelope"]["reason"]) == ("partial", "same_call")
    used = out["task"]["used"]
    assert used["model_calls"] == 3 and used["tokens"] == 30  # 7 + 3 per turn
    assert used["tool_calls"] == 2  # the third proposal was denied
    assert [p for p in llm.paths] == ["/api/chat"] * 3
    assert [r.get("stream") for r in llm.requests] == [stream] * 3
    # A fourth turn is answered by the gate without calling the model.
    again, calls = one_turn(client(base), opening("loop-1"), stream)
    assert again == text and not calls and len(llm.requests) == 3


def test_the_outputs_coming_back_are_recorded_as_their_calls_results(
    gate: tuple[str, Flask], llm: FakeLLM
) -> None:
    """Matched by position (n8n's tool messages carry no id): both calls of the
    stopped run have their result, and no call is left pending."""
    base, app = gate
    run_agent(client(base), "results-1", stream=True)
    task_id = task_by_key(app, "results-1")["task"]["task_id"]
    from sidecar.service import keys

    doc = app.extensions["loopstop"].store.get(keys.task("p", task_id))
    calls = doc["calls"]
    assert len(calls) == 2 and all(c["call_id"].startswith("ollama_") for c in calls)
    assert len({c["call_id"] for c in calls}) == 2
    assert [c["status"] for c in calls] == ["ok", "ok"]


def test_the_same_request_sent_again_is_the_same_call(
    gate: tuple[str, Flask], llm: FakeLLM
) -> None:
    """A request repeated as it was (a client's retry) proposes the call it already
    proposed, under the same id: admitted again, counted once."""
    base, app = gate
    for _ in range(3):
        _, calls = one_turn(client(base), opening("retry-1"), stream=False)
        assert [c.function.name for c in calls] == ["echo"]
    out = task_by_key(app, "retry-1")
    assert out["envelope"] is None and out["task"]["used"]["tool_calls"] == 1


def test_the_upstream_gets_the_real_key_or_none_and_never_a_loopstop_token(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    for key in (False, True):
        llm.headers.clear()
        llm.lists.clear()
        with served(gate_app(make_app, llm, key=key)) as base:
            run_agent(client(base), f"headers-{key}", stream=True)
            client(base).list()
        sent = [*llm.headers, *(h for _, h in llm.lists)]
        assert len(sent) == 4  # three turns and the model list
        for headers in sent:
            assert not any(N8N_TOKEN in v for v in headers.values())
            assert headers.get("authorization") == (f"Bearer {REAL_KEY}" if key else None)


def test_the_credential_test_lists_the_upstream_s_models(gate: tuple[str, Flask]) -> None:
    base, _ = gate
    listed = client(base).list()
    assert [m.model for m in listed.models] == ["fake-model:latest"]


def test_without_an_upstream_the_credential_test_and_every_turn_fail_503(
    make_app: AppFactory,
) -> None:
    with served(gate_app(make_app, None)) as base:
        with pytest.raises(ollama.ResponseError) as caught:
            client(base).list()
        assert caught.value.status_code == 503
        for stream in (False, True):
            with pytest.raises(ollama.ResponseError) as caught:
                one_turn(client(base), opening("none-1"), stream)
            assert caught.value.status_code == 503
            assert "model_gate.upstreams.ollama" in str(caught.value.error)


def test_a_missing_or_wrong_token_is_a_401_and_a_scoped_token_is_held_to_its_workflows(
    gate: tuple[str, Flask], llm: FakeLLM
) -> None:
    base, _ = gate
    for token in (None, "not-a-token-0123456789"):
        with pytest.raises(ollama.ResponseError) as caught:
            one_turn(client(base, token), opening("auth-1"), stream=False)
        assert caught.value.status_code == 401
    scoped = opening("auth-2")
    scoped[0]["content"] += "\nloopstop-workflow: wf-other"
    with pytest.raises(ollama.ResponseError) as caught:
        one_turn(client(base, SCOPED_TOKEN), scoped, stream=False)
    assert caught.value.status_code == 403
    assert llm.requests == []


@pytest.mark.parametrize("stream", [False, True], ids=["not-streamed", "streamed"])
@pytest.mark.parametrize("mode", ["429", "500"])
def test_an_upstream_error_is_relayed_with_its_status_in_ollama_s_shape(
    gate: tuple[str, Flask], llm: FakeLLM, mode: str, stream: bool
) -> None:
    base, _ = gate
    llm.mode = mode
    with pytest.raises(ollama.ResponseError) as caught:
        one_turn(client(base), opening(f"err-{mode}-{stream}"), stream)
    assert (caught.value.status_code, caught.value.error) == (int(mode), f"fake {mode}")


def test_an_unreachable_upstream_is_a_502_in_ollama_s_shape(make_app: AppFactory) -> None:
    with serve() as gone:
        root = gone.root
    app = make_app(model_gate={"timeout_s": 2, "upstreams": {"ollama": {"url": root}}})
    with served(app) as base, pytest.raises(ollama.ResponseError) as caught:
        one_turn(client(base), opening("gone-1"), stream=True)
    assert caught.value.status_code == 502
    assert str(caught.value.error).startswith("the upstream model is unreachable")


def test_a_stream_that_breaks_ends_with_an_error_line_the_client_raises(
    gate: tuple[str, Flask], llm: FakeLLM
) -> None:
    """The stand-in sends a line that is not JSON after its first text: the gate ends
    the stream with ``{"error": ...}``, which the client raises; the turn counts."""
    base, app = gate
    llm.mode = "garbage"
    with pytest.raises(ollama.ResponseError) as caught:
        one_turn(client(base), opening("broken-1"), stream=True)
    assert "unreadable" in str(caught.value.error)
    assert task_by_key(app, "broken-1")["task"]["used"]["model_calls"] == 1


def test_a_request_naming_no_task_is_a_400_problem_the_client_shows(
    gate: tuple[str, Flask], llm: FakeLLM
) -> None:
    base, _ = gate
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ollama.ResponseError) as caught:
        client(base).chat(model="fake-model", messages=messages, stream=False)
    assert caught.value.status_code == 400 and "loopstop-task" in str(caught.value.error)
    assert llm.requests == []


def test_text_streams_through_and_a_final_answer_is_relayed(
    gate: tuple[str, Flask], llm: FakeLLM
) -> None:
    base, app = gate
    llm.mode = "final"
    text, calls = one_turn(client(base), opening("final-1"), stream=True)
    assert (text, calls) == ("FINAL answer", [])
    text, calls = one_turn(client(base), opening("final-1"), stream=False)
    assert (text, calls) == ("FINAL answer", [])
    assert task_by_key(app, "final-1")["task"]["used"]["tokens"] == 20


def test_a_money_budget_prices_ollama_turns_and_refuses_an_unpriced_model(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    prices = {"fake-model": {"input_per_mtok": 100_000, "output_per_mtok": 200_000}}
    app = gate_app(make_app, llm, prices=prices)
    with served(app) as base:
        status, _ = Api(app.test_client()).post(
            "/v1/tasks", {"task_key": "money-1", "limits": {"max_cost": 1000}}
        )
        assert status == 201
        llm.mode = "final"
        one_turn(client(base), opening("money-1"), stream=True)
        used = task_by_key(app, "money-1")["task"]["used"]
        assert used["cost"] == pytest.approx(0.7 + 0.6)  # 7 in, 3 out
        with pytest.raises(ollama.ResponseError) as caught:
            client(base).chat(model="unpriced", messages=opening("money-1"), stream=False)
        assert caught.value.status_code == 422


def test_an_unreadable_answer_is_a_502_in_ollama_s_shape(
    gate: tuple[str, Flask], llm: FakeLLM
) -> None:
    base, app = gate
    llm.mode = "garbage"
    with pytest.raises(ollama.ResponseError) as caught:
        one_turn(client(base), opening("garbage-1"), stream=False)
    assert caught.value.status_code == 502
    assert "not an Ollama chat" in str(caught.value.error)
    assert task_by_key(app, "garbage-1")["task"]["used"]["model_calls"] == 1

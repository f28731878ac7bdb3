"""The model gate speaking Google's Gemini API (DESIGN §5): driven by the official
``google-genai`` SDK as the client, against the app served for real (a werkzeug
server thread), with the stand-in model (``--api gemini``) as the upstream; and
by raw requests shaped as n8n 2.41.1's Google Gemini Chat Model sends them
(its echo of a call adds ``args.id``; its model list sends the key as ``?key=``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from fake_llm import FakeLLM, serve
from flask import Flask
from google import genai
from google.genai import errors, types
from werkzeug.serving import make_server

from conftest import N8N_TOKEN, AppFactory, free_port

MODEL = "gemini-2.5-flash"
REAL_KEY = "real-gemini-key-0123"
FINAL = "[loopstop] This task has ended: partial (same_call)"
SYSTEM = "You are a support agent.\nloopstop-task-key: {key}"
ECHO = types.FunctionDeclaration(
    name="echo",
    description="Echoes q back.",
    parameters=types.Schema(
        type=types.Type.OBJECT, properties={"q": types.Schema(type=types.Type.STRING)}
    ),
)


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with serve(api="gemini") as fake:
        yield fake


@dataclass
class Gate:
    """The app served on a loopback port."""

    base: str
    app: Flask

    @property
    def host(self) -> str:
        """What n8n's Gemini credential's Host holds."""
        return self.base + "/v1/gemini"

    def client(self, token: str = N8N_TOKEN) -> genai.Client:
        return genai.Client(
            api_key=token,
            http_options=types.HttpOptions(
                base_url=self.host, api_version="v1beta", timeout=20_000
            ),
        )


def _served(app: Flask) -> Iterator[Gate]:
    port = free_port()
    server = make_server("127.0.0.1", port, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Gate(f"http://127.0.0.1:{port}", app)
    finally:
        server.shutdown()


def gemini_app(make_app: AppFactory, llm: FakeLLM | None, **gate: Any) -> Flask:
    upstreams = {"gemini": {"url": llm.root, "api_key_env": "GEMINI_KEY"}} if llm else {}
    return make_app(
        model_gate={"upstreams": upstreams, "timeout_s": 5, **gate},
        environ={"GEMINI_KEY": REAL_KEY},
    )


@pytest.fixture
def gate(make_app: AppFactory, llm: FakeLLM) -> Iterator[Gate]:
    yield from _served(gemini_app(make_app, llm))


def config(key: str) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(
        system_instruction=SYSTEM.format(key=key),
        tools=[types.Tool(function_declarations=[ECHO])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )


@dataclass
class Run:
    """An agent loop driven with the SDK: the tools it ran and its final text."""

    executions: int
    text: str


def run_agent(
    client: genai.Client, key: str, stream: bool, max_iterations: int = 10, same: bool = False
) -> Run:
    """A manual function-calling loop, as an agent runs it: each proposed call is
    executed and its output sent back with the model's own turn (thoughtSignature
    and all), until the model answers text or Max Iterations is reached."""
    contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text="hi")])]
    executions = 0
    for _ in range(max_iterations):
        if stream:
            parts: list[types.Part] = []
            for chunk in client.models.generate_content_stream(
                model=MODEL, contents=contents, config=config(key)
            ):
                assert chunk.candidates, chunk
                parts.extend(chunk.candidates[0].content.parts or [])
            turn = types.Content(role="model", parts=parts)
        else:
            answer = client.models.generate_content(
                model=MODEL, contents=contents, config=config(key)
            )
            assert answer.candidates
            turn = answer.candidates[0].content
        calls = [p.function_call for p in turn.parts or [] if p.function_call]
        if not calls:
            return Run(executions, "".join(p.text or "" for p in turn.parts or []))
        contents.append(turn)
        for fc in calls:
            executions += 1
            contents.append(
                types.Content(
                    role="user",
                    parts=[
                        types.Part.from_function_response(
                            name=fc.name or "",
                            response={"result": "same" if same else f"ran {executions}"},
                        )
                    ],
                )
            )
    return Run(executions, "")


def task_of(gate: Gate, key: str) -> dict[str, Any]:
    r = requests.post(
        gate.base + "/v1/tasks",
        json={"task_key": key},
        headers={"Authorization": f"Bearer {N8N_TOKEN}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def never_forwarded(llm: FakeLLM, token: str = N8N_TOKEN) -> None:
    seen = json.dumps([llm.paths, llm.headers, llm.lists, llm.requests])
    assert token not in seen
    assert all(h.get("x-goog-api-key") == REAL_KEY for h in llm.headers)


# -- a looping model is stopped ---------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_a_looping_model_is_stopped_after_two_tool_executions(
    gate: Gate, llm: FakeLLM, stream: bool
) -> None:
    """The stand-in proposes the same call forever (a new turn, the same args, a
    thoughtSignature): the third proposal is answered with the gate's final text,
    and the task ends partial/same_call after 2 executions and 3 upstream turns."""
    run = run_agent(gate.client(), f"loop-{stream}", stream)
    assert run.executions == 2
    assert run.text.startswith(FINAL), run.text
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    assert llm.paths == [f"/v1beta/models/{MODEL}:{method}"] * 3
    # the signature the upstream gave came back to it intact
    echoed = [p for c in llm.requests[-1]["contents"] for p in c["parts"] if "functionCall" in p]
    assert [p["thoughtSignature"] for p in echoed] == ["c3RhbmQtaW4tc2lnbmF0dXJl"] * 2
    out = task_of(gate, f"loop-{stream}")
    assert (out["envelope"]["status"], out["envelope"]["reason"]) == ("partial", "same_call")
    assert out["task"]["used"]["tool_calls"] == 2 and out["task"]["used"]["tokens"] == 30
    never_forwarded(llm)


def test_straight_at_the_stand_in_the_loop_runs_to_max_iterations(llm: FakeLLM) -> None:
    """The control: the same agent loop with the stand-in as its model runs every iteration."""
    client = genai.Client(
        api_key="k", http_options=types.HttpOptions(base_url=llm.root, api_version="v1beta")
    )
    assert run_agent(client, "direct", stream=False, max_iterations=10).executions == 10


def n8n_turn(key: str, history: list[dict[str, Any]]) -> dict[str, Any]:
    """A request as n8n 2.41.1 sends it (wire-facts §3.4)."""
    return {
        "generationConfig": {"stopSequences": []},
        "safetySettings": [],
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "echo",
                        "description": "Echoes q back.",
                        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                    }
                ]
            }
        ],
        "systemInstruction": {"role": "system", "parts": [{"text": SYSTEM.format(key=key)}]},
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}, *history],
    }


def test_n8n_s_echo_of_a_call_is_matched_and_judged_on_the_upstream_s_proposal(
    gate: Gate, llm: FakeLLM
) -> None:
    """n8n sends a call back without its thoughtSignature's turn text and with its own
    uuid in ``args.id``, the output under ``response.result``; the outputs are
    recorded against the calls and the identical proposals end the task."""
    url = gate.host + f"/v1beta/models/{MODEL}:generateContent"
    headers = {"x-goog-api-key": N8N_TOKEN}
    history: list[dict[str, Any]] = []
    texts = []
    for n in range(3):
        r = requests.post(url, json=n8n_turn("n8n-echo", history), headers=headers, timeout=10)
        assert r.status_code == 200, r.text
        parts = r.json()["candidates"][0]["content"]["parts"]
        calls = [p for p in parts if "functionCall" in p]
        texts.append("".join(p.get("text", "") for p in parts))
        for p in calls:
            fc = p["functionCall"]
            uuid = f"5f3c2a9e-0000-4000-8000-00000000000{n}"
            history.append(
                {
                    "role": "model",
                    "parts": [
                        {
                            "functionCall": {
                                "name": fc["name"],
                                "args": {**fc["args"], "id": uuid},
                            },
                            "thoughtSignature": p["thoughtSignature"],
                        }
                    ],
                }
            )
            history.append(
                {
                    "role": "user",
                    "parts": [
                        {
                            "functionResponse": {
                                "name": fc["name"],
                                "response": {"result": f'[{{"response":"{n}"}}]'},
                            }
                        }
                    ],
                }
            )
    assert texts[2].startswith(FINAL) and len(llm.requests) == 3
    out = task_of(gate, "n8n-echo")
    assert out["envelope"]["reason"] == "same_call"
    assert out["task"]["used"]["tool_calls"] == 2


def test_the_outputs_are_recorded_against_their_calls(make_app: AppFactory, llm: FakeLLM) -> None:
    """Each functionResponse settles the call it answers: the same output twice is
    one idle result (identical calls allowed here), which needs both matched."""
    app = make_app(
        model_gate={"upstreams": {"gemini": {"url": llm.root}}, "timeout_s": 5},
        limits={"max_same_call": 50, "max_idle": 50},
    )
    for g in _served(app):
        run = run_agent(g.client(), "idle", stream=False, max_iterations=3, same=True)
        assert run.executions == 3
        used = task_of(g, "idle")["task"]["used"]
        assert (used["tool_calls"], used["idle"]) == (3, 1)
        assert llm.headers[0].get("x-goog-api-key") is None  # no api_key_env: no key at all


# -- the credential test, tokens, errors ------------------------------------------------------


def test_the_credential_test_lists_models_and_never_forwards_the_key(
    gate: Gate, llm: FakeLLM
) -> None:
    """n8n's credential test: ``GET {host}/v1beta/models?key=<token>``; the SDK's own
    model list (the key in x-goog-api-key) reads the same answer."""
    r = requests.get(gate.host + "/v1beta/models", params={"key": N8N_TOKEN}, timeout=10)
    assert r.status_code == 200, r.text
    assert [m["name"] for m in r.json()["models"]] == ["models/fake-model"]
    assert llm.lists[-1][0] == "/v1beta/models"
    assert llm.lists[-1][1]["x-goog-api-key"] == REAL_KEY
    client = gate.client()  # kept: a client closes its connections when collected
    models = list(client.models.list())
    assert [m.name for m in models] == ["models/fake-model"]
    assert "generateContent" in (models[0].supported_actions or [])
    assert (
        requests.get(gate.host + "/v1beta/models", params={"key": "wrong"}, timeout=10).status_code
        == 401
    )
    assert requests.get(gate.host + "/v1beta/models", timeout=10).status_code == 401
    r = requests.get(
        gate.host + "//v1/models", params={"key": N8N_TOKEN, "pageSize": 5}, timeout=10
    )
    assert r.status_code == 200 and llm.lists[-1][0] == "/v1/models?pageSize=5"  # as it came
    never_forwarded(llm)


def test_without_an_upstream_the_routes_answer_503(make_app: AppFactory) -> None:
    for g in _served(gemini_app(make_app, None)):
        r = requests.get(g.host + "/v1beta/models", params={"key": N8N_TOKEN}, timeout=10)
        assert r.status_code == 503, r.text
        assert r.headers["Content-Type"].startswith("application/problem+json")
        assert "model_gate.upstreams.gemini.url" in r.json()["detail"]
        client = g.client()
        with pytest.raises(errors.APIError) as caught:
            client.models.generate_content(model=MODEL, contents="hi", config=config("x"))
        assert caught.value.code == 503


def test_the_token_is_read_from_the_header_or_the_key_parameter(gate: Gate, llm: FakeLLM) -> None:
    url = gate.host + f"/v1beta/models/{MODEL}:generateContent"
    body = n8n_turn("tokens", [])
    llm.mode = "final"
    assert requests.post(url, json=body, params={"key": N8N_TOKEN}, timeout=10).status_code == 200
    assert requests.post(url, json=body, headers={"x-goog-api-key": N8N_TOKEN}, timeout=10).ok
    for headers in ({"x-goog-api-key": "wrong"}, {}, {"Authorization": f"Bearer {N8N_TOKEN}"}):
        r = requests.post(url, json=body, headers=headers, timeout=10)
        assert r.status_code == 401, headers
        assert r.headers["Content-Type"].startswith("application/problem+json")
    assert llm.paths == [f"/v1beta/models/{MODEL}:generateContent"] * 2  # no ?key= upstream
    never_forwarded(llm)


def test_a_host_ending_in_a_slash_and_the_v1_path_are_served(gate: Gate, llm: FakeLLM) -> None:
    """n8n joins ``{host}/v1beta`` as text: a Host ending in ``/`` sends ``//v1beta``."""
    llm.mode = "final"
    headers = {"x-goog-api-key": N8N_TOKEN}
    for path in (f"//v1beta/models/{MODEL}:generateContent", f"/v1/models/{MODEL}:generateContent"):
        r = requests.post(
            gate.host + path,
            json=n8n_turn("slash", []),
            headers=headers,
            timeout=10,
            allow_redirects=False,
        )
        assert r.status_code == 200, (path, r.status_code)
        assert r.json()["candidates"][0]["content"]["parts"][0]["text"] == "FINAL answer"
    assert llm.paths == [
        f"/v1beta/models/{MODEL}:generateContent",
        f"/v1/models/{MODEL}:generateContent",
    ]


@pytest.mark.parametrize(
    ("mode", "code", "status"),
    [("429", 429, "RESOURCE_EXHAUSTED"), ("500", 500, "INTERNAL"), ("garbage", 502, "UNAVAILABLE")],
)
@pytest.mark.parametrize("stream", [False, True], ids=["generate", "stream"])
def test_upstream_errors_reach_the_sdk_in_google_s_shape(
    gate: Gate, llm: FakeLLM, mode: str, code: int, status: str, stream: bool
) -> None:
    llm.mode = mode
    client = gate.client()
    with pytest.raises(errors.APIError) as caught:
        if stream:
            list(
                client.models.generate_content_stream(
                    model=MODEL, contents="hi", config=config(f"e-{mode}")
                )
            )
        else:
            client.models.generate_content(model=MODEL, contents="hi", config=config(f"e-{mode}"))
    assert (caught.value.code, caught.value.status) == (code, status)
    assert caught.value.message
    used = task_of(gate, f"e-{mode}")["task"]["used"]
    assert used["model_calls"] == 1 and used["tokens"] > 0


def test_an_unreachable_upstream_is_a_502_in_google_s_shape(make_app: AppFactory) -> None:
    dead = {"gemini": {"url": f"http://127.0.0.1:{free_port()}"}}
    for g in _served(make_app(model_gate={"upstreams": dead, "timeout_s": 5})):
        client = g.client()
        with pytest.raises(errors.APIError) as caught:
            client.models.generate_content(model=MODEL, contents="hi", config=config("dead"))
        assert (caught.value.code, caught.value.status) == (502, "UNAVAILABLE")
        assert "unreachable" in (caught.value.message or "")


def test_a_stream_cut_mid_way_ends_with_an_error_chunk_the_sdk_raises(
    gate: Gate, llm: FakeLLM
) -> None:
    llm.mode = "cut"
    got: list[str] = []
    client = gate.client()
    with pytest.raises(errors.APIError) as caught:
        for chunk in client.models.generate_content_stream(
            model=MODEL, contents="hi", config=config("cut")
        ):
            got.append(chunk.text or "")
    assert got == ["FINAL "]  # the text before the cut was relayed as it came
    assert caught.value.code == 502 and caught.value.status == "UNAVAILABLE"


def test_a_streamed_text_answer_passes_as_it_comes(gate: Gate, llm: FakeLLM) -> None:
    llm.mode = "final"
    client = gate.client()
    chunks = list(
        client.models.generate_content_stream(model=MODEL, contents="hi", config=config("text"))
    )
    assert [c.text for c in chunks] == ["FINAL ", "ans", "wer"]
    assert chunks[-1].usage_metadata is not None
    assert chunks[-1].usage_metadata.total_token_count == 10
    assert task_of(gate, "text")["task"]["used"]["tokens"] == 10

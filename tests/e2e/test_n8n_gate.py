"""End to end: n8n 2.41.1's AI Agent guarded by the model gate alone, in every API.

One stack per API on the session's n8n (``gate_harness.py``): OpenAI (the
Responses API, the node's default, and Chat Completions), Anthropic, Azure
OpenAI, Gemini and Ollama, each with the stand-in model behind a sidecar of
its own and the recorder the agent's HTTP Request Tool posts to. The agent
(latest typeVersion, Max Iterations 10, its default) has the API's chat
model node at its latest typeVersion with default options, its credential
on the gate, and no per-tool Loop Stop node: the gate admits every proposed
tool call and records every tool output. Each test names the APIs it runs
for; what one API's wire shows beyond what every API shares is checked by
that API's class of :data:`WIRE`. What n8n itself recorded (its execution
data) is read, not only what the gate answered. Marked ``n8n``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from .gate_harness import (
    APIS,
    FINAL,
    MAX_ITERATIONS,
    MAX_MODEL_CALLS,
    MAX_SAME_CALL,
    TOKEN,
    Driven,
    Gate,
    agent_output,
    assert_same_call,
    chat_text,
    gate_stack,
    node,
    runs,
)
from .n8n_runtime import N8n
from .shared import Sidecar, tokens_only

pytestmark = pytest.mark.n8n


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """A gate with no upstream configured: it answers 503 instead of a model list."""
    gate = tokens_only(tmp_path_factory.mktemp("gate-bare"), TOKEN).start()
    yield gate
    gate.stop()


@pytest.fixture(scope="module")
def gate(
    request: pytest.FixtureRequest,
    n8n: N8n,
    bare: Sidecar,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gate]:
    """The stack of the API the test is parametrized with (one at a time)."""
    api = APIS[request.param]
    with gate_stack(api, n8n, tmp_path_factory.mktemp(f"gate-{api.name}"), bare.base) as stack:
        yield stack


def apis(*names: str) -> pytest.MarkDecorator:
    """Run the test on the stacks of ``names``."""
    return pytest.mark.parametrize("gate", names, indirect=True)


class Wire:
    """What one API's tests check beyond what every API shares (here: nothing)."""

    def shipped(self, gate: Gate, d: Driven, headers: list[dict[str, str]], task: Any) -> None:
        pass

    def chat(self, gate: Gate, d: Driven, text: str, ticket: str, task: Any) -> None:
        assert all(r.get("stream") is True for r in d.upstream), "n8n streams in this mode"
        assert_same_call(gate, d, ticket, task)

    def direct(self, gate: Gate, d: Driven, ticket: str) -> None:
        pass

    def credential(self, gate: Gate, test: Any, url: str) -> None:
        pass


class OpenAI(Wire):
    def shipped(self, gate: Gate, d: Driven, headers: list[dict[str, str]], task: Any) -> None:
        assert not any(r.get("stream") for r in d.upstream)
        # n8n sends the System Message as a system/developer input item
        first = d.upstream[0]["input"][0]
        assert first["role"] in ("system", "developer") and "loopstop-task-key" in str(first)
        # the tool outputs came back as function_call_output items with the upstream's call ids
        outputs = [i for i in d.upstream[-1]["input"] if i.get("type") == "function_call_output"]
        assert len(outputs) == MAX_SAME_CALL
        # the loopstop-execution line: the execution is known, so a task stop can reach it
        r = gate.task(task["task"]["task_id"])
        assert r.status_code == 200, r.text
        assert [e["execution_id"] for e in r.json()["executions"]] == [str(d.execution["id"])]

    def chat(self, gate: Gate, d: Driven, text: str, ticket: str, task: Any) -> None:
        super().chat(gate, d, text, ticket, task)
        assert set(d.paths) == {"/v1/responses"}


class Anthropic(Wire):
    def shipped(self, gate: Gate, d: Driven, headers: list[dict[str, str]], task: Any) -> None:
        assert len(d.upstream) <= MAX_SAME_CALL + 1 and len(d.upstream) == 3
        # the wire as n8n sent it (through the gate): no stream, system, tool_result blocks
        assert not any(r.get("stream") for r in d.upstream)
        assert "loopstop-task-key" in str(d.upstream[0]["system"])
        results = [
            b
            for m in d.upstream[-1]["messages"]
            if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "tool_result"
        ]
        assert len(results) == MAX_SAME_CALL and all(r["tool_use_id"] for r in results)
        echoed = [
            b
            for m in d.upstream[-1]["messages"]
            if m["role"] == "assistant"
            for b in m["content"]
            if b.get("type") == "tool_use"
        ]
        assert [e["input"].get("id") for e in echoed] == [e["id"] for e in echoed]  # n8n's echo
        # the upstream saw the real key and n8n's version header, never the loopstop token
        for h in headers:
            assert h["x-api-key"] == gate.api.upstream_key
            assert h["anthropic-version"] == "2023-06-01"
            assert TOKEN not in json.dumps(h)
        assert task["task"]["used"]["tokens"] == 30  # 7 in + 3 out per turn
        print(
            f"\n[n8n-gate anthropic] gate: {len(d.upstream)} upstream requests, "
            f"{len(runs(d.run, 'add_note'))} tool runs; n8n sent {sorted(headers[-1])}",
            file=sys.stderr,
        )

    def chat(self, gate: Gate, d: Driven, text: str, ticket: str, task: Any) -> None:
        """The stand-in answers text, then the call: the text streams through first."""
        assert all(r.get("stream") is True for r in d.upstream), "n8n streams in this mode"
        assert set(d.paths) == {"/v1/messages"} and len(d.upstream) == MAX_SAME_CALL + 1
        assert text.startswith("FINAL answer")
        assert len(runs(d.run, "add_note")) == MAX_SAME_CALL
        assert task["envelope"]["reason"] == "same_call"
        assert task["task"]["used"]["tokens"] == 30  # input from message_start + last output

    def direct(self, gate: Gate, d: Driven, ticket: str) -> None:
        assert len(runs(d.run, "add_note")) == MAX_ITERATIONS

    def credential(self, gate: Gate, test: Any, url: str) -> None:
        lists = len(gate.llm.lists)
        assert test(url)["status"] == "OK"
        path, headers = gate.llm.lists[lists]
        assert path == "/v1/models" and headers["x-api-key"] == gate.api.upstream_key
        assert headers["anthropic-version"] == "2023-06-01" and TOKEN not in json.dumps(headers)


class Azure(Wire):
    def shipped(self, gate: Gate, d: Driven, headers: list[dict[str, str]], task: Any) -> None:
        assert not any(r.get("stream") for r in d.upstream)
        # the echoed call: content [] and the call id in its arguments; outputs by call id
        last = d.upstream[-1]["messages"]
        assert [m["content"] for m in last if m["role"] == "assistant"] == [[], []]
        assert len([m for m in last if m["role"] == "tool" and m.get("tool_call_id")]) == 2
        for h in headers:
            assert h["api-key"] == gate.api.upstream_key
            assert not any(TOKEN in v for v in h.values())

    def chat(self, gate: Gate, d: Driven, text: str, ticket: str, task: Any) -> None:
        super().chat(gate, d, text, ticket, task)
        assert all(r["stream_options"] == {"include_usage": True} for r in d.upstream)


class Gemini(Wire):
    def shipped(self, gate: Gate, d: Driven, headers: list[dict[str, str]], task: Any) -> None:
        """``:generateContent`` with the key in x-goog-api-key, the System Message in
        systemInstruction, each relayed call echoed with n8n's uuid in its args and its
        thoughtSignature kept (as Gemini 3 sends), each output a functionResponse."""
        assert {h.get("x-goog-api-key") for h in headers} == {gate.api.upstream_key}
        assert TOKEN not in json.dumps([headers, d.paths, d.upstream])
        assert "loopstop-task-key" in json.dumps(d.upstream[0]["systemInstruction"])
        last = d.upstream[-1]["contents"]
        calls = [p for c in last for p in c["parts"] if "functionCall" in p]
        outputs = [p for c in last for p in c["parts"] if "functionResponse" in p]
        assert len(calls) == len(outputs) == MAX_SAME_CALL
        assert all("id" in p["functionCall"]["args"] for p in calls)  # n8n's echo
        assert all(p.get("thoughtSignature") for p in calls)
        assert all("result" in p["functionResponse"]["response"] for p in outputs)
        assert len(gate.for_ticket(f"{gate.api.name}-1")) <= MAX_SAME_CALL
        assert task["task"]["used"]["tokens"] == 10 * (MAX_SAME_CALL + 1)

    def chat(self, gate: Gate, d: Driven, text: str, ticket: str, task: Any) -> None:
        """The node streams with ``:streamGenerateContent?alt=sse``."""
        assert_same_call(gate, d, ticket, task)
        assert set(d.paths) == {
            "/v1beta/models/gemini-3-flash-preview:streamGenerateContent?alt=sse"
        }, d.paths

    def direct(self, gate: Gate, d: Driven, ticket: str) -> None:
        assert len(gate.for_ticket(ticket)) == MAX_ITERATIONS
        error = d.run["resultData"]["error"]
        assert "iteration" in json.dumps(error).lower(), error

    def credential(self, gate: Gate, test: Any, url: str) -> None:
        """``GET {host}/v1beta/models?key=...``; a Host ending in a slash works too."""
        before = len(gate.llm.lists)
        assert test(url)["status"] == "OK"
        assert test(url + "/")["status"] == "OK"  # //v1beta
        listed = gate.llm.lists[before:]
        assert [p for p, _ in listed] == ["/v1beta/models"] * 2  # ?key= not forwarded
        assert all(h.get("x-goog-api-key") == gate.api.upstream_key for _, h in listed)


class Ollama(Wire):
    def shipped(self, gate: Gate, d: Driven, headers: list[dict[str, str]], task: Any) -> None:
        """n8n's Ollama node streams even behind a webhook."""
        assert all(r.get("stream") is True for r in d.upstream), "n8n's Ollama node always streams"
        first = d.upstream[0]["messages"][0]
        assert first["role"] == "system" and "loopstop-task-key" in first["content"]
        # the outputs came back as role "tool" messages with nothing to match on but position
        tools = [m for m in d.upstream[-1]["messages"] if m["role"] == "tool"]
        assert len(tools) == MAX_SAME_CALL and all(set(m) == {"role", "content"} for m in tools)
        # no key configured: the stand-in got no Authorization, and never the token
        for h in headers:
            assert "authorization" not in {k.lower() for k in h}
            assert not any(TOKEN in v for v in h.values())

    def direct(self, gate: Gate, d: Driven, ticket: str) -> None:
        assert len(gate.for_ticket(ticket)) >= MAX_ITERATIONS - 1

    def credential(self, gate: Gate, test: Any, url: str) -> None:
        """``GET {Base URL}/api/tags`` with the API Key as Bearer: a wrong token fails."""
        assert test(url)["status"] == "OK"
        assert test(url, "wrong-token-0123456789")["status"] == "Error"


WIRE: dict[str, Wire] = {
    "openai": OpenAI(),
    "anthropic": Anthropic(),
    "azure": Azure(),
    "gemini": Gemini(),
    "ollama": Ollama(),
}


@apis(*APIS)
def test_the_shipped_example_is_ended_by_the_gate(gate: Gate) -> None:
    """Webhook trigger, a loopstop-task-key line with the workflow and execution lines:
    the model proposes the same call for ever; the gate ends the task after 2 tool
    executions and 3 upstream requests, with a final text answer."""
    gate.llm.mode = "tool_call"
    ticket = f"{gate.api.name}-1"
    before = len(gate.llm.headers)
    body = {"ticket": ticket, "question": "Add a note."}
    d = gate.drive(gate.shipped, gate.webhook(gate.shipped_path, body))
    model = node(gate.flows[gate.shipped], gate.api.model_node)["parameters"].get("model")
    assert set(d.paths) == {gate.api.path.format(model=model)}
    task = gate.task_by_key(f"{gate.shipped}-{ticket}", gate.shipped)  # it names its workflow
    assert_same_call(gate, d, ticket, task)
    WIRE[gate.api.name].shipped(gate, d, gate.llm.headers[before:], task)


@apis(*APIS)
def test_a_chat_trigger_in_streaming_mode(gate: Gate) -> None:
    """A public Chat Trigger streaming its answer: the gate's final text reaches the
    chat client."""
    gate.llm.mode = gate.api.chat_mode
    session = f"{gate.api.name}-s"
    chunks: list[dict[str, Any]] = []
    d = gate.drive(gate.api.chat[0], gate.chat(session, chunks))
    text = chat_text(chunks)
    assert FINAL + "partial (same_call)" in text, chunks
    task = gate.task_by_key(f"chat-{session}")
    WIRE[gate.api.name].chat(gate, d, text, f"chat-{session}", task)


@apis("anthropic", "azure", "gemini", "ollama")
def test_the_same_flow_straight_at_the_model_runs_to_max_iterations(gate: Gate) -> None:
    """The control: without the gate the same model runs the tool at every one of the
    agent's Max Iterations, and n8n then fails the execution (the agent stops at its
    limit: the webhook answers 500)."""
    assert gate.api.direct is not None
    wid, path = gate.api.direct
    gate.llm.mode = "tool_call"
    ticket = f"{gate.api.name}-direct"
    d = gate.drive(wid, gate.webhook(path, {"ticket": ticket, "question": "Add a note."}, 500))
    assert len(d.upstream) == MAX_ITERATIONS
    assert d.execution["status"] == "error"
    WIRE[gate.api.name].direct(gate, d, ticket)
    print(
        f"\n[n8n-gate {gate.api.name}] without the gate: {len(d.upstream)} model requests, "
        f"{len(gate.for_ticket(ticket))} tool executions, {d.execution['status']}",
        file=sys.stderr,
    )


@apis("openai", "anthropic", "gemini", "ollama")
def test_the_credential_test_passes_through_the_gate_and_fails_without_an_upstream(
    gate: Gate, bare: Sidecar
) -> None:
    """n8n's own test of the model credential (its Test button): green through the gate,
    red on a gate with no upstream configured (it answers 503 instead of a model list).
    Azure's credential has no test in n8n (see the bare gate test below)."""

    def test(url: str, key: str = TOKEN) -> dict[str, Any]:
        return gate.test_credential(gate.api.data(url, key))

    url = gate.sidecar.base + gate.api.route
    assert test(url)["status"] == "OK"
    WIRE[gate.api.name].credential(gate, test, url)
    assert test(bare.base + gate.api.route)["status"] == "Error"


@apis("openai", "anthropic", "ollama")
def test_the_flows_use_the_latest_typeversions_and_default_options(gate: Gate) -> None:
    """The AI Agent, the chat model, the Chat Trigger and the Webhook of every flow are
    at the newest typeVersion the running n8n offers (its editor's own node list); the
    model node keeps its default options (OpenAI's: the Responses API on, except in the
    flow that switches it off), and the agent sets only its System Message."""
    latest = (
        "@n8n/n8n-nodes-langchain.agent",
        gate.api.node_type,
        "@n8n/n8n-nodes-langchain.chatTrigger",
        "n8n-nodes-base.webhook",
    )
    known = gate.n8n.node_types()
    seen = set()
    for wid, wf in gate.flows.items():
        for n in wf["nodes"]:
            if n["type"] in latest:
                seen.add(n["type"])
                assert n["typeVersion"] == max(known[n["type"]]), (wid, n["name"])
        model = node(wf, gate.api.model_node)["parameters"]
        assert model["options"] == {}, wid
        if wid == "lsGateNoResp0001":
            assert model["responsesApiEnabled"] is False
        else:
            assert "responsesApiEnabled" not in model, wid  # the node's default: on
        assert set(node(wf, "AI Agent")["parameters"]["options"]) == {"systemMessage"}, wid
    assert seen == set(latest)
    chat = node(gate.flows[gate.api.chat[0]], "Chat")["parameters"]
    assert chat["options"] == {"responseMode": "streaming"}


@apis("openai")
def test_a_create_task_node_and_a_task_line(gate: Gate) -> None:
    gate.llm.mode = "tool_call"
    body = {"ticket": "T-2", "question": "Add a note."}
    d = gate.drive("lsGateTaskLine01", gate.webhook("gate-task-line", body))
    created = runs(d.run, "Create Task")[0]["data"]["main"][0][0]["json"]["loopstop"]["task"]
    assert_same_call(gate, d, "T-2", gate.task(created["task_id"]).json())


@apis("openai")
def test_the_responses_api_switched_off(gate: Gate) -> None:
    gate.llm.mode = "tool_call"
    wid = "lsGateNoResp0001"
    body = {"ticket": "T-4", "question": "Add a note."}
    d = gate.drive(wid, gate.webhook("gate-chat-completions", body))
    assert set(d.paths) == {"/v1/chat/completions"}
    tools = [m for m in d.upstream[-1]["messages"] if m["role"] == "tool"]
    assert len(tools) == MAX_SAME_CALL
    assert_same_call(gate, d, "T-4", gate.task_by_key(f"{wid}-T-4", wid))


@apis("openai")
@pytest.mark.parametrize(
    ("policy", "reason", "upstream_turns"),
    [
        ("model-budget", "model_budget", MAX_MODEL_CALLS),
        ("token-budget", "token_budget", 2),
        ("money-budget", "cost_budget", 2),
    ],
)
def test_a_budget_ends_a_looping_agent_at_its_limit(
    gate: Gate, policy: str, reason: str, upstream_turns: int
) -> None:
    """The model repeats one call forever (identical calls allowed by the policy): the
    model budget (3 turns), the token budget (15 tokens: 10 a turn) or the money
    budget (10: each turn reserves 5 and costs 3, so the third would pass it) ends it."""
    gate.llm.mode = "tool_call"
    ticket = f"B-{policy}"
    body = {"ticket": ticket, "policy": policy, "question": "Add notes."}
    d = gate.drive("lsGateBudget0001", gate.webhook("gate-budget", body))
    assert d.execution["status"] == "success"
    assert len(d.upstream) == upstream_turns
    assert len(runs(d.run, "add_note")) == upstream_turns
    assert len(gate.for_ticket(ticket)) == upstream_turns
    assert agent_output(d.run).startswith(f"{FINAL}partial ({reason})")
    task = gate.task_by_key(f"budget-{ticket}")
    assert (task["envelope"]["status"], task["envelope"]["reason"]) == ("partial", reason)
    if reason == "token_budget":
        assert task["task"]["used"]["tokens"] == 10 * upstream_turns
    if reason == "cost_budget":
        assert task["task"]["used"]["cost"] == 3.0 * upstream_turns


@apis("openai")
@pytest.mark.parametrize("mode", ["500", "429", "garbage"])
def test_an_upstream_failure_is_one_counted_turn_and_fails_the_execution(
    gate: Gate, mode: str
) -> None:
    """An upstream 5xx, 429 or unreadable answer: the gate relays an OpenAI-style error
    (a 502 for the unreadable one) and counts the turn; n8n 2.41.1's OpenAI Chat Model
    does not retry it (its failed-attempt handler, @n8n/ai-utilities'
    makeN8nLlmFailedAttemptHandler, rethrows at the first failure: a 429 as "rate limit
    reached", anything else because the error carries no retriesLeft, whatever Max
    Retries says), so the execution ends in error after exactly one request."""
    gate.llm.mode = mode
    ticket = f"F-{mode}"
    send = gate.webhook(gate.shipped_path, {"ticket": ticket, "question": "Add a note."}, None)
    d = gate.drive(gate.shipped, send)
    assert d.execution["status"] == "error"
    assert isinstance(send.answer, requests.Response), "the webhook answered"
    assert len(d.upstream) == 1  # no retry
    assert len(gate.for_ticket(ticket)) == 0
    assert d.run["resultData"].get("error"), "n8n recorded the failure"
    used = gate.task_by_key(f"{gate.shipped}-{ticket}", gate.shipped)["task"]["used"]
    assert used["model_calls"] == 1 and used["tokens"] > 0  # counted, by an estimate


@apis("azure")
def test_a_gate_without_an_azure_upstream_fails_the_first_turn(gate: Gate) -> None:
    """No credential test in n8n for Azure: the first turn is where a wrong setting
    shows (the gate answers 503; its Endpoint ends in a slash, so n8n sends ``//openai``)."""
    assert gate.api.bare is not None
    wid, path = gate.api.bare
    before = len(gate.llm.requests)
    d = gate.drive(wid, gate.webhook(path, {"ticket": "A-4", "question": "Hi."}, 500))
    assert d.execution["status"] == "error"
    assert len(gate.llm.requests) == before
    error = json.dumps(d.run["resultData"]["error"]).lower()
    assert "503" in error or "service unavailable" in error, error

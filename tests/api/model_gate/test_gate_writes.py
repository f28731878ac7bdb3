"""Writes at the model gate (DESIGN §5.1): a native n8n write tool (no Loop
Stop node) runs once per business operation across turns and executions of
the task. Driven through the app as n8n's AI Agent drives it (every API the
gate speaks: both OpenAI APIs, Anthropic's Messages, Ollama's chat, Azure's
Chat Completions, Google's Gemini; streamed or not) against the stand-in model in ``write``
mode and a real local receiver for the reconcile check."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests
import sseclient
from fake_llm import FakeLLM, serve
from local_http import JsonHandler, running
from served import Sidecar, tokens_yaml, write_config

from conftest import N8N_TOKEN, Api, AppFactory, Clock

APIS = ["chat", "responses"]
#: every API, as n8n's chat model nodes speak them (Azure speaks the chat format)
ALL_APIS = ["chat", "responses", "anthropic", "ollama", "azure", "gemini"]
PATHS = {
    "chat": "/v1/openai/chat/completions",
    "responses": "/v1/openai/responses",
    "anthropic": "/v1/anthropic/v1/messages",
    "ollama": "/v1/ollama/api/chat",
    "azure": "/v1/azure/openai/deployments/fake-model/chat/completions?api-version=2024-10-21",
    "gemini": f"/v1/gemini/v1beta/models/fake-model:generateContent?key={N8N_TOKEN}",
}
#: Gemini streams by its method (the key in the query, as n8n's node sends it on a list)
GEMINI_STREAM = f"/v1/gemini/v1beta/models/fake-model:streamGenerateContent?alt=sse&key={N8N_TOKEN}"
#: the wire format of each API
FORMAT = {k: "chat" if k == "azure" else k for k in PATHS}
LEAD = "ana@example.com"
WORKFLOW = "wf-leads"
WRITE = {
    "kind": "write",
    "operation_id": "crm-lead:{email}",
    "lease_s": 120,
    "committed_when": "id != null",
}
GATE = {"default_model": "fake-model", "timeout_s": 5}


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with serve() as fake:
        fake.mode = "write"
        yield fake


@dataclass
class Receiver:
    """The system of record a reconcile check asks: ``GET /leads/<email>``."""

    leads: set[str] = field(default_factory=set)
    asked: list[str] = field(default_factory=list)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    rec = Receiver()

    class Handler(JsonHandler):
        def do_GET(self) -> None:
            email = self.path.rsplit("/", 1)[-1].replace("%40", "@")
            rec.asked.append(email)
            if email in rec.leads:
                return self._json(200, {"id": "lead-1", "email": email})
            return self._json(404, {"error": "no such lead"})

    with running(Handler) as base:
        yield rec, base


def app_api(make_app: AppFactory, llm: FakeLLM, tools: dict[str, Any], **config: Any) -> Api:
    upstreams = {k: {"url": llm.root} for k in ("anthropic", "ollama", "azure", "gemini")}
    gate = {**GATE, "upstream_url": llm.base, "upstreams": upstreams}
    return Api(make_app(model_gate=gate, tools=tools, **config).test_client())


@pytest.fixture
def api(make_app: AppFactory, llm: FakeLLM) -> Api:
    return app_api(make_app, llm, {"create_lead": WRITE})


def system(key: str) -> str:
    return f"loopstop-task-key: {key}\nloopstop-workflow: {WORKFLOW}\nYou add leads."


def tools(which: str) -> list[dict[str, Any]]:
    params = {"type": "object", "properties": {"email": {"type": "string"}}}
    if FORMAT[which] in ("chat", "ollama"):
        return [{"type": "function", "function": {"name": "create_lead", "parameters": params}}]
    if which == "anthropic":
        return [{"name": "create_lead", "input_schema": params}]
    if which == "gemini":
        return [{"functionDeclarations": [{"name": "create_lead", "parameters": params}]}]
    return [{"type": "function", "name": "create_lead", "parameters": params, "strict": None}]


def params_of(which: str, body: dict[str, Any]) -> dict[str, Any]:
    """The first tool's JSON schema in a request body."""
    tool = body["tools"][0]
    if FORMAT[which] in ("chat", "ollama"):
        return dict(tool["function"]["parameters"])
    if which == "gemini":
        return dict(tool["functionDeclarations"][0]["parameters"])
    return dict(tool["input_schema"] if which == "anthropic" else tool["parameters"])


@dataclass
class Said:
    """What the gate answered, read: its text and the calls it relayed."""

    status: int
    text: str
    calls: list[tuple[str, str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)


class Agent:
    """One n8n AI Agent execution: its history, re-sent with every turn (n8n
    echoes a call back with an extra ``id`` in its arguments)."""

    def __init__(self, api: Api, which: str, key: str, text: str = LEAD, stream: bool = False):
        self.api, self.which, self.stream = api, which, stream
        #: tools offered besides ``create_lead`` (in the API's shape)
        self.more_tools: list[dict[str, Any]] = []
        self.format = FORMAT[which]
        self.system = system(key)
        if self.format in ("chat", "ollama"):
            self.history: list[dict[str, Any]] = [
                {"role": "system", "content": self.system},
                {"role": "user", "content": text},
            ]
        elif self.format == "anthropic":
            self.history = [{"role": "user", "content": text}]
        elif self.format == "gemini":  # as n8n's Google Gemini Chat Model sends it
            self.history = [{"role": "user", "parts": [{"text": text}]}]
        else:
            self.history = [
                {"type": "message", "role": "system", "content": self.system},
                {"type": "message", "role": "user", "content": text},
            ]

    def body(self) -> dict[str, Any]:
        if self.format == "gemini":
            return {
                "generationConfig": {"stopSequences": []},
                "tools": tools(self.which),
                "systemInstruction": {"role": "system", "parts": [{"text": self.system}]},
                "contents": list(self.history),
            }
        items = "input" if self.format == "responses" else "messages"
        out = {
            "model": "fake-model",
            items: list(self.history),
            "tools": [*tools(self.which), *self.more_tools],
            "stream": self.stream,
        }
        if self.format == "anthropic":
            out |= {"system": self.system, "max_tokens": 256}
        return out

    def ask(self) -> Said:
        path = GEMINI_STREAM if self.stream and self.format == "gemini" else PATHS[self.which]
        if not self.stream:
            status, out = self.api.post(path, self.body())
            if status != 200:
                return Said(status, "", [])
            return read_answer(self.which, status, out)
        r = self.api.client.post(
            path, json=self.body(), headers={"Authorization": f"Bearer {N8N_TOKEN}"}
        )
        if r.status_code != 200:
            return Said(r.status_code, "", [])
        if self.format == "ollama":
            lines = [json.loads(x) for x in r.get_data(as_text=True).splitlines()]
            return read_stream(self.which, lines)
        events = [
            json.loads(e.data)
            for e in sseclient.SSEClient([r.get_data()]).events()
            if e.data != "[DONE]"
        ]
        return read_stream(self.which, events)

    def ran(self, call: tuple[str, str, Any], output: str) -> None:
        """The agent ran the tool: the call (echoed with its ``id``) and its output."""
        call_id, name, args = call
        echoed = json.dumps({**args, "id": call_id})
        if self.format == "gemini":  # n8n's uuid in the args; the output under response.result
            fn = {"name": name, "args": {**args, "id": call_id}}
            result = {"name": name, "response": {"result": output}}
            self.history += [
                {"role": "model", "parts": [{"functionCall": fn}]},
                {"role": "user", "parts": [{"functionResponse": result}]},
            ]
        elif self.format == "anthropic":
            use = {"type": "tool_use", "id": call_id, "name": name, "input": args}
            result = {"type": "tool_result", "tool_use_id": call_id, "content": output}
            self.history += [
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [result]},
            ]
        elif self.format == "ollama":  # LangChain's uuid; the tool message has no id
            fn = {"name": name, "arguments": {**args, "id": call_id}}
            self.history += [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": call_id, "type": "function", "function": fn}],
                },
                {"role": "tool", "content": output},
            ]
        elif self.format == "chat":
            self.history += [
                {
                    "role": "assistant",
                    "content": [],
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": echoed},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": output},
            ]
        else:
            self.history += [
                {"type": "function_call", "call_id": call_id, "name": name, "arguments": echoed},
                {"type": "function_call_output", "call_id": call_id, "output": output},
            ]


def _lc_id() -> str:
    """The id LangChain gives a call of an API that gives none (Ollama)."""
    return str(uuid.uuid4())


def _gemini(chunks: list[dict[str, Any]]) -> tuple[str, list[tuple[str, str, Any]]]:
    """The text and calls of Gemini answers (a stream's chunks, or one answer)."""
    parts = [
        p for c in chunks for cand in c.get("candidates") or [] for p in cand["content"]["parts"]
    ]
    text = "".join(p.get("text", "") for p in parts)
    calls = [
        (_lc_id(), p["functionCall"]["name"], p["functionCall"]["args"])
        for p in parts
        if "functionCall" in p
    ]
    return text, calls


def read_answer(which: str, status: int, out: dict[str, Any]) -> Said:
    if which == "gemini":
        return Said(status, *_gemini([out]))
    if FORMAT[which] == "anthropic":
        text = "".join(b["text"] for b in out["content"] if b["type"] == "text")
        uses = [(b["id"], b["name"], b["input"]) for b in out["content"] if b["type"] == "tool_use"]
        return Said(status, text, uses)
    if FORMAT[which] == "ollama":
        message = out["message"]
        calls = [
            (_lc_id(), c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls") or []
        ]
        return Said(status, str(message.get("content") or ""), calls)
    if FORMAT[which] == "chat":
        message = out["choices"][0]["message"]
        calls = [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls") or []
        ]
        return Said(status, str(message.get("content") or ""), calls)
    text = "".join(p["text"] for i in out["output"] if i["type"] == "message" for p in i["content"])
    calls = [
        (i["call_id"], i["name"], json.loads(i["arguments"]))
        for i in out["output"]
        if i["type"] == "function_call"
    ]
    return Said(status, text, calls)


def read_stream(which: str, events: list[dict[str, Any]]) -> Said:
    if which == "gemini":
        return Said(200, *_gemini(events), events)
    if FORMAT[which] == "anthropic":
        assert [e["type"] for e in events].count("message_start") == 1, "one Message"
        assert events[-1]["type"] == "message_stop"
        blocks: dict[int, dict[str, Any]] = {}
        for e in events:
            if e["type"] == "content_block_start":
                assert e["index"] not in blocks, "block indexes are never reused"
                blocks[e["index"]] = {**e["content_block"], "text": "", "json": ""}
            elif e["type"] == "content_block_delta":
                d = e["delta"]
                blocks[e["index"]]["text"] += d.get("text", "")
                blocks[e["index"]]["json"] += d.get("partial_json", "")
        text = "".join(b["text"] for b in blocks.values() if b["type"] == "text")
        uses = [
            (b["id"], b["name"], json.loads(b["json"] or "{}"))
            for _, b in sorted(blocks.items())
            if b["type"] == "tool_use"
        ]
        return Said(200, text, uses, events)
    if FORMAT[which] == "ollama":
        assert [e.get("done") for e in events] == [False] * (len(events) - 1) + [True]
        text = "".join(e["message"].get("content") or "" for e in events)
        calls = [
            (_lc_id(), c["function"]["name"], c["function"]["arguments"])
            for e in events
            for c in e["message"].get("tool_calls") or []
        ]
        return Said(200, text, calls, events)
    if FORMAT[which] == "chat":
        text, parts = "", {}
        for chunk in events:
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                text += delta.get("content") or ""
                for c in delta.get("tool_calls") or []:
                    part = parts.setdefault(c["index"], {"args": ""})
                    part.update({k: c[k] for k in ("id",) if c.get(k)})
                    fn = c.get("function") or {}
                    if fn.get("name"):
                        part["name"] = fn["name"]
                    part["args"] += fn.get("arguments") or ""
        calls = [(p["id"], p["name"], json.loads(p["args"])) for _, p in sorted(parts.items())]
        return Said(200, text, calls, events)
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    done = [e for e in events if e["type"] == "response.completed"]
    assert len(done) == 1, "one answer: one response.completed"
    calls = [
        (i["call_id"], i["name"], json.loads(i["arguments"]))
        for i in done[0]["response"]["output"]
        if i["type"] == "function_call"
    ]
    return Said(200, text, calls, events)


def task_of(api: Api, key: str) -> dict[str, Any]:
    status, out = api.post("/v1/tasks", {"task_key": key, "workflow": WORKFLOW})
    assert status == 200, out  # made by the gate
    status, out = api.get(f"/v1/tasks/{out['task']['task_id']}")
    assert status == 200
    return dict(out)


def outputs_sent(which: str, req: dict[str, Any]) -> list[Any]:
    """The tool outputs an upstream request carried."""
    if which == "gemini":
        return [
            p["functionResponse"]["response"]["result"]
            for c in req["contents"]
            for p in c["parts"]
            if "functionResponse" in p
        ]
    if FORMAT[which] == "anthropic":
        return [
            b["content"]
            for m in req["messages"]
            if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"]
            if b["type"] == "tool_result"
        ]
    if FORMAT[which] in ("chat", "ollama"):
        return [m["content"] for m in req["messages"] if m["role"] == "tool"]
    return [i["output"] for i in req["input"] if i.get("type") == "function_call_output"]


LEAD_RECEIPT = '[{"id":"lead-1","email":"ana@example.com"}]'


# -- across executions ------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("which", ALL_APIS)
def test_a_write_delivered_again_is_answered_from_the_ledger(
    api: Api, llm: FakeLLM, which: str, stream: bool
) -> None:
    """Execution 1 writes the lead, then the upstream fails: the execution fails.
    Execution 2 (the webhook delivered again, same task key) starts from scratch;
    the model proposes the same create: not relayed, the gate answers it with the
    recorded receipt and asks the upstream again, which answers."""
    llm.fail_once = True
    first = Agent(api, which, "lead-1", stream=stream)
    said = first.ask()
    assert [c[1:] for c in said.calls] == [("create_lead", {"email": LEAD})]
    first.ran(said.calls[0], LEAD_RECEIPT)
    failed = first.ask()
    assert failed.status == 500 or "error" in json.dumps(failed.events)
    op = api.get(f"/v1/operations/crm-lead:{LEAD}", workflow=WORKFLOW)[1]["operation"]
    assert op["state"] == "committed"
    assert op["receipt"] == {"id": "lead-1", "email": LEAD}  # a list of one item is that item

    before = len(llm.requests)
    second = Agent(api, which, "lead-1", stream=stream)
    answer = second.ask()
    assert answer.status == 200 and answer.calls == []  # nothing for n8n to run
    assert answer.text == "FINAL answer"
    asked = llm.requests[before:]
    assert len(asked) == 2  # the proposal, then the same request asked again
    assert outputs_sent(which, asked[0]) == []
    assert outputs_sent(which, asked[1]) == ['{"id":"lead-1","email":"ana@example.com"}']
    task = task_of(api, "lead-1")
    assert task["envelope"] is None
    assert task["task"]["used"]["model_calls"] == 4  # the re-ask is a counted turn
    assert [(e["tool"], e["decision"], e["operation_id"]) for e in task["gate_exchanges"]] == [
        ("create_lead", "replay", f"crm-lead:{LEAD}")
    ]
    if stream and which == "anthropic":  # one Message (read_stream checks its blocks)
        indexes = [e["index"] for e in answer.events if e["type"] == "content_block_start"]
        assert indexes == list(range(len(indexes)))
    if stream and FORMAT[which] == "chat":  # one completion: one id, one role
        assert len({e["id"] for e in answer.events}) == 1, answer.events
        roles = [c["delta"].get("role") for e in answer.events for c in e["choices"]]
        assert roles.count("assistant") == 1
    if stream and which == "responses":
        kinds = [e["type"] for e in answer.events]
        assert kinds.count("response.created") == 1
        seqs = [e["sequence_number"] for e in answer.events]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_the_decision_line_names_each_write_s_operation(
    api: Api, llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    """A relayed write and a replayed one: each decision line's call names its
    operation id (the operator's way from a line to ``/v1/operations``)."""
    with caplog.at_level(logging.INFO, logger="loopstop.decisions"):
        first = Agent(api, "chat", "lead-17")
        first.ran(first.ask().calls[0], LEAD_RECEIPT)
        first.ask()  # the output settles the write
        Agent(api, "chat", "lead-17").ask()
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "loopstop.decisions"]
    calls = [c for line in lines for c in line.get("tool_calls") or []]
    assert [(c["decision"], c.get("operation_id")) for c in calls] == [
        ("execute", f"crm-lead:{LEAD}"),
        ("replay", f"crm-lead:{LEAD}"),
    ]


@pytest.mark.parametrize("which", ALL_APIS)
def test_kept_exchanges_are_put_back_into_every_later_request(
    api: Api, llm: FakeLLM, which: str
) -> None:
    """After the gate answered a write itself, every later request of the task
    carries that exchange: right after the last user message when the item that
    preceded it is not there (a new execution), else after that item."""
    llm.fail_once = True
    first = Agent(api, which, "lead-2")
    first.ran(first.ask().calls[0], LEAD_RECEIPT)
    assert first.ask().status == 500
    Agent(api, which, "lead-2").ask()  # answered by the gate, kept

    before = len(llm.requests)
    third = Agent(api, which, "lead-2")
    assert third.ask().text == "FINAL answer"
    (sent,) = llm.requests[before:]
    items = sent.get("input") or sent.get("messages") or sent["contents"]
    roles = [i.get("role") or i.get("type") for i in items]
    if FORMAT[which] == "chat":
        assert roles == ["system", "user", "assistant", "tool"]
        assert json.loads(items[2]["tool_calls"][0]["function"]["arguments"]) == {"email": LEAD}
    elif which == "ollama":
        assert roles == ["system", "user", "assistant", "tool"]
        assert items[2]["tool_calls"][0]["function"]["arguments"] == {"email": LEAD}
        assert items[3] == {
            "role": "tool",
            "content": LEAD_RECEIPT[1:-1],
            "tool_name": "create_lead",
        }
    elif which == "gemini":  # the gate's call under its own id, answered in the next content
        assert roles == ["user", "model", "user"]
        ((call,),) = [[p["functionCall"] for p in items[1]["parts"]]]
        ((response,),) = [[p["functionResponse"] for p in items[2]["parts"]]]
        assert (call["name"], call["args"]) == ("create_lead", {"email": LEAD})
        assert response == {
            "id": call["id"],
            "name": "create_lead",
            "response": {"result": LEAD_RECEIPT[1:-1]},
        }
        assert items[1]["parts"][0]["thoughtSignature"] == "skip_thought_signature_validator"
    elif which == "anthropic":  # the alternation: every tool_use answered in the next message
        assert roles == ["user", "assistant", "user"]
        (use,) = items[1]["content"]
        (result,) = items[2]["content"]
        assert (use["type"], use["name"], use["input"]) == (
            "tool_use",
            "create_lead",
            {"email": LEAD},
        )
        assert (result["type"], result["tool_use_id"]) == ("tool_result", use["id"])
    else:
        assert roles == ["system", "user", "function_call", "function_call_output"]
        assert json.loads(items[2]["arguments"]) == {"email": LEAD}


@pytest.mark.parametrize("which", ALL_APIS)
def test_the_same_write_proposed_twice_in_one_run_is_relayed_once(
    api: Api, llm: FakeLLM, which: str
) -> None:
    llm.writes = 2  # the model asks for the same create again after its output
    agent = Agent(api, which, "lead-3")
    said = agent.ask()
    agent.ran(said.calls[0], LEAD_RECEIPT)
    again = agent.ask()
    assert again.calls == [] and again.text == "FINAL answer"
    op = api.get(f"/v1/operations/crm-lead:{LEAD}", workflow=WORKFLOW)[1]["operation"]
    assert op["state"] == "committed" and op["attempt"] == 1


def test_two_different_leads_are_two_writes(api: Api, llm: FakeLLM) -> None:
    for email in ("ana@example.com", "bo@example.com"):
        agent = Agent(api, "responses", "lead-4", text=email)
        said = agent.ask()
        assert [c[2] for c in said.calls] == [{"email": email}]
        agent.ran(said.calls[0], json.dumps([{"id": email}]))
        assert agent.ask().text == "FINAL answer"
    task = task_of(api, "lead-4")
    assert task["task"]["used"]["per_tool"] == {"create_lead": 2}


def test_identical_writes_are_decided_by_the_ledger_not_max_same_call(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    """``max_same_call: 1``: a second proposal of the same committed write is a
    replay, not a ``same_call`` end (the ledger decides repeats of a write)."""
    api = app_api(make_app, llm, {"create_lead": WRITE}, limits={"max_same_call": 1})
    llm.writes = 3
    agent = Agent(api, "chat", "lead-5")
    agent.ran(agent.ask().calls[0], LEAD_RECEIPT)
    assert agent.ask().text == "FINAL answer"
    assert task_of(api, "lead-5")["envelope"] is None


# -- what the output proves ---------------------------------------------------------------------


def _reconcile_tools(base: str) -> tuple[dict[str, Any], dict[str, Any]]:
    checks = {"lead_found": {"kind": "http", "url": base + "/leads/{email}"}}
    tool = {**WRITE, "reconcile": {"check": "lead_found", "input": {"email": "{email}"}}}
    return {"create_lead": tool}, checks


@pytest.mark.parametrize(
    "output",
    ["Lead saved!", '[{"error":"boom","errorType":"NodeApiError"}]'],
    ids=["text", "error"],
)
def test_an_unproven_output_found_by_the_reconcile_check_is_committed(
    make_app: AppFactory, llm: FakeLLM, receiver: tuple[Receiver, str], output: str
) -> None:
    rec, base = receiver
    tools_cfg, checks = _reconcile_tools(base)
    api = app_api(make_app, llm, tools_cfg, checks=checks)
    rec.leads.add(LEAD)
    agent = Agent(api, "responses", "lead-6")
    agent.ran(agent.ask().calls[0], output)
    assert agent.ask().text == "FINAL answer"  # the task goes on
    assert rec.asked == [LEAD]
    op = api.get(f"/v1/operations/crm-lead:{LEAD}", workflow=WORKFLOW)[1]["operation"]
    assert op["state"] == "committed"
    assert op["reconciliation"]["actor"] == "check:lead_found"
    # delivered again: answered from the ledger, never written twice
    before = len(llm.requests)
    assert Agent(api, "responses", "lead-6").ask().calls == []
    assert len(llm.requests[before:]) == 2


def test_an_unproven_output_the_check_proves_absent_lets_the_model_write_again(
    make_app: AppFactory, llm: FakeLLM, receiver: tuple[Receiver, str]
) -> None:
    _, base = receiver
    tools_cfg, checks = _reconcile_tools(base)
    api = app_api(make_app, llm, tools_cfg, checks=checks)
    agent = Agent(api, "chat", "lead-7")
    agent.ran(agent.ask().calls[0], "gateway timeout")
    assert agent.ask().text == "FINAL answer"
    op = api.get(f"/v1/operations/crm-lead:{LEAD}", workflow=WORKFLOW)[1]["operation"]
    assert op["state"] == "not_committed"
    again = Agent(api, "chat", "lead-7").ask()
    assert [c[2] for c in again.calls] == [{"email": LEAD}]  # relayed: attempt 2
    op = api.get(f"/v1/operations/crm-lead:{LEAD}", workflow=WORKFLOW)[1]["operation"]
    assert (op["state"], op["attempt"]) == ("in_progress", 2)


def output_id(output: str) -> str:
    return "text" if output == "Lead saved!" else "no-id"


@pytest.mark.parametrize("output", ["Lead saved!", '[{"saved":true}]'], ids=["text", "no-id"])
def test_an_unproven_output_without_a_reconcile_check_needs_reconciliation(
    api: Api, llm: FakeLLM, output: str
) -> None:
    agent = Agent(api, "chat", "lead-8")
    agent.ran(agent.ask().calls[0], output)
    said = agent.ask()
    assert said.calls == [] and "needs_reconciliation (unknown_commit)" in said.text
    task = task_of(api, "lead-8")
    assert task["envelope"]["uncertain_operations"] == [f"crm-lead:{LEAD}"]
    _, got = api.get(f"/v1/operations/crm-lead:{LEAD}", workflow=WORKFLOW)
    why = {"text": "the tool's output is not JSON", "no-id": "committed_when does not hold"}
    assert why[output_id(output)] in got["operation"]["last_failure"]["detail"]
    # delivered again: nothing is relayed, the task stays ended
    before = len(llm.requests)
    assert Agent(api, "chat", "lead-8").ask().calls == []
    assert llm.requests[before:] == []


# -- a run that died after relaying ---------------------------------------------------------


@pytest.mark.parametrize("which", ALL_APIS)
def test_a_run_killed_after_relaying_ends_the_next_run_needing_reconciliation(
    api: Api, llm: FakeLLM, clock: Clock, which: str
) -> None:
    first = Agent(api, which, "lead-9")
    assert first.ask().calls  # relayed; the execution dies before the tool's output comes
    clock.advance(WRITE["lease_s"] + 1)
    second = Agent(api, which, "lead-9").ask()
    assert second.calls == [] and "needs_reconciliation (unknown_commit)" in second.text
    status, page = api.get("/v1/operations", state="unknown", workflow=WORKFLOW)
    assert status == 200
    assert [o["operation_id"] for o in page["items"]] == [f"crm-lead:{LEAD}"]


@pytest.mark.parametrize("which", ALL_APIS)
def test_a_write_another_execution_holds_is_not_relayed(api: Api, llm: FakeLLM, which: str) -> None:
    first = Agent(api, which, "lead-10")
    assert first.ask().calls  # relayed, its output not back yet
    before = len(llm.requests)
    other = Agent(api, which, "lead-10").ask()
    assert other.calls == [] and other.text == "FINAL answer"
    asked = llm.requests[before:]
    assert len(asked) == 2
    assert "Another execution is writing this" in outputs_sent(which, asked[1])[0]


@pytest.mark.parametrize("which", ALL_APIS)
def test_an_in_progress_answer_is_not_kept_after_the_other_execution_died(
    api: Api, llm: FakeLLM, clock: Clock, which: str
) -> None:
    """ "Another execution is writing this" answers its own request only: kept, it
    would be put back after that execution died, the model would never ask
    again, the task would stay running and the write stay unknown unseen."""
    assert Agent(api, which, "lead-16").ask().calls  # relayed; this execution dies
    assert Agent(api, which, "lead-16").ask().calls == []  # in_progress, answered by the gate
    _, task = api.post("/v1/tasks", {"task_key": "lead-16", "workflow": WORKFLOW})
    _, got = api.get(f"/v1/tasks/{task['task']['task_id']}")
    assert got["gate_exchanges"] == []
    clock.advance(WRITE["lease_s"] + 1)
    before = len(llm.requests)
    third = Agent(api, which, "lead-16").ask()
    assert third.calls == [] and "needs_reconciliation (unknown_commit)" in third.text
    assert all(
        "Another execution" not in out
        for r in llm.requests[before:]
        for out in outputs_sent(which, r)
    )


# -- the template -----------------------------------------------------------------------------


@pytest.mark.parametrize("args", [{}, {"email": ""}, {"email": None}, {"email": ["a"]}])
def test_a_call_the_template_cannot_name_ends_the_task_invalid_call(
    make_app: AppFactory, llm: FakeLLM, args: dict[str, Any]
) -> None:
    tool = {**WRITE, "operation_id": "crm-lead:{contact.email}"}
    api = app_api(make_app, llm, {"create_lead": tool})
    said = Agent(api, "chat", f"lead-11-{json.dumps(args)}").ask()
    assert said.calls == [] and "blocked (invalid_call)" in said.text


def test_a_value_outside_the_pattern_is_hashed_stably(api: Api, llm: FakeLLM) -> None:
    said = Agent(api, "chat", "lead-12", text="Ana Lopez <ana@example.com>").ask()
    assert said.calls
    task = task_of(api, "lead-12")
    _, page = api.get("/v1/operations", state="in_progress", workflow=WORKFLOW)
    ids = [o["operation_id"] for o in page["items"]]
    assert len(ids) == 1 and ids[0].startswith("crm-lead:h") and len(ids[0]) == 9 + 21
    assert task["envelope"] is None


@pytest.mark.parametrize("which", ALL_APIS)
def test_the_same_operation_with_other_arguments_is_a_conflict(
    make_app: AppFactory, llm: FakeLLM, which: str
) -> None:
    tool = {**WRITE, "operation_id": "crm-lead:{email}"}
    api = app_api(make_app, llm, {"create_lead": tool})
    agent = Agent(api, which, "lead-13")
    agent.ran(agent.ask().calls[0], LEAD_RECEIPT)
    assert agent.ask().text == "FINAL answer"
    other = Agent(api, which, "lead-13")
    # Ollama's calls are numbered by position: another execution that opens alike
    # names itself (DESIGN §5), or its first call takes the first one's id
    other.system += "\nloopstop-execution: 2"
    if FORMAT[which] not in ("anthropic", "gemini"):
        other.history[0]["content"] = other.system
    # the same email under another tool schema: other arguments, same operation id
    body = other.body()
    params = params_of(which, body)
    params["properties"] = {**params["properties"], "note": {"type": "string"}}
    key = "input_schema" if which == "anthropic" else "parameters"
    if FORMAT[which] in ("chat", "ollama"):
        body["tools"] = [{**body["tools"][0], "function": {"name": "create_lead", key: params}}]
    elif which == "gemini":
        body["tools"] = [{"functionDeclarations": [{"name": "create_lead", key: params}]}]
    else:
        body["tools"] = [{**body["tools"][0], key: params}]
    status, out = api.post(PATHS[which], {**body, "stream": False})
    said = read_answer(which, status, out)
    assert said.calls == [] and "blocked (operation_conflict)" in said.text
    assert task_of(api, "lead-13")["envelope"]["reason"] == "operation_conflict"


# -- many executions at once --------------------------------------------------------------------


def test_simultaneous_runs_relay_one_write(api: Api, llm: FakeLLM) -> None:
    """16 threads, one task, the same write: exactly one is relayed (in one app;
    tests/process/test_serve.py runs it against 2 gunicorn workers on every store)."""
    said: list[Said] = []
    lock = threading.Lock()

    def run() -> None:
        out = Agent(api, "chat", "lead-14").ask()
        with lock:
            said.append(out)

    threads = [threading.Thread(target=run) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(said) == 16
    assert sum(1 for s in said if s.calls) == 1


@pytest.mark.slow
@pytest.mark.all_stores
def test_16_simultaneous_runs_across_2_workers_relay_one_write(
    tmp_path: Path, sidecar_env: dict[str, str], llm: FakeLLM
) -> None:
    """A real ``loopstop serve --workers 2`` on every store: 16 runs of one task
    proposing the same write at once; exactly one is relayed, the others are
    answered by the gate (another execution is writing it)."""
    config = write_config(
        tmp_path / "loopstop.yaml",
        tokens_yaml()
        + f"model_gate: {{upstream_url: '{llm.base}', default_model: fake-model, timeout_s: 10}}\n"
        + "limits: {max_model_calls: 100}\n"
        # the race is the point here, not the store's deadline (tests/stores covers that):
        # 16 transactions on one task document may wait past 2 s on a busy machine
        + "store_timeout_s: 15\n"
        + "tools:\n  create_lead: {kind: write, operation_id: 'crm-lead:{email}', lease_s: 120}\n",
    )
    served = Sidecar(tmp_path, {**sidecar_env, "LOOPSTOP_CONFIG": str(config)}, workers=2)
    served.start()
    try:
        body = Agent(Api(None), "chat", "lead-15").body()  # type: ignore[arg-type]
        start = threading.Barrier(16)

        def run(_: int) -> Said:
            start.wait()
            r = requests.post(
                served.base + PATHS["chat"],
                json=body,
                headers={"Authorization": f"Bearer {N8N_TOKEN}"},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            return read_answer("chat", 200, r.json())

        with ThreadPoolExecutor(16) as pool:
            said = list(pool.map(run, range(16)))
        assert sum(1 for s in said if s.calls) == 1
        assert [s.text for s in said if not s.calls] == ["FINAL answer"] * 15
        got = requests.post(
            served.base + "/v1/tasks",
            json={"task_key": "lead-15", "workflow": WORKFLOW},
            headers={"Authorization": f"Bearer {N8N_TOKEN}"},
            timeout=10,
        ).json()
        # each turn counted; a run that came after the gate kept its exchange got it
        # put back in its first request, and the model answered without a proposal
        assert got["task"]["used"]["model_calls"] == len(llm.requests)
        assert 16 <= len(llm.requests) <= 31
    finally:
        served.stop()


# -- configuration ------------------------------------------------------------------------------


def test_check_config_rejects_a_template_that_does_not_parse(make_app: AppFactory) -> None:
    from sidecar.config import Settings
    from sidecar.errors import ConfigError

    for bad in ("crm-lead:{email", "crm-lead:{[}", "crm lead:{email}", "crm-lead:{}"):
        with pytest.raises(ConfigError) as err:
            Settings.from_mapping({"tools": {"create_lead": {**WRITE, "operation_id": bad}}})
        assert [p for p, _ in err.value.problems] == ["tools.create_lead.operation_id"]
    with pytest.raises(ConfigError) as err:
        Settings.from_mapping({"tools": {"create_lead": {**WRITE, "committed_when": "[["}}})
    assert [p for p, _ in err.value.problems] == ["tools.create_lead.committed_when"]


class TwoCalls(JsonHandler):
    """An upstream whose every answer proposes the write, then ``search``."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        calls = [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps({"email": LEAD})},
            }
            for n, name in enumerate(("create_lead", "search"))
        ]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
        self._json(200, {"id": "c", "object": "chat.completion", "choices": [choice]})


def test_a_write_of_an_answer_that_is_not_relayed_is_released(make_app: AppFactory) -> None:
    """An answer proposing the write and a call the policy denies: the final message
    replaces the whole answer, so n8n never runs the write; its operation is
    ``not_committed`` (a later proposal may write), never left in progress."""
    with running(TwoCalls) as base:
        gate = {**GATE, "upstream_url": base}
        policies = {"leads-only": {"tools": ["create_lead"]}}
        api = Api(
            make_app(model_gate=gate, tools={"create_lead": WRITE}, policies=policies).test_client()
        )
        agent = Agent(api, "chat", "lead-16")
        agent.history[0]["content"] += "\nloopstop-policy: leads-only"
        body = agent.body()
        search = {"name": "search", "parameters": {"type": "object"}}
        body["tools"] = [*body["tools"], {"type": "function", "function": search}]
        said = read_answer("chat", *api.post(PATHS["chat"], body))
    assert said.calls == [] and "blocked (policy_denied)" in said.text
    op = api.get(f"/v1/operations/crm-lead:{LEAD}", workflow=WORKFLOW)[1]["operation"]
    assert op["state"] == "not_committed"


def test_a_malformed_call_beside_a_write_ends_the_task_before_the_write_begins(
    make_app: AppFactory,
) -> None:
    """The proposal is screened as a whole first: ``search`` is not offered, so the
    task ends ``blocked``, ``invalid_call``, and the write's operation is never
    begun (nothing of the answer reaches n8n)."""
    with running(TwoCalls) as base:
        gate = {**GATE, "upstream_url": base}
        api = Api(make_app(model_gate=gate, tools={"create_lead": WRITE}).test_client())
        said = Agent(api, "chat", "lead-18").ask()
    assert said.calls == [] and "blocked (invalid_call)" in said.text
    status, _ = api.get(f"/v1/operations/crm-lead:{LEAD}", workflow=WORKFLOW)
    assert status == 404
    task = task_of(api, "lead-18")
    assert task["envelope"]["reason"] == "invalid_call"
    assert task["task"]["used"]["tool_calls"] == 0


# -- an API that gives calls no id ---------------------------------------------------------------


class ScriptedOllama(JsonHandler):
    """An Ollama upstream that writes the lead, then, once the gate answered that
    write itself (a tool message naming ``create_lead``: n8n's name none), asks
    for a read; after n8n's own tool output, it answers."""

    requests: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        ScriptedOllama.requests.append(req)
        last = req["messages"][-1]
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        if last["role"] != "tool":
            fn = {"name": "create_lead", "arguments": {"email": LEAD}}
            message["tool_calls"] = [{"function": fn}]
        elif last.get("tool_name") == "create_lead":
            message["tool_calls"] = [{"function": {"name": "search", "arguments": {"q": "x"}}}]
        else:
            message["content"] = "FINAL answer"
        counts = {"prompt_eval_count": 7, "eval_count": 3}
        self._json(200, {"model": "fake-model", "message": message, "done": True, **counts})


def test_a_gate_answered_exchange_does_not_shift_the_numbers_of_the_calls_n8n_sees(
    make_app: AppFactory,
) -> None:
    """Ollama gives calls no id: the gate numbers them by their place in the
    conversation n8n sends. Execution 2 of a task whose lead is written: the
    model proposes the write (answered by the gate, which asks again), then a
    read; the read is relayed as the first call of n8n's conversation (the
    gate's exchange is not counted), so n8n's output of it is recorded when it
    comes back: the write answered from the ledger and the read share a
    number, and are two calls."""
    from sidecar.gate.wire import OLLAMA
    from sidecar.gate.wire.base import Proposal

    with running(ScriptedOllama) as base:
        gate = {**GATE, "upstreams": {"ollama": {"url": base}}}
        api = Api(make_app(model_gate=gate, tools={"create_lead": WRITE}).test_client())
        first = Agent(api, "ollama", "lead-17")
        said = first.ask()
        assert [c[1:] for c in said.calls] == [("create_lead", {"email": LEAD})]
        first.ran(said.calls[0], LEAD_RECEIPT)
        assert first.ask().text == "FINAL answer"

        second = Agent(api, "ollama", "lead-17")
        second.history[0]["content"] += "\nloopstop-execution: 2"  # as DESIGN §5 asks
        search = {"name": "search", "parameters": {"type": "object"}}
        second.more_tools = [{"type": "function", "function": search}]  # offered, as n8n does
        opening = second.body()
        said = second.ask()
        assert [c[1:] for c in said.calls] == [("search", {"q": "x"})]  # the write: not relayed
        second.ran(said.calls[0], '[{"found":true}]')
        assert second.ask().text == "FINAL answer"
        # the gate's exchange was put back before n8n's own call, not taken for it
        sent = ScriptedOllama.requests[-1]["messages"]
        names = [
            (m["role"], [c["function"]["name"] for c in m.get("tool_calls") or []]) for m in sent
        ]
        assert names == [
            ("system", []),
            ("user", []),
            ("assistant", ["create_lead"]),
            ("tool", []),
            ("assistant", ["search"]),
            ("tool", []),
        ]
        task = task_of(api, "lead-17")
        assert [e["decision"] for e in task["gate_exchanges"]] == ["replay"]
        assert task["envelope"] is None

    task_id = task["task"]["task_id"]
    numbered = OLLAMA.number_calls(opening, [Proposal("", "search", {}), Proposal("", "x", {})])
    first_id, shifted_id = (p.call_id for p in numbered)
    result = {"status": "ok", "result": "again"}
    # the read's output was recorded under its number in n8n's conversation
    status, out = api.post(f"/v1/tasks/{task_id}/tool-calls/{first_id}/result", result)
    assert status == 409 and "already has a result" in out["detail"], out
    status, _ = api.post(f"/v1/tasks/{task_id}/tool-calls/{shifted_id}/result", result)
    assert status == 404  # no call was ever numbered after the gate's exchange

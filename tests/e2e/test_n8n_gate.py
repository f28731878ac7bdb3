"""End to end: n8n 2.41.1's AI Agent guarded by the model gate alone.

One n8n (headless, SQLite, loopback), one sidecar (``loopstop serve``), the
fake upstream of ``tests/fake_llm.py`` (both OpenAI APIs, streamed or not)
and a recorder the agent's HTTP Request Tool posts to. The agent (latest
typeVersion) has an OpenAI Chat Model node at its latest typeVersion with
default options (Responses API on), its credential's Base URL on the gate,
and no per-tool Loop Stop node: the gate admits every proposed tool call
and records every tool output. The example ``gate-only-agent.json`` is
imported as shipped (only loopback addresses rewritten); the other flows are
variants of it: a Create Task node and a ``loopstop-task`` line, a Chat
Trigger in streaming mode, the Responses API off, and a policy per request
for the model and token budgets. What n8n itself recorded (its execution
data) is read, not only what the gate answered. Marked ``n8n``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fake_llm import FakeLLM  # noqa: E402
from fake_llm import serve as serve_fake_llm  # noqa: E402
from local_http import JsonHandler, running  # noqa: E402
from n8n_runtime import Install, N8n, build_node_package  # noqa: E402
from served import Sidecar  # noqa: E402

from conftest import free_port  # noqa: E402

pytestmark = pytest.mark.n8n

EXAMPLE = HERE.parents[1] / "workflows-examples" / "gate-only-agent.json"
TOKEN = "e2e-gate-token-0123456789"
MAX_SAME_CALL = 2
MAX_MODEL_CALLS = 3
MAX_TOKENS = 15  # the fake upstream reports 10 tokens a turn: the third turn is refused
MAX_COST = 10  # a turn reserves 5 and costs 3 (see the prices below): the third is refused
FINAL = "[loopstop] This task has ended: "
CHAT_WEBHOOK_ID = "5c0b7e0e-6a57-4f7e-9d1e-3c1f2a9b8d01"


@dataclass
class Recorder:
    """What the agent's tool posted (one entry per tool execution)."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def for_ticket(self, ticket: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c.get("ticket") == ticket]


def _recorder_handler(rec: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.loads(raw or b"{}")
            with rec.lock:
                rec.calls.append(body)
                n = len(rec.calls)
            self._json(201, {"id": f"note-{n}", "saved": True})

    return Handler


@dataclass
class Stack:
    n8n: N8n
    sidecar: Sidecar
    llm: FakeLLM
    recorder: Recorder
    #: every imported flow by id, as imported
    flows: dict[str, dict[str, Any]]

    def task_by_key(self, key: str, workflow: str | None = None) -> dict[str, Any]:
        """The task the gate made under ``key`` (``POST /v1/tasks`` answers it with 200)."""
        body: dict[str, Any] = {"task_key": key}
        if workflow is not None:
            body["workflow"] = workflow
        r = requests.post(
            self.sidecar.base + "/v1/tasks",
            json=body,
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert r.status_code == 200, r.text  # 201 would mean the gate never made it
        return dict(r.json())


def _rewrite(text: str, sidecar: str, recorder: str) -> str:
    return text.replace("http://127.0.0.1:8765", sidecar).replace("http://127.0.0.1:8790", recorder)


def _node(wf: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in wf["nodes"] if n["name"] == name)


def _variant(example: dict[str, Any], wid: str, path: str, system: str) -> dict[str, Any]:
    """The example with its own id, webhook path and System Message."""
    wf = json.loads(json.dumps(example))
    wf["id"], wf["name"] = wid, f"{example['name']} ({wid})"
    for node in wf["nodes"]:
        node["id"] = str(uuid.uuid4())
        if node.get("webhookId"):
            node["webhookId"] = str(uuid.uuid4())
    _node(wf, "Webhook")["parameters"]["path"] = path
    _node(wf, "AI Agent")["parameters"]["options"]["systemMessage"] = system
    return wf


def _with_task_line(example: dict[str, Any]) -> dict[str, Any]:
    """A Create Task node before the agent and a ``loopstop-task`` line (no key line)."""
    wf = _variant(
        example,
        "lsGateTaskLine01",
        "gate-task-line",
        "=loopstop-task: {{ $json.loopstop.task.task_id }}\nYou are a support agent. "
        "Use add_note to add one note to the ticket, then answer in one sentence.",
    )
    _node(wf, "AI Agent")["parameters"]["text"] = "={{ $('Webhook').item.json.body.question }}"
    wf["nodes"].append(
        {
            "id": str(uuid.uuid4()),
            "name": "Create Task",
            "type": "n8n-nodes-loopstop.loopStop",
            "typeVersion": 1,
            "position": [130, -160],
            "parameters": {
                "resource": "task",
                "operation": "create",
                "taskKey": "={{ 'task-line-' + $json.body.ticket }}",
                "additionalFields": {"limits": json.dumps({"max_same_call": MAX_SAME_CALL})},
            },
            "credentials": {"loopStopApi": {"id": "lsGateLoopStop01", "name": "Loop Stop"}},
        }
    )
    wf["connections"]["Webhook"] = {"main": [[{"node": "Create Task", "type": "main", "index": 0}]]}
    wf["connections"]["Create Task"] = {
        "main": [[{"node": "AI Agent", "type": "main", "index": 0}]]
    }
    return wf


def _chat_trigger(example: dict[str, Any]) -> dict[str, Any]:
    """A public Chat Trigger (latest typeVersion) in streaming mode instead of the webhook."""
    wf = _variant(
        example,
        "lsGateChat000001",
        "unused",
        "=loopstop-task-key: chat-{{ $json.sessionId }}\nYou are a support agent. "
        "Use add_note to add one note to the ticket, then answer in one sentence.",
    )
    hook = _node(wf, "Webhook")
    hook.update(
        name="Chat",
        type="@n8n/n8n-nodes-langchain.chatTrigger",
        typeVersion=1.5,
        parameters={"public": True, "mode": "webhook", "options": {"responseMode": "streaming"}},
        webhookId=CHAT_WEBHOOK_ID,
    )
    agent = _node(wf, "AI Agent")
    agent["parameters"]["text"] = "={{ $json.chatInput }}"
    tool = _node(wf, "add_note")
    tool["parameters"]["jsonBody"] = (
        "={{ JSON.stringify({ ticket: 'chat-' + $('Chat').item.json.sessionId, "
        "note: $fromAI('note', 'The note to add to the ticket', 'string') }) }}"
    )
    wf["connections"]["Chat"] = wf["connections"].pop("Webhook")
    return wf


def _chat_completions(example: dict[str, Any]) -> dict[str, Any]:
    wf = _variant(
        example,
        "lsGateNoResp0001",
        "gate-chat-completions",
        _node(example, "AI Agent")["parameters"]["options"]["systemMessage"],
    )
    _node(wf, "OpenAI Chat Model")["parameters"]["responsesApiEnabled"] = False
    return wf


def _budgets(example: dict[str, Any]) -> dict[str, Any]:
    return _variant(
        example,
        "lsGateBudget0001",
        "gate-budget",
        "=loopstop-task-key: budget-{{ $json.body.ticket }}\n"
        "loopstop-policy: {{ $json.body.policy }}\n"
        "loopstop-execution: {{ $execution.id }}\n"
        "You are a support agent. Use add_note to add one note to the ticket.",
    )


FLOWS = ("lsExGateAgent001", "lsGateTaskLine01", "lsGateChat000001", "lsGateNoResp0001")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("n8n-gate")
    started = time.monotonic()
    install = Install().ensure()
    package = build_node_package()
    with ExitStack() as stack:
        recorder = Recorder()
        recorder_base = stack.enter_context(running(_recorder_handler(recorder)))
        llm = stack.enter_context(serve_fake_llm())
        config = work / "loopstop.yaml"
        config.write_text(
            "tokens:\n"
            "  - {name: n8n, env: LOOPSTOP_TOKEN_N8N, workflows: ['*']}\n"
            f"limits: {{max_same_call: {MAX_SAME_CALL}}}\n"
            "policies:\n"
            "  model-budget:\n"
            f"    limits: {{max_model_calls: {MAX_MODEL_CALLS}, max_same_call: 50, max_idle: 50}}\n"
            "  token-budget:\n"
            f"    limits: {{max_tokens: {MAX_TOKENS}, max_same_call: 50, max_idle: 50}}\n"
            "  money-budget:\n"
            f"    limits: {{max_cost: {MAX_COST}, max_same_call: 50, max_idle: 50}}\n"
            "model_gate:\n"
            f"  upstream_url: {llm.base}\n"
            "  api_key_env: E2E_UPSTREAM_KEY\n"
            "  timeout_s: 20\n"
            # 1 unit per output token, at most 5 a turn: a turn reserves 5, costs 3.
            "  max_output_tokens: 5\n"
            "  prices: {gpt-5-mini: {input_per_mtok: 0, output_per_mtok: 1000000},\n"
            "           gpt-4.1-mini: {input_per_mtok: 0, output_per_mtok: 1000000}}\n"
        )
        sidecar = Sidecar(
            work,
            {
                "LOOPSTOP_CONFIG": str(config),
                "LOOPSTOP_STORE": f"sqlite:///{work / 'loopstop.db'}",
                "LOOPSTOP_TOKEN_N8N": TOKEN,
                "E2E_UPSTREAM_KEY": "sk-upstream-fake",
            },
            workers=2,
        ).start()
        stack.callback(sidecar.stop)

        home = work / "n8n-home"
        home.mkdir()
        n8n = N8n(install, home, free_port(), free_port())
        n8n.install_node_package(package)
        creds = work / "credentials.json"
        creds.write_text(
            json.dumps(
                [
                    {
                        "id": "lsExModelGate001",
                        "name": "Loop Stop model gate",
                        "type": "openAiApi",
                        "data": {"apiKey": TOKEN, "url": sidecar.base + "/v1/openai"},
                    },
                    {
                        "id": "lsGateLoopStop01",
                        "name": "Loop Stop",
                        "type": "loopStopApi",
                        "data": {"baseUrl": sidecar.base, "token": TOKEN},
                    },
                ]
            )
        )
        n8n.import_credentials(creds)
        flows = work / "workflows"
        flows.mkdir()
        shipped = _rewrite(EXAMPLE.read_text(), sidecar.base, recorder_base)
        (flows / EXAMPLE.name).write_text(shipped)
        example = json.loads(shipped)
        imported = {example["id"]: example}
        for make in (_with_task_line, _chat_trigger, _chat_completions, _budgets):
            wf = make(example)
            imported[wf["id"]] = wf
            (flows / f"{wf['id']}.json").write_text(json.dumps(wf))
        n8n.import_workflow(flows)
        for wid in (*FLOWS, "lsGateBudget0001"):
            n8n.publish(wid)
        stack.callback(n8n.stop)
        n8n.start()
        print(f"\n[n8n-gate] stack ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
        yield Stack(n8n, sidecar, llm, recorder, imported)


def _runs(run: Any, node: str) -> list[Any]:
    return list(run["resultData"]["runData"].get(node) or [])


def _agent_output(run: Any) -> str:
    runs = _runs(run, "AI Agent")
    return str(runs[-1]["data"]["main"][0][0]["json"]["output"])


@dataclass
class Driven:
    execution: dict[str, Any]
    run: Any
    upstream: list[dict[str, Any]]
    paths: list[str]


def _drive(stack: Stack, wid: str, send: Any) -> Driven:
    """Run one flow once; returns n8n's execution, its run data and the upstream requests."""
    before = len(stack.llm.requests)
    runs = len(stack.n8n.executions(wid))
    send()
    rows = stack.n8n.wait_settled(wid, runs + 1, timeout=120)
    assert len(rows) == runs + 1, rows
    return Driven(
        rows[-1],
        stack.n8n.run_data(rows[-1]["id"]),
        stack.llm.requests[before:],
        stack.llm.paths[before:],
    )


def _webhook(stack: Stack, path: str, body: dict[str, Any]) -> Any:
    def send() -> None:
        r = stack.n8n.webhook(path, body, timeout=180)
        assert r.status_code == 200, r.text
        send.answer = r.json()  # type: ignore[attr-defined]

    return send


def _assert_same_call(stack: Stack, d: Driven, ticket: str, task: dict[str, Any]) -> None:
    """Ended by the gate after MAX_SAME_CALL tool executions, with a final text answer."""
    assert d.execution["status"] == "success"
    assert len(stack.recorder.for_ticket(ticket)) == MAX_SAME_CALL
    assert len(_runs(d.run, "add_note")) == MAX_SAME_CALL  # n8n's own count
    assert _agent_output(d.run).startswith(FINAL + "partial (same_call)")
    # the model proposed the call once more; the gate answered the final message instead
    assert len(d.upstream) == MAX_SAME_CALL + 1
    envelope = task["envelope"]
    assert (envelope["status"], envelope["reason"]) == ("partial", "same_call")
    assert task["task"]["used"]["tool_calls"] == MAX_SAME_CALL


def test_the_shipped_example_is_ended_by_the_gate(stack: Stack) -> None:
    """Webhook trigger, Responses API (the node's default), a loopstop-task-key line with
    the workflow and execution lines."""
    stack.llm.mode = "tool_call"
    wid = "lsExGateAgent001"
    d = _drive(
        stack,
        wid,
        _webhook(stack, "loopstop-gate-agent", {"ticket": "T-1", "question": "Add a note."}),
    )
    assert set(d.paths) == {"/v1/responses"}
    assert not any(r.get("stream") for r in d.upstream)
    # n8n sends the System Message as a system/developer input item
    first = d.upstream[0]["input"][0]
    assert first["role"] in ("system", "developer") and "loopstop-task-key" in str(first)
    # the tool outputs came back as function_call_output items with the upstream's call ids
    outputs = [i for i in d.upstream[-1]["input"] if i.get("type") == "function_call_output"]
    assert len(outputs) == MAX_SAME_CALL
    task = stack.task_by_key(f"{wid}-T-1", wid)  # the task names its workflow
    _assert_same_call(stack, d, "T-1", task)
    # the loopstop-execution line: the execution is known, so a task stop can reach it
    r = requests.get(
        f"{stack.sidecar.base}/v1/tasks/{task['task']['task_id']}",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert [e["execution_id"] for e in r.json()["executions"]] == [str(d.execution["id"])]


def test_a_create_task_node_and_a_task_line(stack: Stack) -> None:
    stack.llm.mode = "tool_call"
    wid = "lsGateTaskLine01"
    d = _drive(
        stack, wid, _webhook(stack, "gate-task-line", {"ticket": "T-2", "question": "Add a note."})
    )
    created = _runs(d.run, "Create Task")[0]["data"]["main"][0][0]["json"]["loopstop"]["task"]
    r = requests.get(
        f"{stack.sidecar.base}/v1/tasks/{created['task_id']}",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    _assert_same_call(stack, d, "T-2", r.json())


def test_a_chat_trigger_in_streaming_mode(stack: Stack) -> None:
    stack.llm.mode = "tool_call"
    wid = "lsGateChat000001"
    webhook_id = CHAT_WEBHOOK_ID
    session = "s-3"
    chunks: list[dict[str, Any]] = []

    def send() -> None:
        url = f"{stack.n8n.base}/webhook/{webhook_id}/chat"
        body = {"action": "sendMessage", "sessionId": session, "chatInput": "Add a note."}
        deadline = time.monotonic() + 30
        while True:
            r = requests.post(url, json=body, stream=True, timeout=180)
            if r.status_code != 404 or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if line.strip():
                chunks.append(json.loads(line))

    d = _drive(stack, wid, send)
    assert all(r.get("stream") is True for r in d.upstream), "n8n streams in this mode"
    assert set(d.paths) == {"/v1/responses"}
    text = "".join(str(c.get("content") or "") for c in chunks if c.get("type") == "item")
    assert FINAL + "partial (same_call)" in text, chunks
    task = stack.task_by_key(f"chat-{session}")
    _assert_same_call(stack, d, f"chat-{session}", task)


def test_the_responses_api_switched_off(stack: Stack) -> None:
    stack.llm.mode = "tool_call"
    wid = "lsGateNoResp0001"
    d = _drive(
        stack,
        wid,
        _webhook(stack, "gate-chat-completions", {"ticket": "T-4", "question": "Add a note."}),
    )
    assert set(d.paths) == {"/v1/chat/completions"}
    tools = [m for m in d.upstream[-1]["messages"] if m["role"] == "tool"]
    assert len(tools) == MAX_SAME_CALL
    task = stack.task_by_key(f"{wid}-T-4", wid)
    _assert_same_call(stack, d, "T-4", task)


@pytest.mark.parametrize(
    ("policy", "reason", "upstream_turns"),
    [
        ("model-budget", "model_budget", MAX_MODEL_CALLS),
        ("token-budget", "token_budget", 2),
        ("money-budget", "cost_budget", 2),
    ],
)
def test_a_budget_ends_a_looping_agent_at_its_limit(
    stack: Stack, policy: str, reason: str, upstream_turns: int
) -> None:
    """The model repeats one call forever (identical calls allowed by the policy): the
    model budget (3 turns), the token budget (15 tokens: 10 a turn) or the money
    budget (10: each turn reserves 5 and costs 3, so the third would pass it) ends it."""
    stack.llm.mode = "tool_call"
    wid = "lsGateBudget0001"
    ticket = f"B-{policy}"
    d = _drive(
        stack,
        wid,
        _webhook(
            stack, "gate-budget", {"ticket": ticket, "policy": policy, "question": "Add notes."}
        ),
    )
    assert d.execution["status"] == "success"
    assert len(d.upstream) == upstream_turns
    assert len(_runs(d.run, "add_note")) == upstream_turns
    assert len(stack.recorder.for_ticket(ticket)) == upstream_turns
    assert _agent_output(d.run).startswith(f"{FINAL}partial ({reason})")
    task = stack.task_by_key(f"budget-{ticket}")
    assert (task["envelope"]["status"], task["envelope"]["reason"]) == ("partial", reason)
    if reason == "token_budget":
        assert task["task"]["used"]["tokens"] == 10 * upstream_turns
    if reason == "cost_budget":
        assert task["task"]["used"]["cost"] == 3.0 * upstream_turns


#: The node types whose typeVersion the flows must hold at the latest n8n 2.41.1 knows.
LATEST = (
    "@n8n/n8n-nodes-langchain.agent",
    "@n8n/n8n-nodes-langchain.lmChatOpenAi",
    "@n8n/n8n-nodes-langchain.chatTrigger",
    "n8n-nodes-base.webhook",
)


def test_the_flows_use_the_latest_typeversions_and_default_options(stack: Stack) -> None:
    """The AI Agent, the OpenAI Chat Model, the Chat Trigger and the Webhook of every
    flow are at the newest typeVersion the running n8n offers (its editor's own node
    list); the model node keeps its default options (Responses API on) except in the
    flow that switches the Responses API off, and the agent sets only its System
    Message."""
    known = stack.n8n.node_types()
    seen = set()
    for wid, wf in stack.flows.items():
        for node in wf["nodes"]:
            if node["type"] in LATEST:
                seen.add(node["type"])
                assert node["typeVersion"] == max(known[node["type"]]), (wid, node["name"])
        model = _node(wf, "OpenAI Chat Model")["parameters"]
        assert model["options"] == {}, wid
        if wid == "lsGateNoResp0001":
            assert model["responsesApiEnabled"] is False
        else:
            assert "responsesApiEnabled" not in model, wid  # the node's default: on
        assert set(_node(wf, "AI Agent")["parameters"]["options"]) == {"systemMessage"}, wid
    assert seen == set(LATEST)
    chat = _node(stack.flows["lsGateChat000001"], "Chat")["parameters"]
    assert chat["options"] == {"responseMode": "streaming"}


@pytest.mark.parametrize("mode", ["500", "429", "garbage"])
def test_an_upstream_failure_is_one_counted_turn_and_fails_the_execution(
    stack: Stack, mode: str
) -> None:
    """An upstream 5xx, 429 or unreadable answer: the gate relays an OpenAI-style error
    (a 502 for the unreadable one) and counts the turn; n8n 2.41.1's OpenAI Chat Model
    does not retry it (its failed-attempt handler, @n8n/ai-utilities'
    makeN8nLlmFailedAttemptHandler, rethrows at the first failure: a 429 as "rate limit
    reached", anything else because the error carries no retriesLeft, whatever Max
    Retries says), so the execution ends in error after exactly one request."""
    stack.llm.mode = mode
    wid = "lsExGateAgent001"
    ticket = f"F-{mode}"
    answered: list[requests.Response] = []

    def send() -> None:
        body = {"ticket": ticket, "question": "Add a note."}
        answered.append(stack.n8n.webhook("loopstop-gate-agent", body, timeout=180))

    d = _drive(stack, wid, send)
    assert d.execution["status"] == "error"
    assert answered, "the webhook answered"
    assert len(d.upstream) == 1  # no retry
    assert len(stack.recorder.for_ticket(ticket)) == 0
    assert d.run["resultData"].get("error"), "n8n recorded the failure"
    used = stack.task_by_key(f"{wid}-{ticket}", wid)["task"]["used"]
    assert used["model_calls"] == 1 and used["tokens"] > 0  # counted, by an estimate


def test_the_credential_test_fails_without_an_upstream(stack: Stack, tmp_path: Path) -> None:
    """n8n's own credential test of the OpenAI credential: green on the gate, red on a
    gate with no upstream configured (it answers 503 instead of a model list)."""
    bare = Sidecar(tmp_path, {"LOOPSTOP_TOKEN_N8N": TOKEN, **_tokens_config(tmp_path)}, workers=1)
    bare.start()
    try:
        session = stack.n8n.owner_session()

        def test(url: str) -> dict[str, Any]:
            body = {
                "credentials": {
                    "id": "lsExModelGate001",
                    "name": "Loop Stop model gate",
                    "type": "openAiApi",
                    "data": {"apiKey": TOKEN, "url": url},
                }
            }
            r = session.post(stack.n8n.base + "/rest/credentials/test", json=body, timeout=30)
            assert r.status_code == 200, r.text
            return dict(r.json()["data"])

        assert test(stack.sidecar.base + "/v1/openai")["status"] == "OK"
        assert test(bare.base + "/v1/openai")["status"] == "Error"
    finally:
        bare.stop()


def _tokens_config(folder: Path) -> dict[str, str]:
    config = folder / "bare.yaml"
    config.write_text("tokens:\n  - {name: n8n, env: LOOPSTOP_TOKEN_N8N, workflows: ['*']}\n")
    return {
        "LOOPSTOP_CONFIG": str(config),
        "LOOPSTOP_STORE": f"sqlite:///{folder / 'bare.db'}",
    }

"""End to end: n8n 2.41.1's AI Agent on the Anthropic Chat Model, guarded by the model gate.

One n8n (headless, SQLite, loopback), one sidecar (``loopstop serve``) whose
``model_gate.upstreams.anthropic`` is the stand-in model (which speaks
Anthropic's Messages API beside OpenAI's, and proposes the same tool call for
ever), and the recorder the agent's HTTP Request Tool posts to. The example
``gate-only-agent-anthropic.json`` is imported as shipped (only loopback
addresses rewritten): AI Agent (Max Iterations 10, its default), Anthropic
Chat Model at its newest typeVersion with default options, one tool. Its
variants: the same flow with the credential straight at the stand-in, and a
Chat Trigger in streaming mode. The fixtures and helpers are
``test_n8n_gate.py``'s. Marked ``n8n``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from fake_llm import FakeLLM  # noqa: E402
from fake_llm import serve as serve_fake_llm  # noqa: E402
from local_http import running  # noqa: E402
from n8n_runtime import Install, N8n  # noqa: E402
from served import Sidecar  # noqa: E402
from test_n8n_gate import (  # noqa: E402
    CHAT_WEBHOOK_ID,
    FINAL,
    MAX_SAME_CALL,
    Recorder,
    _agent_output,
    _chat_trigger,
    _drive,
    _node,
    _recorder_handler,
    _rewrite,
    _runs,
    _tokens_config,
    _variant,
    _webhook,
)

from conftest import free_port  # noqa: E402

pytestmark = pytest.mark.n8n

EXAMPLE = HERE.parents[1] / "workflows-examples" / "gate-only-agent-anthropic.json"
TOKEN = "e2e-gate-anthropic-token-0123456789"
UPSTREAM_KEY = "sk-ant-upstream-fake"
MAX_ITERATIONS = 10  # the AI Agent's default
GATE_CRED = {"id": "lsExGateAnthro01", "name": "Loop Stop model gate (Anthropic)"}
DIRECT_CRED = {"id": "lsGateAnthDirect", "name": "Anthropic straight at the stand-in"}
MODEL_NODE = "Anthropic Chat Model"
NODE_TYPE = "@n8n/n8n-nodes-langchain.lmChatAnthropic"


@dataclass
class Stack:
    n8n: N8n
    sidecar: Sidecar
    llm: FakeLLM
    recorder: Recorder
    flows: dict[str, dict[str, Any]]

    def task_by_key(self, key: str, workflow: str | None = None) -> dict[str, Any]:
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


def _direct(example: dict[str, Any]) -> dict[str, Any]:
    """The example with its credential on the stand-in itself (no gate)."""
    system = _node(example, "AI Agent")["parameters"]["options"]["systemMessage"]
    wf = _variant(example, "lsGateAnthDirec1", "gate-anthropic-direct", system)
    _node(wf, MODEL_NODE)["credentials"] = {"anthropicApi": DIRECT_CRED}
    return wf


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("n8n-gate-anthropic")
    started = time.monotonic()
    install = Install().ensure()
    with ExitStack() as stack:
        recorder = Recorder()
        recorder_base = stack.enter_context(running(_recorder_handler(recorder)))
        llm = stack.enter_context(serve_fake_llm())
        config = work / "loopstop.yaml"
        config.write_text(
            "tokens:\n"
            "  - {name: n8n, env: LOOPSTOP_TOKEN_N8N, workflows: ['*']}\n"
            f"limits: {{max_same_call: {MAX_SAME_CALL}}}\n"
            "model_gate:\n"
            "  upstreams:\n"
            f"    anthropic: {{url: '{llm.root}', api_key_env: E2E_ANTHROPIC_KEY}}\n"
            "  timeout_s: 20\n"
        )
        sidecar = Sidecar(
            work,
            {
                "LOOPSTOP_CONFIG": str(config),
                "LOOPSTOP_STORE": f"sqlite:///{work / 'loopstop.db'}",
                "LOOPSTOP_TOKEN_N8N": TOKEN,
                "E2E_ANTHROPIC_KEY": UPSTREAM_KEY,
            },
            workers=2,
        ).start()
        stack.callback(sidecar.stop)
        home = work / "n8n-home"
        home.mkdir()
        n8n = N8n(install, home, free_port(), free_port())
        creds = work / "credentials.json"
        creds.write_text(
            json.dumps(
                [
                    {
                        **GATE_CRED,
                        "type": "anthropicApi",
                        "data": {"apiKey": TOKEN, "url": sidecar.base + "/v1/anthropic"},
                    },
                    {
                        **DIRECT_CRED,
                        "type": "anthropicApi",
                        "data": {"apiKey": UPSTREAM_KEY, "url": llm.root},
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
        for make in (_direct, _chat_trigger):
            wf = make(example)
            imported[wf["id"]] = wf
            (flows / f"{wf['id']}.json").write_text(json.dumps(wf))
        n8n.import_workflow(flows)
        for wid in imported:
            n8n.publish(wid)
        stack.callback(n8n.stop)
        n8n.start()
        print(
            f"\n[n8n-gate-anthropic] ready in {time.monotonic() - started:.0f} s", file=sys.stderr
        )
        yield Stack(n8n, sidecar, llm, recorder, imported)


def test_the_shipped_example_is_ended_by_the_gate(stack: Stack) -> None:
    """Webhook trigger (not streamed): the model proposes the same call for ever; the
    gate ends the task after 2 tool executions and 3 upstream requests."""
    stack.llm.mode = "tool_call"
    wid = "lsExGateAnthro01"
    headers_before = len(stack.llm.headers)
    d = _drive(
        stack,  # type: ignore[arg-type]
        wid,
        _webhook(stack, "loopstop-gate-agent-anthropic", {"ticket": "A-1", "question": "Note."}),  # type: ignore[arg-type]
    )
    assert d.execution["status"] == "success"
    assert _agent_output(d.run).startswith(FINAL + "partial (same_call)")
    assert len(stack.recorder.for_ticket("A-1")) == MAX_SAME_CALL
    assert len(_runs(d.run, "add_note")) == MAX_SAME_CALL  # n8n's own count
    assert len(d.upstream) <= MAX_SAME_CALL + 1 and len(d.upstream) == 3
    # the wire as n8n sent it (through the gate): path, no stream, system, tool_result blocks
    assert set(d.paths) == {"/v1/messages"}
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
    for headers in stack.llm.headers[headers_before:]:
        assert headers["x-api-key"] == UPSTREAM_KEY
        assert headers["anthropic-version"] == "2023-06-01"
        assert TOKEN not in json.dumps(headers)
    task = stack.task_by_key(f"{wid}-A-1", wid)
    assert (task["envelope"]["status"], task["envelope"]["reason"]) == ("partial", "same_call")
    assert task["task"]["used"]["tool_calls"] == MAX_SAME_CALL
    assert task["task"]["used"]["tokens"] == 30  # 7 in + 3 out per turn
    print(
        f"\n[n8n-gate-anthropic] gate: {len(d.upstream)} upstream requests, "
        f"{len(_runs(d.run, 'add_note'))} tool runs; n8n sent "
        f"{sorted(stack.llm.headers[-1])}",
        file=sys.stderr,
    )


def test_the_same_flow_straight_at_the_model_runs_to_max_iterations(stack: Stack) -> None:
    stack.llm.mode = "tool_call"
    wid = "lsGateAnthDirec1"
    answered: list[requests.Response] = []

    def send() -> None:
        body = {"ticket": "A-2", "question": "Note."}
        answered.append(stack.n8n.webhook("gate-anthropic-direct", body, timeout=180))

    d = _drive(stack, wid, send)  # type: ignore[arg-type]
    assert len(d.upstream) == MAX_ITERATIONS
    assert len(_runs(d.run, "add_note")) == MAX_ITERATIONS
    assert d.execution["status"] == "error"  # "Agent stopped due to max iterations"
    print(
        f"\n[n8n-gate-anthropic] direct: {len(d.upstream)} upstream requests, "
        f"execution {d.execution['status']}",
        file=sys.stderr,
    )


def test_a_chat_trigger_in_streaming_mode(stack: Stack) -> None:
    stack.llm.mode = "text_then_tool"
    wid = "lsGateChat000001"
    session = "as-3"
    chunks: list[dict[str, Any]] = []

    def send() -> None:
        url = f"{stack.n8n.base}/webhook/{CHAT_WEBHOOK_ID}/chat"
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

    d = _drive(stack, wid, send)  # type: ignore[arg-type]
    assert all(r.get("stream") is True for r in d.upstream), "n8n streams in this mode"
    assert set(d.paths) == {"/v1/messages"} and len(d.upstream) == MAX_SAME_CALL + 1
    text = "".join(str(c.get("content") or "") for c in chunks if c.get("type") == "item")
    # the model's text streamed through as it came, then the gate's final message
    assert text.startswith("FINAL answer") and FINAL + "partial (same_call)" in text, chunks
    assert len(_runs(d.run, "add_note")) == MAX_SAME_CALL
    task = stack.task_by_key(f"chat-{session}")
    assert task["envelope"]["reason"] == "same_call"
    assert task["task"]["used"]["tokens"] == 30  # input from message_start + last output


def test_the_credential_test_passes_through_the_gate_and_fails_without_upstream(
    stack: Stack, tmp_path: Path
) -> None:
    bare = Sidecar(tmp_path, {"LOOPSTOP_TOKEN_N8N": TOKEN, **_tokens_config(tmp_path)}, workers=1)
    bare.start()
    try:
        session = stack.n8n.owner_session()

        def test(url: str) -> dict[str, Any]:
            body = {
                "credentials": {
                    **GATE_CRED,
                    "type": "anthropicApi",
                    "data": {"apiKey": TOKEN, "url": url},
                }
            }
            r = session.post(stack.n8n.base + "/rest/credentials/test", json=body, timeout=30)
            assert r.status_code == 200, r.text
            return dict(r.json()["data"])

        lists = len(stack.llm.lists)
        assert test(stack.sidecar.base + "/v1/anthropic")["status"] == "OK"
        path, headers = stack.llm.lists[lists]
        assert path == "/v1/models" and headers["x-api-key"] == UPSTREAM_KEY
        assert headers["anthropic-version"] == "2023-06-01" and TOKEN not in json.dumps(headers)
        assert test(bare.base + "/v1/anthropic")["status"] == "Error"
    finally:
        bare.stop()


def test_the_flows_use_the_newest_typeversions_and_default_options(stack: Stack) -> None:
    known = stack.n8n.node_types()
    for wid, wf in stack.flows.items():
        for node in wf["nodes"]:
            if node["type"] in (NODE_TYPE, "@n8n/n8n-nodes-langchain.agent"):
                assert node["typeVersion"] == max(known[node["type"]]), (wid, node["name"])
        assert _node(wf, MODEL_NODE)["parameters"]["options"] == {}, wid
        assert set(_node(wf, "AI Agent")["parameters"]["options"]) == {"systemMessage"}, wid

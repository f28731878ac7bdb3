"""End to end: n8n 2.41.1's AI Agent with the Ollama Chat Model, guarded by the
model gate alone (``/v1/ollama``).

One n8n, one sidecar (``loopstop serve``) whose ``model_gate.upstreams.ollama``
is the stand-in model (its Ollama routes, always proposing the same call), and
the recorder the agent's HTTP Request Tool posts to (tests/e2e/test_n8n_gate.py's
helpers). The example ``gate-only-agent-ollama.json`` is imported as shipped
(loopback addresses rewritten); its variants: the credential straight at the
stand-in (no gate), and a Chat Trigger in streaming mode. What n8n recorded (its
execution data) is read, and what reached the stand-in. Marked ``n8n``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from fake_llm import serve as serve_fake_llm  # noqa: E402
from local_http import running  # noqa: E402
from n8n_runtime import Install, N8n, build_node_package  # noqa: E402
from served import Sidecar  # noqa: E402
from test_n8n_gate import (  # noqa: E402
    FINAL,
    MAX_SAME_CALL,
    TOKEN,
    Recorder,
    Stack,
    _agent_output,
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

EXAMPLE = HERE.parents[1] / "workflows-examples" / "gate-only-agent-ollama.json"
WID = "lsExGateOllama01"
DIRECT = "lsGateOllamaDir1"
CHAT = "lsGateOllamaChat"
CHAT_WEBHOOK_ID = "0d2f8c43-3b8e-4a55-8d8e-7c1b6f0e9a21"
CREDENTIAL = "lsExGateOllamaC1"
MAX_ITERATIONS = 10  # the AI Agent's default


def _direct(example: dict[str, Any], stand_in: str) -> dict[str, Any]:
    """The example with its credential on the stand-in itself (no gate)."""
    wf = _variant(
        example,
        DIRECT,
        "gate-ollama-direct",
        _node(example, "AI Agent")["parameters"]["options"]["systemMessage"],
    )
    creds = _node(wf, "Ollama Chat Model")["credentials"]
    creds["ollamaApi"] = {"id": "lsOllamaDirect01", "name": "Ollama, no gate"}
    return wf


def _chat(example: dict[str, Any]) -> dict[str, Any]:
    """A public Chat Trigger (latest typeVersion) in streaming mode instead of the webhook."""
    wf = _variant(
        example,
        CHAT,
        "unused",
        "=loopstop-task-key: ollama-chat-{{ $json.sessionId }}\nYou are a support agent. "
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
    _node(wf, "AI Agent")["parameters"]["text"] = "={{ $json.chatInput }}"
    _node(wf, "add_note")["parameters"]["jsonBody"] = (
        "={{ JSON.stringify({ ticket: 'chat-' + $('Chat').item.json.sessionId, "
        "note: $fromAI('note', 'The note to add to the ticket', 'string') }) }}"
    )
    wf["connections"]["Chat"] = wf["connections"].pop("Webhook")
    return wf


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("n8n-gate-ollama")
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
            "model_gate:\n"
            f"  upstreams: {{ollama: {{url: '{llm.root}'}}}}\n"
            "  timeout_s: 20\n"
        )
        env = {
            "LOOPSTOP_CONFIG": str(config),
            "LOOPSTOP_STORE": f"sqlite:///{work / 'loopstop.db'}",
            "LOOPSTOP_TOKEN_N8N": TOKEN,
        }
        sidecar = Sidecar(work, env, workers=2).start()
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
                        "id": CREDENTIAL,
                        "name": "Loop Stop model gate (Ollama)",
                        "type": "ollamaApi",
                        "data": {"baseUrl": sidecar.base + "/v1/ollama", "apiKey": TOKEN},
                    },
                    {
                        "id": "lsOllamaDirect01",
                        "name": "Ollama, no gate",
                        "type": "ollamaApi",
                        "data": {"baseUrl": llm.root, "apiKey": ""},
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
        for wf in (_direct(example, llm.root), _chat(example)):
            imported[wf["id"]] = wf
            (flows / f"{wf['id']}.json").write_text(json.dumps(wf))
        n8n.import_workflow(flows)
        for wid in imported:
            n8n.publish(wid)
        stack.callback(n8n.stop)
        n8n.start()
        print(f"\n[n8n-ollama] stack ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
        yield Stack(n8n, sidecar, llm, recorder, imported)


def _send_failing(stack: Stack, path: str, body: dict[str, Any]) -> Any:
    """A webhook send whose flow is expected to fail (n8n answers 500)."""

    def send() -> None:
        r = stack.n8n.webhook(path, body, timeout=180)
        assert r.status_code == 500, r.text

    return send


def _assert_same_call(stack: Stack, d: Any, ticket: str, task: dict[str, Any]) -> None:
    assert d.execution["status"] == "success"
    assert len(stack.recorder.for_ticket(ticket)) == MAX_SAME_CALL
    assert len(_runs(d.run, "add_note")) == MAX_SAME_CALL  # n8n's own count
    assert _agent_output(d.run).startswith(FINAL + "partial (same_call)")
    assert len(d.upstream) == MAX_SAME_CALL + 1
    envelope = task["envelope"]
    assert (envelope["status"], envelope["reason"]) == ("partial", "same_call")
    assert task["task"]["used"]["tool_calls"] == MAX_SAME_CALL


def test_the_shipped_example_is_ended_by_the_gate(stack: Stack) -> None:
    """Webhook trigger (not streaming): n8n's Ollama node streams all the same."""
    stack.llm.mode = "tool_call"
    before = len(stack.llm.headers)
    d = _drive(
        stack,
        WID,
        _webhook(stack, "loopstop-gate-agent-ollama", {"ticket": "O-1", "question": "Add a note."}),
    )
    assert set(d.paths) == {"/api/chat"}
    assert all(r.get("stream") is True for r in d.upstream), "n8n's Ollama node always streams"
    first = d.upstream[0]["messages"][0]
    assert first["role"] == "system" and "loopstop-task-key" in first["content"]
    # the outputs came back as role "tool" messages with nothing to match on but position
    tools = [m for m in d.upstream[-1]["messages"] if m["role"] == "tool"]
    assert len(tools) == MAX_SAME_CALL and all(set(m) == {"role", "content"} for m in tools)
    # no key configured: the stand-in got no Authorization, and never the token
    for headers in stack.llm.headers[before:]:
        assert "authorization" not in {k.lower() for k in headers}
        assert not any(TOKEN in v for v in headers.values())
    _assert_same_call(stack, d, "O-1", stack.task_by_key(f"{WID}-O-1", WID))


def test_the_same_flow_straight_at_the_model_runs_to_max_iterations(stack: Stack) -> None:
    stack.llm.mode = "tool_call"
    body = {"ticket": "O-2", "question": "Add a note."}
    d = _drive(stack, DIRECT, _send_failing(stack, "gate-ollama-direct", body))
    assert len(d.upstream) == MAX_ITERATIONS
    assert d.execution["status"] == "error"
    assert len(stack.recorder.for_ticket("O-2")) >= MAX_ITERATIONS - 1
    print(
        f"\n[n8n-ollama] without the gate: {len(d.upstream)} model requests, "
        f"{len(stack.recorder.for_ticket('O-2'))} tool executions, {d.execution['status']}",
        file=sys.stderr,
    )


def test_a_chat_trigger_in_streaming_mode(stack: Stack) -> None:
    stack.llm.mode = "tool_call"
    session = "os-3"
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

    d = _drive(stack, CHAT, send)
    assert all(r.get("stream") is True for r in d.upstream)
    text = "".join(str(c.get("content") or "") for c in chunks if c.get("type") == "item")
    assert FINAL + "partial (same_call)" in text, chunks
    _assert_same_call(stack, d, f"chat-{session}", stack.task_by_key(f"ollama-chat-{session}"))


def test_the_credential_test_passes_through_the_gate_and_fails_without_an_upstream(
    stack: Stack, tmp_path: Path
) -> None:
    """n8n's own test of the Ollama credential (``GET {Base URL}/api/tags`` with the
    API Key as Bearer): green through the gate, red on a gate with no Ollama upstream."""
    bare = Sidecar(tmp_path, {"LOOPSTOP_TOKEN_N8N": TOKEN, **_tokens_config(tmp_path)}, workers=1)
    bare.start()
    try:
        session = stack.n8n.owner_session()

        def test(url: str, key: str = TOKEN) -> dict[str, Any]:
            body = {
                "credentials": {
                    "id": CREDENTIAL,
                    "name": "Loop Stop model gate (Ollama)",
                    "type": "ollamaApi",
                    "data": {"baseUrl": url, "apiKey": key},
                }
            }
            r = session.post(stack.n8n.base + "/rest/credentials/test", json=body, timeout=30)
            assert r.status_code == 200, r.text
            return dict(r.json()["data"])

        assert test(stack.sidecar.base + "/v1/ollama")["status"] == "OK"
        assert (
            test(stack.sidecar.base + "/v1/ollama", "wrong-token-0123456789")["status"] == "Error"
        )
        assert test(bare.base + "/v1/ollama")["status"] == "Error"
    finally:
        bare.stop()


LATEST = (
    "@n8n/n8n-nodes-langchain.agent",
    "@n8n/n8n-nodes-langchain.lmChatOllama",
    "@n8n/n8n-nodes-langchain.chatTrigger",
    "n8n-nodes-base.webhook",
)


def test_the_flows_use_the_latest_typeversions_and_default_options(stack: Stack) -> None:
    known = stack.n8n.node_types()
    seen = set()
    for wid, wf in stack.flows.items():
        for node in wf["nodes"]:
            if node["type"] in LATEST:
                seen.add(node["type"])
                assert node["typeVersion"] == max(known[node["type"]]), (wid, node["name"])
        assert _node(wf, "Ollama Chat Model")["parameters"]["options"] == {}, wid
        assert set(_node(wf, "AI Agent")["parameters"]["options"]) == {"systemMessage"}, wid
    assert seen == set(LATEST)

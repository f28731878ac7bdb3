"""End to end: n8n 2.41.1's AI Agent with the Azure OpenAI Chat Model, guarded by
the model gate alone (``/v1/azure``).

The second module of the Ollama one's kind (tests/e2e/test_n8n_gate_ollama.py):
one n8n, one sidecar whose ``model_gate.upstreams.azure`` is the stand-in model
(its Azure paths), the recorder the agent's tool posts to. The example
``gate-only-agent-azure.json`` (classic endpoint: the credential's Endpoint on
the gate, the API Key a loopstop token) is imported as shipped; its variants: the
credential straight at the stand-in, a Chat Trigger in streaming mode, and a
credential on a gate with no Azure upstream (Azure's credential has no test in
n8n: a wrong setting shows at the first turn). Marked ``n8n``.
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

EXAMPLE = HERE.parents[1] / "workflows-examples" / "gate-only-agent-azure.json"
WID = "lsExGateAzure001"
DIRECT = "lsGateAzureDir01"
CHAT = "lsGateAzureChat1"
BARE = "lsGateAzureBare1"
CHAT_WEBHOOK_ID = "7a4c2e1b-9d3f-4b6a-8c5e-2f1d0b9a8e71"
MODEL = "Azure OpenAI Chat Model"
API_VERSION = "2025-03-01-preview"
MAX_ITERATIONS = 10  # the AI Agent's default


def _with_credential(wf: dict[str, Any], cred_id: str, name: str) -> dict[str, Any]:
    _node(wf, MODEL)["credentials"]["azureOpenAiApi"] = {"id": cred_id, "name": name}
    return wf


def _copy(example: dict[str, Any], wid: str, path: str) -> dict[str, Any]:
    system = _node(example, "AI Agent")["parameters"]["options"]["systemMessage"]
    return _variant(example, wid, path, system)


def _chat(example: dict[str, Any]) -> dict[str, Any]:
    """A public Chat Trigger (latest typeVersion) in streaming mode instead of the webhook."""
    wf = _variant(
        example,
        CHAT,
        "unused",
        "=loopstop-task-key: azure-chat-{{ $json.sessionId }}\nYou are a support agent. "
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


def _credential(cred_id: str, name: str, endpoint: str, key: str) -> dict[str, Any]:
    data = {
        "endpointType": "classic",
        "apiKey": key,
        "resourceName": "loopstop",
        "apiVersion": API_VERSION,
        "endpoint": endpoint,
    }
    return {"id": cred_id, "name": name, "type": "azureOpenAiApi", "data": data}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("n8n-gate-azure")
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
            f"  upstreams: {{azure: {{url: '{llm.root}', api_key_env: E2E_AZURE_KEY}}}}\n"
            "  timeout_s: 20\n"
        )
        env = {
            "LOOPSTOP_CONFIG": str(config),
            "LOOPSTOP_STORE": f"sqlite:///{work / 'loopstop.db'}",
            "LOOPSTOP_TOKEN_N8N": TOKEN,
            "E2E_AZURE_KEY": "azure-upstream-fake",
        }
        sidecar = Sidecar(work, env, workers=2).start()
        stack.callback(sidecar.stop)
        bare_dir = work / "bare"
        bare_dir.mkdir()
        bare = Sidecar(bare_dir, {"LOOPSTOP_TOKEN_N8N": TOKEN, **_tokens_config(bare_dir)}, 1)
        bare.start()
        stack.callback(bare.stop)
        home = work / "n8n-home"
        home.mkdir()
        n8n = N8n(install, home, free_port(), free_port())
        n8n.install_node_package(package)
        creds = work / "credentials.json"
        creds.write_text(
            json.dumps(
                [
                    _credential(
                        "lsExGateAzureC01",
                        "Loop Stop model gate (Azure OpenAI)",
                        sidecar.base + "/v1/azure",
                        TOKEN,
                    ),
                    _credential("lsAzureDirect001", "Azure, no gate", llm.root, "az-direct"),
                    _credential(
                        "lsAzureBare00001", "Gate without Azure", bare.base + "/v1/azure/", TOKEN
                    ),
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
        variants = (
            _with_credential(
                _copy(example, DIRECT, "gate-azure-direct"), "lsAzureDirect001", "Azure, no gate"
            ),
            _with_credential(
                _copy(example, BARE, "gate-azure-bare"), "lsAzureBare00001", "Gate without Azure"
            ),
            _chat(example),
        )
        for wf in variants:
            imported[wf["id"]] = wf
            (flows / f"{wf['id']}.json").write_text(json.dumps(wf))
        n8n.import_workflow(flows)
        for wid in imported:
            n8n.publish(wid)
        stack.callback(n8n.stop)
        n8n.start()
        print(f"\n[n8n-azure] stack ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
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


def test_the_shipped_example_is_ended_by_the_gate(stack: Stack) -> None:
    stack.llm.mode = "tool_call"
    before = len(stack.llm.headers)
    body = {"ticket": "A-1", "question": "Add a note."}
    d = _drive(stack, WID, _webhook(stack, "loopstop-gate-agent-azure", body))
    deployment = _node(stack.flows[WID], MODEL)["parameters"]["model"]
    path = f"/openai/deployments/{deployment}/chat/completions?api-version={API_VERSION}"
    assert set(d.paths) == {path}
    assert not any(r.get("stream") for r in d.upstream)
    # the echoed call: content [] and the call id in its arguments; outputs by call id
    last = d.upstream[-1]["messages"]
    assert [m["content"] for m in last if m["role"] == "assistant"] == [[], []]
    assert len([m for m in last if m["role"] == "tool" and m.get("tool_call_id")]) == 2
    for headers in stack.llm.headers[before:]:
        assert headers["api-key"] == "azure-upstream-fake"
        assert not any(TOKEN in v for v in headers.values())
    _assert_same_call(stack, d, "A-1", stack.task_by_key(f"{WID}-A-1", WID))


def test_the_same_flow_straight_at_the_model_runs_to_max_iterations(stack: Stack) -> None:
    stack.llm.mode = "tool_call"
    body = {"ticket": "A-2", "question": "Add a note."}
    d = _drive(stack, DIRECT, _send_failing(stack, "gate-azure-direct", body))
    assert len(d.upstream) == MAX_ITERATIONS
    assert d.execution["status"] == "error"
    print(
        f"\n[n8n-azure] without the gate: {len(d.upstream)} model requests, "
        f"{len(stack.recorder.for_ticket('A-2'))} tool executions, {d.execution['status']}",
        file=sys.stderr,
    )


def test_a_chat_trigger_in_streaming_mode(stack: Stack) -> None:
    stack.llm.mode = "tool_call"
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

    d = _drive(stack, CHAT, send)
    assert all(r.get("stream") is True for r in d.upstream)
    assert all(r["stream_options"] == {"include_usage": True} for r in d.upstream)
    text = "".join(str(c.get("content") or "") for c in chunks if c.get("type") == "item")
    assert FINAL + "partial (same_call)" in text, chunks
    _assert_same_call(stack, d, f"chat-{session}", stack.task_by_key(f"azure-chat-{session}"))


def test_a_gate_without_an_azure_upstream_fails_the_first_turn(stack: Stack) -> None:
    """No credential test in n8n for Azure: the first turn is where a wrong setting
    shows (the gate answers 503; its Endpoint ends in a slash, so n8n sends ``//openai``)."""
    before = len(stack.llm.requests)
    body = {"ticket": "A-4", "question": "Hi."}
    d = _drive(stack, BARE, _send_failing(stack, "gate-azure-bare", body))
    assert d.execution["status"] == "error"
    assert len(stack.llm.requests) == before
    error = json.dumps(d.run["resultData"]["error"]).lower()
    assert "503" in error or "service unavailable" in error, error

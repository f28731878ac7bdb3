"""End to end: n8n 2.41.1's AI Agent on the Google Gemini Chat Model, guarded by
the model gate alone (``/v1/gemini``).

One n8n (headless, SQLite, loopback) for the module, one sidecar whose
``model_gate.upstreams.gemini`` is the stand-in model in Gemini mode (it
proposes the same call forever, with a ``thoughtSignature``, as Gemini 3
does), and the recorder the agent's HTTP Request Tool posts to. The example
``gate-only-agent-gemini.json`` is imported as shipped (only loopback
addresses rewritten); its variants are the same flow with the credential
straight at the stand-in (the loop runs to Max Iterations) and a Chat
Trigger in streaming mode. n8n's own execution data is read. The helpers
are those of ``test_n8n_gate.py``. Marked ``n8n``.
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
from n8n_runtime import Install, N8n  # noqa: E402
from served import Sidecar  # noqa: E402
from test_n8n_gate import (  # noqa: E402
    CHAT_WEBHOOK_ID,
    FINAL,
    MAX_SAME_CALL,
    TOKEN,
    Recorder,
    Stack,
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

EXAMPLE = HERE.parents[1] / "workflows-examples" / "gate-only-agent-gemini.json"
WID = "lsExGateGemini01"
DIRECT = "lsGeminiDirect01"
CHAT = "lsGateChat000001"
GATE_CRED = "lsExGeminiGate01"
DIRECT_CRED = "lsGeminiDirect01"
MODEL_NODE = "Google Gemini Chat Model"
UPSTREAM_KEY = "gemini-upstream-fake-key"
MAX_ITERATIONS = 10


def _direct(example: dict[str, Any]) -> dict[str, Any]:
    """The example with its credential straight at the stand-in (no gate)."""
    wf = _variant(
        example,
        DIRECT,
        "gemini-direct",
        _node(example, "AI Agent")["parameters"]["options"]["systemMessage"],
    )
    _node(wf, MODEL_NODE)["credentials"] = {
        "googlePalmApi": {"id": DIRECT_CRED, "name": "Stand-in Gemini"}
    }
    return wf


def _credential(cid: str, name: str, host: str, key: str) -> dict[str, Any]:
    return {"id": cid, "name": name, "type": "googlePalmApi", "data": {"host": host, "apiKey": key}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("n8n-gate-gemini")
    started = time.monotonic()
    install = Install().ensure()
    with ExitStack() as stack:
        recorder = Recorder()
        recorder_base = stack.enter_context(running(_recorder_handler(recorder)))
        llm = stack.enter_context(serve_fake_llm(api="gemini"))
        config = work / "loopstop.yaml"
        config.write_text(
            "tokens:\n"
            "  - {name: n8n, env: LOOPSTOP_TOKEN_N8N, workflows: ['*']}\n"
            f"limits: {{max_same_call: {MAX_SAME_CALL}}}\n"
            "model_gate:\n"
            "  upstreams:\n"
            f"    gemini: {{url: '{llm.root}', api_key_env: E2E_GEMINI_KEY}}\n"
            "  timeout_s: 20\n"
        )
        sidecar = Sidecar(
            work,
            {
                "LOOPSTOP_CONFIG": str(config),
                "LOOPSTOP_STORE": f"sqlite:///{work / 'loopstop.db'}",
                "LOOPSTOP_TOKEN_N8N": TOKEN,
                "E2E_GEMINI_KEY": UPSTREAM_KEY,
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
                    _credential(
                        GATE_CRED,
                        "Loop Stop model gate (Gemini)",
                        sidecar.base + "/v1/gemini",
                        TOKEN,
                    ),
                    _credential(DIRECT_CRED, "Stand-in Gemini", llm.root, "direct-key"),
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
        print(f"\n[n8n-gemini] stack ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
        yield Stack(n8n, sidecar, llm, recorder, imported)


def _assert_ended(stack: Stack, upstream: list[dict[str, Any]], output: str, ticket: str) -> None:
    assert len(stack.recorder.for_ticket(ticket)) <= MAX_SAME_CALL
    assert len(upstream) <= MAX_SAME_CALL + 1
    assert output.startswith(FINAL + "partial (same_call)"), output


def test_the_shipped_example_is_ended_by_the_gate(stack: Stack) -> None:
    """Webhook trigger (not streamed): ``:generateContent`` with the key in
    x-goog-api-key, the System Message in systemInstruction, each relayed call
    echoed with n8n's uuid in its args and its thoughtSignature kept, each output
    a functionResponse; ended at the third identical proposal."""
    stack.llm.mode = "tool_call"
    ticket = "G-1"
    before = len(stack.llm.headers)
    d = _drive(
        stack,
        WID,
        _webhook(
            stack, "loopstop-gate-agent-gemini", {"ticket": ticket, "question": "Add a note."}
        ),
    )
    assert d.execution["status"] == "success"
    assert set(d.paths) == {"/v1beta/models/gemini-3-flash-preview:generateContent"}
    headers = stack.llm.headers[before:]
    assert {h.get("x-goog-api-key") for h in headers} == {UPSTREAM_KEY}
    assert TOKEN not in json.dumps([headers, d.paths, d.upstream])
    first = d.upstream[0]
    assert "loopstop-task-key" in json.dumps(first["systemInstruction"])
    last = d.upstream[-1]["contents"]
    calls = [p for c in last for p in c["parts"] if "functionCall" in p]
    outputs = [p for c in last for p in c["parts"] if "functionResponse" in p]
    assert len(calls) == len(outputs) == MAX_SAME_CALL
    assert all("id" in p["functionCall"]["args"] for p in calls)  # n8n's echo
    assert all(p.get("thoughtSignature") for p in calls)
    assert all("result" in p["functionResponse"]["response"] for p in outputs)
    assert len(_runs(d.run, "add_note")) == MAX_SAME_CALL
    _assert_ended(stack, d.upstream, _agent_output(d.run), ticket)
    assert len(d.upstream) == MAX_SAME_CALL + 1
    task = stack.task_by_key(f"{WID}-{ticket}", WID)  # the task names its workflow
    assert (task["envelope"]["status"], task["envelope"]["reason"]) == ("partial", "same_call")
    assert task["task"]["used"]["tool_calls"] == MAX_SAME_CALL
    assert task["task"]["used"]["tokens"] == 10 * (MAX_SAME_CALL + 1)


def test_straight_at_the_stand_in_the_agent_runs_to_max_iterations(stack: Stack) -> None:
    """The control: without the gate the same model runs the tool at every one of the
    agent's Max Iterations (10, its default), and n8n then fails the execution
    (the agent stops at its limit: the webhook answers 500)."""
    stack.llm.mode = "tool_call"
    ticket = "G-direct"
    answered: list[requests.Response] = []

    def send() -> None:
        body = {"ticket": ticket, "question": "Add a note."}
        answered.append(stack.n8n.webhook("gemini-direct", body, timeout=180))

    d = _drive(stack, DIRECT, send)
    assert len(stack.recorder.for_ticket(ticket)) == MAX_ITERATIONS
    assert len(d.upstream) == MAX_ITERATIONS
    assert d.execution["status"] == "error" and answered[0].status_code == 500
    error = d.run["resultData"]["error"]
    assert "iteration" in json.dumps(error).lower(), error


def test_a_chat_trigger_in_streaming_mode(stack: Stack) -> None:
    """With a streaming Chat Trigger the node streams (``:streamGenerateContent?alt=sse``);
    the gate's final text reaches the chat client."""
    stack.llm.mode = "tool_call"
    session = "gs-1"
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
    assert d.execution["status"] == "success"
    assert set(d.paths) == {
        "/v1beta/models/gemini-3-flash-preview:streamGenerateContent?alt=sse"
    }, d.paths
    text = "".join(str(c.get("content") or "") for c in chunks if c.get("type") == "item")
    assert FINAL + "partial (same_call)" in text, chunks
    assert len(d.upstream) == MAX_SAME_CALL + 1
    task = stack.task_by_key(f"chat-{session}")
    assert task["envelope"]["reason"] == "same_call"
    assert len(stack.recorder.for_ticket(f"chat-{session}")) == MAX_SAME_CALL


def test_the_credential_test_passes_through_the_gate_and_fails_without_upstream(
    stack: Stack, tmp_path: Path
) -> None:
    """n8n's test of the Gemini credential (``GET {host}/v1beta/models?key=...``):
    green through the gate, red on a gate with no Gemini upstream (503)."""
    bare = Sidecar(tmp_path, {"LOOPSTOP_TOKEN_N8N": TOKEN, **_tokens_config(tmp_path)}, workers=1)
    bare.start()
    try:
        session = stack.n8n.owner_session()

        def test(host: str) -> dict[str, Any]:
            body = {"credentials": _credential(GATE_CRED, "Loop Stop model gate", host, TOKEN)}
            r = session.post(stack.n8n.base + "/rest/credentials/test", json=body, timeout=30)
            assert r.status_code == 200, r.text
            return dict(r.json()["data"])

        before = len(stack.llm.lists)
        assert test(stack.sidecar.base + "/v1/gemini")["status"] == "OK"
        assert test(stack.sidecar.base + "/v1/gemini/")["status"] == "OK"  # //v1beta
        listed = stack.llm.lists[before:]
        assert [p for p, _ in listed] == ["/v1beta/models"] * 2  # ?key= not forwarded
        assert all(h.get("x-goog-api-key") == UPSTREAM_KEY for _, h in listed)
        assert test(bare.base + "/v1/gemini")["status"] == "Error"
    finally:
        bare.stop()

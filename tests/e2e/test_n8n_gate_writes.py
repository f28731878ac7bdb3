"""End to end: a native n8n write tool runs once per business operation
through the model gate (DESIGN §5.1), in a real n8n 2.41.1.

The session's n8n (``conftest.py``), one ``loopstop serve --workers 2``, the
stand-in model (``workflows-examples/stand-in/model.py``) in ``write`` mode
and a lead recorder (the CRM). The flow: a Webhook, an AI Agent (v3.1) whose
OpenAI Chat Model (latest typeVersion, default options: the Responses API)
points at the gate, and a native HTTP Request Tool ``create_lead`` that POSTs
the lead to the recorder. The model proposes the create on its first turn of
each execution and the upstream fails the turn after it once, so the first
execution fails after writing; the webhook is then delivered again with the
same task key. The same flow with the credential pointing at the stand-in
directly is the control: it writes the lead twice. Marked ``n8n``.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fake_llm import FakeLLM  # noqa: E402
from fake_llm import serve as serve_fake_llm  # noqa: E402
from served import Sidecar  # noqa: E402

from .n8n_runtime import N8n  # noqa: E402
from .shared import Recorder, sidecar  # noqa: E402

pytestmark = pytest.mark.n8n

TOKEN = "e2e-gate-writes-token-0123456789"
GATED, DIRECT, RETRIED = "lsGateWrite00001", "lsGateWriteDir01", "lsGateWriteRtr01"
#: what the recorder answers the HTTP Request Tool for this email (the error shape)
FAILING = "refused@example.com"


def _crm(path: str, body: dict[str, Any], n: int) -> tuple[int, Any]:
    """The CRM's answer to the n-th lead: refused (422) for a ``refused*`` email."""
    if str(body.get("email")).startswith("refused"):
        return 422, {"message": "email refused"}
    return 201, {"id": f"lead-{n}", "email": body.get("email")}


def _flow(wid: str, path: str, credential: str, crm: str, retry: bool = False) -> dict[str, Any]:
    agent: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "name": "AI Agent",
        "type": "@n8n/n8n-nodes-langchain.agent",
        "typeVersion": 3.1,
        "position": [260, 0],
        "parameters": {
            "promptType": "define",
            "text": "={{ $json.body.email }}",
            "options": {
                "systemMessage": "=loopstop-task-key: {{ $json.body.key }}\n"
                "loopstop-workflow: leads\n"
                "You add the lead in the user's message to the CRM with create_lead, once."
            },
        },
    }
    if retry:
        agent.update(retryOnFail=True, maxTries=2, waitBetweenTries=0)
    return {
        "id": wid,
        "name": f"Gate writes e2e ({wid})",
        "active": False,
        "nodes": [
            {
                "id": str(uuid.uuid4()),
                "name": "Webhook",
                "type": "n8n-nodes-base.webhook",
                "typeVersion": 2.1,
                "position": [0, 0],
                "parameters": {
                    "httpMethod": "POST",
                    "path": path,
                    "options": {},
                    "responseMode": "lastNode",
                },
                "webhookId": str(uuid.uuid4()),
            },
            agent,
            {
                "id": str(uuid.uuid4()),
                "name": "OpenAI Chat Model",
                "type": "@n8n/n8n-nodes-langchain.lmChatOpenAi",
                "typeVersion": 1.3,
                "position": [160, 220],
                "parameters": {
                    "model": {"__rl": True, "mode": "list", "value": "gpt-5-mini"},
                    "options": {},
                },
                "credentials": {"openAiApi": {"id": credential, "name": credential}},
            },
            {
                "id": str(uuid.uuid4()),
                "name": "create_lead",
                "type": "n8n-nodes-base.httpRequestTool",
                "typeVersion": 4.2,
                "position": [380, 220],
                "parameters": {
                    "toolDescription": "Create a lead in the CRM.",
                    "method": "POST",
                    "url": crm + "/leads",
                    "sendBody": True,
                    "specifyBody": "json",
                    "jsonBody": "={{ JSON.stringify({ email: $fromAI('email', "
                    "'The lead email address', 'string') }) }}",
                    "options": {},
                },
            },
        ],
        "connections": {
            "Webhook": {"main": [[{"node": "AI Agent", "type": "main", "index": 0}]]},
            "OpenAI Chat Model": {
                "ai_languageModel": [[{"node": "AI Agent", "type": "ai_languageModel", "index": 0}]]
            },
            "create_lead": {"ai_tool": [[{"node": "AI Agent", "type": "ai_tool", "index": 0}]]},
        },
        "settings": {"executionOrder": "v1"},
        "pinData": {},
    }


@dataclass
class Stack:
    n8n: N8n
    sidecar: Sidecar
    llm: FakeLLM
    #: what the HTTP Request Tool posted to the CRM (one entry per tool execution)
    leads: Recorder

    def deliver(self, wid: str, path: str, key: str, email: str) -> dict[str, Any]:
        """Deliver the webhook once; returns n8n's execution row once it settled."""
        runs = len(self.n8n.executions(wid))
        self.n8n.webhook(path, {"key": key, "email": email}, timeout=180)
        rows = self.n8n.wait_settled(wid, runs + 1, timeout=120)
        assert len(rows) == runs + 1, rows
        return dict(rows[-1])

    def task(self, key: str) -> dict[str, Any]:
        r = requests.post(
            self.sidecar.base + "/v1/tasks",
            json={"task_key": key, "workflow": "leads"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert r.status_code == 200, r.text  # made by the gate
        r = requests.get(
            f"{self.sidecar.base}/v1/tasks/{r.json()['task']['task_id']}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        return dict(r.json())

    def of(self, email: str) -> list[dict[str, Any]]:
        """The leads posted for ``email``."""
        return self.leads.where("email", email)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, n8n: N8n) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("n8n-gate-writes")
    with ExitStack() as stack:
        leads = Recorder(_crm)
        crm = stack.enter_context(leads.serve())
        llm = stack.enter_context(serve_fake_llm())
        llm.mode, llm.fail_once = "write", True
        side = sidecar(
            work,
            "tokens:\n"
            "  - {name: n8n, env: LOOPSTOP_TOKEN_N8N, workflows: ['*']}\n"
            "model_gate:\n"
            f"  upstream_url: {llm.base}\n"
            "  timeout_s: 20\n"
            "tools:\n"
            "  create_lead:\n"
            "    kind: write\n"
            "    operation_id: 'crm-lead:{email}'\n"
            "    lease_s: 120\n"
            "    committed_when: 'id != null'\n",
            {"LOOPSTOP_TOKEN_N8N": TOKEN},
        ).start()
        stack.callback(side.stop)
        credentials = n8n.add_credentials(
            [
                {
                    "id": "lsGateWritesGate",
                    "name": "lsGateWritesGate",
                    "type": "openAiApi",
                    "data": {"apiKey": TOKEN, "url": side.base + "/v1/openai"},
                },
                {
                    "id": "lsGateWritesDirc",
                    "name": "lsGateWritesDirc",
                    "type": "openAiApi",
                    "data": {"apiKey": "sk-direct", "url": llm.base},
                },
            ]
        )
        n8n.add_workflows(
            [
                _flow(GATED, "gate-writes", "lsGateWritesGate", crm),
                _flow(DIRECT, "direct-writes", "lsGateWritesDirc", crm),
                _flow(RETRIED, "gate-writes-retry", "lsGateWritesGate", crm, retry=True),
            ],
            credentials,
            publish=(GATED, DIRECT, RETRIED),
        )
        yield Stack(n8n, side, llm, leads)


def _tool_outputs(req: dict[str, Any]) -> list[str]:
    return [i["output"] for i in req.get("input") or [] if i.get("type") == "function_call_output"]


def test_a_webhook_delivered_again_writes_the_lead_once(stack: Stack) -> None:
    email = "ana@example.com"
    before = len(stack.llm.requests)
    first = stack.deliver(GATED, "gate-writes", "lead-ana", email)
    assert first["status"] == "error"  # the upstream failed after the write
    assert len(stack.of(email)) == 1
    outputs = [o for r in stack.llm.requests[before:] for o in _tool_outputs(r)]
    print(f"\n[gate-writes] HTTP Request Tool output (201): {outputs}", file=sys.stderr)
    assert email in outputs[0] and "lead-" in outputs[0]
    second = stack.deliver(GATED, "gate-writes", "lead-ana", email)
    assert second["status"] == "success"
    assert len(stack.of(email)) == 1  # never written twice
    task = stack.task("lead-ana")
    assert task["envelope"] is None
    assert [e["decision"] for e in task["gate_exchanges"]] == ["replay"]


def test_without_the_gate_the_lead_is_written_twice(stack: Stack) -> None:
    email = "bo@example.com"
    assert stack.deliver(DIRECT, "direct-writes", "lead-bo", email)["status"] == "error"
    assert stack.deliver(DIRECT, "direct-writes", "lead-bo", email)["status"] == "success"
    assert len(stack.of(email)) == 2


def test_retry_on_fail_on_the_agent_writes_once(stack: Stack) -> None:
    email = "cy@example.com"
    run = stack.deliver(RETRIED, "gate-writes-retry", "lead-cy", email)
    assert run["status"] == "success"
    assert len(stack.of(email)) == 1


def test_the_same_write_twice_in_one_run_and_two_leads(stack: Stack) -> None:
    stack.llm.fail_once, stack.llm.writes = False, 2
    try:
        email = "di@example.com"
        assert stack.deliver(GATED, "gate-writes", "lead-di", email)["status"] == "success"
        assert len(stack.of(email)) == 1
    finally:
        stack.llm.fail_once, stack.llm.writes = True, 1
    stack.llm.fail_once = False
    try:
        for other in ("ed@example.com", "flo@example.com"):
            assert stack.deliver(GATED, "gate-writes", "lead-two", other)["status"] == "success"
        assert len(stack.of("ed@example.com")) == len(stack.of("flo@example.com")) == 1
    finally:
        stack.llm.fail_once = True


def test_what_the_http_request_tool_hands_the_model(stack: Stack) -> None:
    """The tool outputs n8n 2.41.1's HTTP Request Tool sends back (straight to the
    stand-in, no gate): the response body's items on success, n8n's error text
    on a refused request (printed for the docs)."""
    stack.llm.fail_once = False
    try:
        seen = {}
        refused = "refused-direct@example.com"
        for email in ("gil@example.com", refused):
            before = len(stack.llm.requests)
            stack.deliver(DIRECT, "direct-writes", f"shape-{email}", email)
            seen[email] = [o for r in stack.llm.requests[before:] for o in _tool_outputs(r)]
            print(f"\n[gate-writes] tool output for {email}: {seen[email]}", file=sys.stderr)
        assert json.loads(seen["gil@example.com"][0])[0]["email"] == "gil@example.com"
        assert seen[refused] and json.loads(seen[refused][0])[0].get("error")
    finally:
        stack.llm.fail_once = True


def test_an_error_output_is_never_written_again(stack: Stack) -> None:
    """The CRM refuses the lead (422): the tool output is n8n's error shape, which
    ``committed_when: id != null`` does not accept: the task ends
    needs_reconciliation and a second delivery writes nothing."""
    stack.llm.fail_once = False
    try:
        before = len(stack.llm.requests)
        run = stack.deliver(GATED, "gate-writes", "lead-refused", FAILING)
        outputs = [o for r in stack.llm.requests[before:] for o in _tool_outputs(r)]
        # the gate answered the next turn itself (the task ended): the upstream saw no output
        assert outputs == []
        assert run["status"] == "success"
        task = stack.task("lead-refused")
        assert (task["envelope"]["status"], task["envelope"]["reason"]) == (
            "needs_reconciliation",
            "unknown_commit",
        )
        stack.deliver(GATED, "gate-writes", "lead-refused", FAILING)
        assert len(stack.of(FAILING)) == 1
        r = requests.get(
            stack.sidecar.base + "/v1/operations",
            params={"state": "unknown", "workflow": "leads"},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert f"crm-lead:{FAILING}" in [o["operation_id"] for o in r.json()["items"]]
    finally:
        stack.llm.fail_once = True

"""The model gate under a real n8n 2.41.1, one stack per API the AI Agent speaks.

:data:`APIS` says what differs between OpenAI (the Responses API, and Chat
Completions in a variant), Anthropic, Azure OpenAI, Gemini and Ollama: the
shipped example (``workflows-examples/gate-only-agent*.json``), its chat
model node and credential, the gate's route and the upstream lines of
``loopstop.yaml``. :func:`gate_stack` builds one API's stack on the
session's n8n: the stand-in model (``workflows-examples/stand-in/model.py``,
which proposes the same tool call for ever) behind a sidecar of its own, the
recorder the agent's HTTP Request Tool posts to, the credentials and the
flows: the example as shipped but for its loopback addresses, id and webhook
path (the session's n8n holds other copies of it), a public Chat Trigger in
streaming mode instead of the webhook, and the variants the API's tests
drive (the credential straight at the stand-in; a gate with no upstream;
OpenAI's Create Task node, Chat Completions and budget policies). The rest
are the steps and checks every API's tests share: drive a flow once and
read what n8n recorded (its execution data) and what reached the upstream.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fake_llm import FakeLLM  # noqa: E402
from fake_llm import serve as serve_fake_llm  # noqa: E402
from served import Sidecar  # noqa: E402

from .n8n_runtime import N8n  # noqa: E402
from .shared import EXAMPLES, Recorder, own, rewrite, sidecar  # noqa: E402

TOKEN = "e2e-gate-token-0123456789"
UPSTREAM_KEY_ENV = "E2E_UPSTREAM_KEY"
MAX_SAME_CALL = 2
MAX_ITERATIONS = 10  # the AI Agent's default
MAX_MODEL_CALLS = 3
MAX_TOKENS = 15  # the stand-in reports 10 tokens a turn: the third turn is refused
MAX_COST = 10  # a turn reserves 5 and costs 3 (see the prices below): the third is refused
FINAL = "[loopstop] This task has ended: "
AZURE_API_VERSION = "2025-03-01-preview"
#: The Loop Stop API credential of OpenAI's Create Task variant.
LOOP_STOP = {"id": "lsGateLoopStop01", "name": "Loop Stop"}

#: The budget policies of the OpenAI stack; 1 unit per output token, at most 5 a
#: turn: a turn reserves 5 and costs 3.
OPENAI_CONFIG = (
    "policies:\n"
    "  model-budget:\n"
    f"    limits: {{max_model_calls: {MAX_MODEL_CALLS}, max_same_call: 50, max_idle: 50}}\n"
    "  token-budget:\n"
    f"    limits: {{max_tokens: {MAX_TOKENS}, max_same_call: 50, max_idle: 50}}\n"
    "  money-budget:\n"
    f"    limits: {{max_cost: {MAX_COST}, max_same_call: 50, max_idle: 50}}\n"
)
OPENAI_GATE = (
    "  max_output_tokens: 5\n"
    "  prices: {gpt-5-mini: {input_per_mtok: 0, output_per_mtok: 1000000},\n"
    "           gpt-4.1-mini: {input_per_mtok: 0, output_per_mtok: 1000000}}\n"
)


def node(wf: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in wf["nodes"] if n["name"] == name)


def variant(example: dict[str, Any], wid: str, path: str, system: str) -> dict[str, Any]:
    """The example with its own id, webhook path, node ids and System Message."""
    wf = json.loads(json.dumps(example))
    wf["id"], wf["name"] = wid, f"{example['name']} ({wid})"
    for n in wf["nodes"]:
        n["id"] = str(uuid.uuid4())
        if n.get("webhookId"):
            n["webhookId"] = str(uuid.uuid4())
    node(wf, "Webhook")["parameters"]["path"] = path
    node(wf, "AI Agent")["parameters"]["options"]["systemMessage"] = system
    return wf


def _system(example: dict[str, Any]) -> str:
    return str(node(example, "AI Agent")["parameters"]["options"]["systemMessage"])


@dataclass(frozen=True)
class GateApi:
    """One API through the gate: what its stack and flows differ in."""

    name: str
    #: the shipped example, under ``workflows-examples/``
    example: str
    model_node: str
    node_type: str
    credential_type: str
    #: the gate's route under the sidecar's base (the credential's URL)
    route: str
    #: the path n8n asks the stand-in for, unstreamed
    path: str
    #: the upstream key the sidecar holds (none: Ollama's needs none)
    upstream_key: str | None
    #: the Chat Trigger variant: its workflow id and webhook id
    chat: tuple[str, str]
    #: the credential's key in the variant straight at the stand-in
    direct_key: str = "direct-key"
    #: the variant straight at the stand-in: its workflow id and webhook path
    direct: tuple[str, str] | None = None
    #: the variant on a gate with no upstream: its workflow id and webhook path
    bare: tuple[str, str] | None = None
    #: the stand-in's ``api`` (the shape of its model list)
    fake_api: str = "openai"
    #: the stand-in's mode in the Chat Trigger test
    chat_mode: str = "tool_call"
    #: more top-level lines of loopstop.yaml, and more lines of its model_gate
    config: str = ""
    gate_config: str = ""
    #: more flows, made from the example: OpenAI's
    more: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None

    def data(self, url: str, key: str) -> dict[str, Any]:
        """The credential's data for a model at ``url`` with ``key``."""
        if self.credential_type == "azureOpenAiApi":
            return {
                "endpointType": "classic",
                "apiKey": key,
                "resourceName": "loopstop",
                "apiVersion": AZURE_API_VERSION,
                "endpoint": url,
            }
        if self.credential_type == "googlePalmApi":
            return {"host": url, "apiKey": key}
        if self.credential_type == "ollamaApi":
            return {"baseUrl": url, "apiKey": key}
        return {"apiKey": key, "url": url}

    def upstream(self, llm: FakeLLM) -> str:
        """The model_gate lines that put the stand-in behind the gate."""
        if self.name == "openai":
            return f"  upstream_url: {llm.base}\n  api_key_env: {UPSTREAM_KEY_ENV}\n"
        key = f", api_key_env: {UPSTREAM_KEY_ENV}" if self.upstream_key else ""
        return f"  upstreams: {{{self.name}: {{url: '{llm.root}'{key}}}}}\n"

    def stand_in(self, llm: FakeLLM) -> str:
        """The stand-in's address as the API's credential names it."""
        return llm.base if self.name == "openai" else llm.root


def _with_task_line(example: dict[str, Any]) -> dict[str, Any]:
    """A Create Task node before the agent and a ``loopstop-task`` line (no key line)."""
    wf = variant(
        example,
        "lsGateTaskLine01",
        "gate-task-line",
        "=loopstop-task: {{ $json.loopstop.task.task_id }}\nYou are a support agent. "
        "Use add_note to add one note to the ticket, then answer in one sentence.",
    )
    node(wf, "AI Agent")["parameters"]["text"] = "={{ $('Webhook').item.json.body.question }}"
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
            "credentials": {"loopStopApi": LOOP_STOP},
        }
    )
    wf["connections"]["Webhook"] = {"main": [[{"node": "Create Task", "type": "main", "index": 0}]]}
    wf["connections"]["Create Task"] = {
        "main": [[{"node": "AI Agent", "type": "main", "index": 0}]]
    }
    return wf


def _chat_completions(example: dict[str, Any]) -> dict[str, Any]:
    wf = variant(example, "lsGateNoResp0001", "gate-chat-completions", _system(example))
    node(wf, "OpenAI Chat Model")["parameters"]["responsesApiEnabled"] = False
    return wf


def _budgets(example: dict[str, Any]) -> dict[str, Any]:
    return variant(
        example,
        "lsGateBudget0001",
        "gate-budget",
        "=loopstop-task-key: budget-{{ $json.body.ticket }}\n"
        "loopstop-policy: {{ $json.body.policy }}\n"
        "loopstop-execution: {{ $execution.id }}\n"
        "You are a support agent. Use add_note to add one note to the ticket.",
    )


def _openai_more(example: dict[str, Any]) -> list[dict[str, Any]]:
    return [_with_task_line(example), _chat_completions(example), _budgets(example)]


APIS = {
    api.name: api
    for api in (
        GateApi(
            name="openai",
            example="gate-only-agent.json",
            model_node="OpenAI Chat Model",
            node_type="@n8n/n8n-nodes-langchain.lmChatOpenAi",
            credential_type="openAiApi",
            route="/v1/openai",
            path="/v1/responses",
            upstream_key="sk-upstream-fake",
            chat=("lsGateChat000001", "5c0b7e0e-6a57-4f7e-9d1e-3c1f2a9b8d01"),
            config=OPENAI_CONFIG,
            gate_config=OPENAI_GATE,
            more=_openai_more,
        ),
        GateApi(
            name="anthropic",
            example="gate-only-agent-anthropic.json",
            model_node="Anthropic Chat Model",
            node_type="@n8n/n8n-nodes-langchain.lmChatAnthropic",
            credential_type="anthropicApi",
            route="/v1/anthropic",
            path="/v1/messages",
            upstream_key="sk-ant-upstream-fake",
            chat=("lsGateAnthChat01", "3e9d7a52-1c4b-4f0e-8a6d-5b2c9e1f7a03"),
            direct=("lsGateAnthDirec1", "gate-anthropic-direct"),
            chat_mode="text_then_tool",
        ),
        GateApi(
            name="azure",
            example="gate-only-agent-azure.json",
            model_node="Azure OpenAI Chat Model",
            node_type="@n8n/n8n-nodes-langchain.lmChatAzureOpenAi",
            credential_type="azureOpenAiApi",
            route="/v1/azure",
            path="/openai/deployments/{model}/chat/completions?api-version=" + AZURE_API_VERSION,
            upstream_key="azure-upstream-fake",
            chat=("lsGateAzureChat1", "7a4c2e1b-9d3f-4b6a-8c5e-2f1d0b9a8e71"),
            direct=("lsGateAzureDir01", "gate-azure-direct"),
            bare=("lsGateAzureBare1", "gate-azure-bare"),
        ),
        GateApi(
            name="gemini",
            example="gate-only-agent-gemini.json",
            model_node="Google Gemini Chat Model",
            node_type="@n8n/n8n-nodes-langchain.lmChatGoogleGemini",
            credential_type="googlePalmApi",
            route="/v1/gemini",
            path="/v1beta/models/gemini-3-flash-preview:generateContent",
            upstream_key="gemini-upstream-fake-key",
            chat=("lsGateGemChat001", "9b1f4c7e-2d8a-4e3b-a6c5-0f7e3d2b1a04"),
            direct=("lsGeminiDirect01", "gemini-direct"),
            fake_api="gemini",
        ),
        GateApi(
            name="ollama",
            example="gate-only-agent-ollama.json",
            model_node="Ollama Chat Model",
            node_type="@n8n/n8n-nodes-langchain.lmChatOllama",
            credential_type="ollamaApi",
            route="/v1/ollama",
            path="/api/chat",
            upstream_key=None,
            chat=("lsGateOllamaChat", "0d2f8c43-3b8e-4a55-8d8e-7c1b6f0e9a21"),
            direct=("lsGateOllamaDir1", "gate-ollama-direct"),
            direct_key="",
        ),
    )
}


def _chat_trigger(example: dict[str, Any], api: GateApi) -> dict[str, Any]:
    """A public Chat Trigger (latest typeVersion) in streaming mode instead of the webhook."""
    wid, webhook_id = api.chat
    wf = variant(
        example,
        wid,
        "unused",
        "=loopstop-task-key: chat-{{ $json.sessionId }}\nYou are a support agent. "
        "Use add_note to add one note to the ticket, then answer in one sentence.",
    )
    node(wf, "Webhook").update(
        name="Chat",
        type="@n8n/n8n-nodes-langchain.chatTrigger",
        typeVersion=1.5,
        parameters={"public": True, "mode": "webhook", "options": {"responseMode": "streaming"}},
        webhookId=webhook_id,
    )
    node(wf, "AI Agent")["parameters"]["text"] = "={{ $json.chatInput }}"
    node(wf, "add_note")["parameters"]["jsonBody"] = (
        "={{ JSON.stringify({ ticket: 'chat-' + $('Chat').item.json.sessionId, "
        "note: $fromAI('note', 'The note to add to the ticket', 'string') }) }}"
    )
    wf["connections"]["Chat"] = wf["connections"].pop("Webhook")
    return wf


def _on_credential(
    example: dict[str, Any], api: GateApi, wid: str, path: str, cred: dict[str, str]
) -> dict[str, Any]:
    """The example under ``wid`` and ``path`` with its model on another credential."""
    wf = variant(example, wid, path, _system(example))
    node(wf, api.model_node)["credentials"] = {api.credential_type: cred}
    return wf


@dataclass
class Driven:
    """One run of a flow: n8n's execution row and run data, and what reached the upstream."""

    execution: dict[str, Any]
    run: Any
    upstream: list[dict[str, Any]]
    paths: list[str]


@dataclass
class Gate:
    """One API's stack on the session's n8n."""

    api: GateApi
    n8n: N8n
    sidecar: Sidecar
    llm: FakeLLM
    recorder: Recorder
    #: every flow as added, by id
    flows: dict[str, dict[str, Any]]
    #: n8n's credential id by the id the flows were written with
    credentials: dict[str, str]
    #: the shipped example's id and webhook path in this n8n
    shipped: str
    shipped_path: str

    @property
    def gate_credential(self) -> dict[str, str]:
        """The shipped example's credential (on the gate), as the flows name it."""
        ref = node(self.flows[self.shipped], self.api.model_node)["credentials"]
        return dict(ref[self.api.credential_type])

    def for_ticket(self, ticket: str) -> list[dict[str, Any]]:
        """What the agent's tool posted for ``ticket``."""
        return self.recorder.where("ticket", ticket)

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

    def task(self, task_id: str) -> requests.Response:
        return requests.get(
            f"{self.sidecar.base}/v1/tasks/{task_id}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )

    def drive(self, wid: str, send: Callable[[], None]) -> Driven:
        """Run one flow once (``send`` triggers it); waits until n8n settled it."""
        before = len(self.llm.requests)
        runs = len(self.n8n.executions(wid))
        send()
        rows = self.n8n.wait_settled(wid, runs + 1, timeout=120)
        assert len(rows) == runs + 1, rows
        return Driven(
            rows[-1],
            self.n8n.run_data(rows[-1]["id"]),
            self.llm.requests[before:],
            self.llm.paths[before:],
        )

    def webhook(self, path: str, body: dict[str, Any], status: int | None = 200) -> Any:
        """A send to a production webhook; checks n8n's status when ``status`` is given
        (500: the flow failed). The answer is kept on the send (``send.answer``)."""

        def send() -> None:
            r = self.n8n.webhook(path, body, timeout=180)
            if status is not None:
                assert r.status_code == status, r.text
            send.answer = r  # type: ignore[attr-defined]

        return send

    def chat(self, session: str, chunks: list[dict[str, Any]]) -> Callable[[], None]:
        """A send to the Chat Trigger (streamed); its lines are put in ``chunks``."""
        url = f"{self.n8n.base}/webhook/{self.api.chat[1]}/chat"

        def send() -> None:
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

        return send

    def test_credential(self, data: dict[str, Any]) -> dict[str, Any]:
        """n8n's own test of the gate credential with ``data`` (its Test button)."""
        cred = self.gate_credential
        body = {
            "credentials": {
                "id": self.credentials[cred["id"]],
                "name": cred["name"],
                "type": self.api.credential_type,
                "data": data,
            }
        }
        session = self.n8n.owner_session()
        r = session.post(self.n8n.base + "/rest/credentials/test", json=body, timeout=30)
        assert r.status_code == 200, r.text
        return dict(r.json()["data"])


def runs(run: Any, name: str) -> list[Any]:
    """The runs of one node in an execution's run data."""
    return list(run["resultData"]["runData"].get(name) or [])


def agent_output(run: Any) -> str:
    return str(runs(run, "AI Agent")[-1]["data"]["main"][0][0]["json"]["output"])


def chat_text(chunks: list[dict[str, Any]]) -> str:
    """What the chat client was streamed."""
    return "".join(str(c.get("content") or "") for c in chunks if c.get("type") == "item")


def assert_same_call(gate: Gate, d: Driven, ticket: str, task: dict[str, Any]) -> None:
    """Ended by the gate after MAX_SAME_CALL tool executions, with a final text answer."""
    assert d.execution["status"] == "success"
    assert len(gate.for_ticket(ticket)) == MAX_SAME_CALL
    assert len(runs(d.run, "add_note")) == MAX_SAME_CALL  # n8n's own count
    assert agent_output(d.run).startswith(FINAL + "partial (same_call)")
    # the model proposed the call once more; the gate answered the final message instead
    assert len(d.upstream) == MAX_SAME_CALL + 1
    envelope = task["envelope"]
    assert (envelope["status"], envelope["reason"]) == ("partial", "same_call")
    assert task["task"]["used"]["tool_calls"] == MAX_SAME_CALL


@contextmanager
def gate_stack(api: GateApi, n8n: N8n, work: Path, bare: str) -> Iterator[Gate]:
    """The stack of ``api`` on the running ``n8n``; ``bare`` is the base of a gate
    with no upstream (for ``api.bare``)."""
    started = time.monotonic()
    with ExitStack() as stack:
        recorder = Recorder()
        recorder_base = stack.enter_context(recorder.serve())
        llm = stack.enter_context(serve_fake_llm(api=api.fake_api))
        config = (
            "tokens:\n"
            "  - {name: n8n, env: LOOPSTOP_TOKEN_N8N, workflows: ['*']}\n"
            f"limits: {{max_same_call: {MAX_SAME_CALL}}}\n"
            f"{api.config}"
            "model_gate:\n"
            f"{api.upstream(llm)}"
            "  timeout_s: 20\n"
            f"{api.gate_config}"
        )
        env = {"LOOPSTOP_TOKEN_N8N": TOKEN}
        if api.upstream_key:
            env[UPSTREAM_KEY_ENV] = api.upstream_key
        gate = sidecar(work, config, env).start()
        stack.callback(gate.stop)

        text = rewrite((EXAMPLES / api.example).read_text(), sidecar=gate.base)
        example = json.loads(rewrite(text, recorder=recorder_base))
        (shipped,) = own([example], "gate")
        cred = node(example, api.model_node)["credentials"][api.credential_type]
        credentials = [
            {**cred, "type": api.credential_type, "data": api.data(gate.base + api.route, TOKEN)},
            {**LOOP_STOP, "type": "loopStopApi", "data": {"baseUrl": gate.base, "token": TOKEN}},
        ]
        flows = [shipped, _chat_trigger(example, api)]
        if api.direct:
            direct = {"id": f"{api.name}-direct", "name": f"{api.name}, no gate"}
            data = api.data(api.stand_in(llm), api.direct_key)
            credentials.append({**direct, "type": api.credential_type, "data": data})
            flows.append(_on_credential(example, api, *api.direct, direct))
        if api.bare:
            # its Endpoint ends in a slash: n8n sends ``//openai``
            no_upstream = {"id": f"{api.name}-bare", "name": f"Gate without {api.name}"}
            data = api.data(bare + api.route + "/", TOKEN)
            credentials.append({**no_upstream, "type": api.credential_type, "data": data})
            flows.append(_on_credential(example, api, *api.bare, no_upstream))
        if api.more:
            flows.extend(api.more(example))
        ids = n8n.add_credentials(credentials)
        n8n.add_workflows(flows, ids, publish=tuple(wf["id"] for wf in flows))
        path = node(shipped, "Webhook")["parameters"]["path"]
        print(
            f"\n[n8n-gate {api.name}] stack ready in {time.monotonic() - started:.1f} s",
            file=sys.stderr,
        )
        yield Gate(
            api,
            n8n,
            gate,
            llm,
            recorder,
            {wf["id"]: wf for wf in flows},
            ids,
            shipped["id"],
            path,
        )

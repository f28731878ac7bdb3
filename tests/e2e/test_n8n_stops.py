"""End to end with a real n8n 2.41.1: a loopstop stop cancels the executions in n8n.

The session's n8n (``conftest.py``) with its public API on and an API key
this module creates (scopes ``execution:list``, ``execution:read``,
``execution:stop``), one sidecar (``loopstop serve``) configured with that
key, and a local recorder standing for the side effect. The workflow checks
its trigger with the Loop Stop node, then waits in a Wait node (a short
wait stays ``running`` in n8n, one past 65 s is parked as ``waiting``), then
posts to the recorder: a cancelled execution must never reach that step.
A third workflow is the shipped gate-only agent (its OpenAI Chat Model on
loopstop's model gate, the fake upstream of ``tests/fake_llm.py`` behind it)
whose tool is held by the recorder mid-task, then a step after the agent.
Marked ``n8n``: ``-m "not n8n"`` skips it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Collection, Iterator
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

from . import shared  # noqa: E402
from .gate_harness import node, variant  # noqa: E402
from .n8n_runtime import N8n  # noqa: E402
from .shared import EXAMPLES, rewrite, sidecar, sidecar_credentials  # noqa: E402

pytestmark = pytest.mark.n8n

TOKEN = "e2e-stops-n8n-token-0123456789"
ADMIN = "e2e-stops-admin-token-0123456789"
WORKFLOW = "lsStopWait000001"
TASK_WORKFLOW = "lsStopTask000001"
AGENT_WORKFLOW = "lsStopAgent00001"
CONFIRM_S = 20
SHORT_WAIT_S = 12  # kept in memory by n8n: "running"
LONG_WAIT_S = 90  # parked in the database: "waiting"


class Recorder(shared.Recorder):
    """What reached the step after the Wait node (or after the agent), and the agent's
    tool calls (``/notes``), each held until ``release`` is set (a slow API the agent
    waits on)."""

    def __init__(self) -> None:
        super().__init__(self._held)
        self.release = threading.Event()

    def _held(self, path: str, body: dict[str, Any], n: int) -> tuple[int, Any]:
        if path.startswith("/notes"):
            self.release.wait(60)
            return 201, {"saved": True}
        return 200, {"ok": True}

    @property
    def seen(self) -> list[dict[str, Any]]:
        with self.lock:
            return [body for path, body in self.posts if not path.startswith("/notes")]

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.bodies("/notes")


def _agent_workflow(recorder: str, sidecar: str) -> dict[str, Any]:
    """The shipped gate-only agent, answering its webhook at once, telling the gate its
    workflow and execution id (a task stop reaches only executions of the task's
    workflow), and posting to the recorder after the agent."""
    text = (EXAMPLES / "gate-only-agent.json").read_text()
    example = json.loads(rewrite(text, sidecar=sidecar, recorder=recorder))
    wf = variant(
        example,
        AGENT_WORKFLOW,
        "loopstop-stop-agent",
        "=loopstop-task-key: stop-agent-{{ $json.body.run }}\n"
        "loopstop-workflow: {{ $workflow.id }}\n"
        "loopstop-execution: {{ $execution.id }}\n"
        "You are a support agent. Use add_note to add one note to the ticket.",
    )
    node(wf, "Webhook")["parameters"]["responseMode"] = "onReceived"
    wf["nodes"].append(
        {
            "id": str(uuid.uuid4()),
            "name": "Side effect",
            "type": "n8n-nodes-base.httpRequest",
            "typeVersion": 4.5,
            "position": [660, 0],
            "parameters": {
                "method": "POST",
                "url": recorder + "/after",
                "sendBody": True,
                "specifyBody": "json",
                "jsonBody": "={{ JSON.stringify({ agent: $json.output }) }}",
                "options": {},
            },
        }
    )
    wf["connections"]["AI Agent"] = {
        "main": [[{"node": "Side effect", "type": "main", "index": 0}]]
    }
    return wf


def _workflow(recorder: str, task: bool = False) -> dict[str, Any]:
    """The Wait workflow; ``task``: its guard step creates a task instead of checking
    the trigger (the executions then act for that task)."""

    def node(name: str, type_: str, version: float, params: dict[str, Any], x: int) -> Any:
        return {
            "id": str(uuid.uuid4()),
            "name": name,
            "type": type_,
            "typeVersion": version,
            "position": [x, 0],
            "parameters": params,
        }

    webhook = node(
        "Webhook",
        "n8n-nodes-base.webhook",
        2.1,
        {
            "httpMethod": "POST",
            "path": "loopstop-stop-task" if task else "loopstop-stop-wait",
            "options": {},
        },
        0,
    )
    webhook["webhookId"] = str(uuid.uuid4())
    check = node(
        "Check Trigger",
        "n8n-nodes-loopstop.loopStop",
        1,
        {
            "resource": "activation",
            "operation": "checkTrigger",
            "eventKey": "={{ 'wait:' + $json.body.run }}",
            "additionalFields": {"trigger": "Webhook"},
        },
        220,
    )
    if task:
        check["name"] = "Create Task"
        check["parameters"] = {
            "resource": "task",
            "operation": "create",
            "taskKey": "={{ 'task:' + $json.body.run }}",
        }
    check["credentials"] = {"loopStopApi": {"id": "lsStopLoopCred01", "name": "Loop Stop"}}
    wait = node(
        "Wait",
        "n8n-nodes-base.wait",
        1.1,
        {
            "resume": "timeInterval",
            "amount": "={{ $('Webhook').item.json.body.wait_s }}",
            "unit": "seconds",
        },
        440,
    )
    after = node(
        "Side effect",
        "n8n-nodes-base.httpRequest",
        4.5,
        {
            "method": "POST",
            "url": recorder + "/after",
            "sendBody": True,
            "specifyBody": "json",
            "jsonBody": "={{ JSON.stringify({ run: $('Webhook').item.json.body.run }) }}",
            "options": {},
        },
        660,
    )
    dropped = node("Dropped", "n8n-nodes-base.noOp", 1, {}, 440)

    def to(target: str) -> list[dict[str, Any]]:
        return [{"node": target, "type": "main", "index": 0}]

    guard = check["name"]
    return {
        "id": TASK_WORKFLOW if task else WORKFLOW,
        "name": "Loop Stop e2e: " + ("a task's" if task else "") + " executions parked in a Wait",
        "active": False,
        "nodes": [webhook, check, wait, after] + ([] if task else [dropped]),
        "connections": {
            "Webhook": {"main": [to(guard)]},
            guard: {"main": [to("Wait")] if task else [to("Wait"), to("Dropped")]},
            "Wait": {"main": [to("Side effect")]},
        },
        "settings": {"executionOrder": "v1"},
        "pinData": {},
        "tags": [],
    }


@dataclass
class Stack:
    n8n: N8n
    sidecar: Sidecar
    recorder: Recorder
    llm: FakeLLM

    def admin(self, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        if body is None:
            r = requests.get(self.sidecar.base + path, headers=headers, timeout=60)
        else:
            r = requests.post(self.sidecar.base + path, json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    def fire(self, run: str, wait_s: int) -> None:
        r = self.n8n.webhook("loopstop-stop-wait", {"run": run, "wait_s": wait_s})
        assert r.status_code == 200, r.text

    def statuses(self, workflow: str = WORKFLOW) -> dict[str, str]:
        return {str(x["id"]): x["status"] for x in self.n8n.executions(workflow)}

    def wait_for(
        self,
        count: int,
        timeout: float = 60,
        workflow: str = WORKFLOW,
        since: Collection[str] = (),
    ) -> dict[str, str]:
        """Until ``count`` executions are parked (running in the Wait, or waiting),
        leaving out those whose ids are in ``since`` (the ones before a test)."""
        deadline = time.monotonic() + timeout
        while True:
            parked = {
                k: v
                for k, v in self.statuses(workflow).items()
                if v in ("running", "waiting") and k not in since
            }
            if len(parked) >= count or time.monotonic() > deadline:
                return parked
            time.sleep(0.25)

    def answer_of(self, execution_id: str, node: str) -> dict[str, Any]:
        """The Loop Stop answer a node of the execution got (from n8n's stored run data)."""
        deadline = time.monotonic() + 30
        while True:
            run = self.n8n.run_data(execution_id)
            runs = (run or {}).get("resultData", {}).get("runData", {}).get(node)
            if runs:
                return dict(runs[0]["data"]["main"][0][0]["json"]["loopstop"])
            assert time.monotonic() < deadline, f"no run data for execution {execution_id}"
            time.sleep(0.25)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, n8n: N8n) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("n8n-stops")
    started = time.monotonic()
    with ExitStack() as stack:
        rec = Recorder()
        stack.callback(rec.release.set)  # let held tool calls go before the server stops
        recorder = stack.enter_context(rec.serve())
        llm = stack.enter_context(serve_fake_llm())
        side = sidecar(
            work,
            "tokens:\n"
            "  - {name: n8n, env: LOOPSTOP_TOKEN_N8N, workflows: ['*']}\n"
            "  - {name: operator, env: LOOPSTOP_TOKEN_ADMIN, workflows: ['*'], admin: true}\n"
            "chains:\n  default: {rate_limit: 1000}\n"
            f"n8n: {{api_url: '{n8n.base}/api/v1', api_key_env: E2E_N8N_API_KEY,"
            f" timeout_s: 5, confirm_s: {CONFIRM_S}}}\n"
            f"model_gate: {{upstream_url: '{llm.base}', api_key_env: E2E_UPSTREAM_KEY}}\n",
            {
                "LOOPSTOP_TOKEN_N8N": TOKEN,
                "LOOPSTOP_TOKEN_ADMIN": ADMIN,
                "E2E_UPSTREAM_KEY": "sk-upstream-fake",
                # a key of the owner's for n8n's public API; the sidecar starts with it
                "E2E_N8N_API_KEY": n8n.create_api_key(),
            },
        )
        credentials = n8n.add_credentials(
            sidecar_credentials(side.base, TOKEN, loop_stop="lsStopLoopCred01")
        )
        flows = [
            _workflow(recorder),
            _workflow(recorder, task=True),
            _agent_workflow(recorder, side.base),
        ]
        n8n.add_workflows(flows, credentials, publish=(WORKFLOW, TASK_WORKFLOW, AGENT_WORKFLOW))
        side.start()
        stack.callback(side.stop)
        print(
            f"\n[n8n-e2e] stops stack ready in {time.monotonic() - started:.0f} s", file=sys.stderr
        )
        yield Stack(n8n, side, rec, llm)


def _by_id(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["execution_id"]: e for e in answer["cancellation"]["executions"]}


def test_readyz_sees_n8n_api(stack: Stack) -> None:
    ready = requests.get(stack.sidecar.base + "/readyz", timeout=10).json()
    assert ready["n8n"] == {"configured": True, "reachable": True}


def test_a_workflow_stop_cancels_every_parked_execution(stack: Stack) -> None:
    before = set(stack.statuses())
    for i, wait_s in enumerate((SHORT_WAIT_S, SHORT_WAIT_S, LONG_WAIT_S, LONG_WAIT_S)):
        stack.fire(f"wf-{i}", wait_s)
    parked = stack.wait_for(4, since=before)
    assert len(parked) == 4, stack.statuses()
    # Long waits are parked in the database (waiting), short ones stay in memory (running).
    deadline = time.monotonic() + 20
    while sorted(stack.statuses()[k] for k in parked) != ["running"] * 2 + ["waiting"] * 2:
        assert time.monotonic() < deadline, stack.statuses()
        time.sleep(0.25)
    asked = time.monotonic()
    out = stack.admin(f"/v1/workflows/{WORKFLOW}/stop", {"reason": "e2e runaway"})
    took = time.monotonic() - asked
    print(f"\n[n8n-e2e] workflow stop of 4 executions answered in {took:.2f} s", file=sys.stderr)
    assert out["stopped"]["reason"] == "e2e runaway"
    assert out["cancellation"]["state"] == "confirmed", out
    got = _by_id(out)
    assert set(got) == set(parked)
    assert sorted(e["status_before"] for e in got.values()) == ["running"] * 2 + ["waiting"] * 2
    for entry in got.values():
        assert entry["status_after"] == "canceled" and entry["confirmed"] is True, entry
    assert out["cancellation"]["elapsed_s"] < CONFIRM_S
    assert {stack.statuses()[k] for k in parked} == {"canceled"}
    # Past the short waits: the step after the Wait never ran, nothing resumed.
    time.sleep(SHORT_WAIT_S + 5)
    assert stack.recorder.seen == []
    assert {stack.statuses()[k] for k in parked} == {"canceled"}
    # The GET answers what was confirmed; the loopstop stop still holds for new runs.
    assert stack.admin(f"/v1/workflows/{WORKFLOW}")["cancellation"] == out["cancellation"]
    count = len(stack.statuses())
    stack.fire("wf-late", SHORT_WAIT_S)
    stack.n8n.wait_settled(WORKFLOW, count + 1)
    late = max(stack.statuses(), key=int)
    assert stack.statuses()[late] == "success"  # dropped by the Check Trigger: no wait, no effect
    time.sleep(1)
    assert stack.recorder.seen == []
    stack.admin(f"/v1/workflows/{WORKFLOW}/resume", {"reason": "e2e done"})


def test_a_chain_stop_cancels_only_that_chains_executions(stack: Stack) -> None:
    before = set(stack.statuses())
    stack.fire("chain-a", LONG_WAIT_S)
    stack.fire("chain-b", LONG_WAIT_S)
    parked = stack.wait_for(2, since=before)
    assert len(parked) == 2, stack.statuses()
    chains = {eid: str(stack.answer_of(eid, "Check Trigger")["chain_id"]) for eid in parked}
    (a_exec, a_chain), (b_exec, b_chain) = sorted(chains.items(), key=lambda kv: int(kv[0]))
    assert a_chain != b_chain
    seen = stack.admin(f"/v1/chains/{a_chain}")["chain"]["executions"]
    assert [e["execution_id"] for e in seen] == [a_exec]

    out = stack.admin(f"/v1/chains/{a_chain}/stop", {"reason": "e2e chain"})
    assert out["cancellation"]["state"] == "confirmed", out
    assert _by_id(out) == {
        a_exec: {
            "execution_id": a_exec,
            "status_before": "waiting",
            "status_after": "canceled",
            "confirmed": True,
            "result": "stopped",
            "error": None,
        }
    }
    assert stack.statuses()[a_exec] == "canceled"
    time.sleep(2)
    assert stack.statuses()[b_exec] == "waiting"  # the other chain keeps waiting
    # Repeated: idempotent, and it looks again.
    again = stack.admin(f"/v1/chains/{a_chain}/stop", {"reason": "e2e chain again"})
    assert _by_id(again)[a_exec]["result"] == "already_finished"
    assert again["chain"]["stopped"] == out["chain"]["stopped"]
    # Clean up the other chain the same way.
    other = stack.admin(f"/v1/chains/{b_chain}/stop", {"reason": "e2e cleanup"})
    assert _by_id(other)[b_exec]["confirmed"] is True
    assert stack.recorder.seen == []


def test_a_refused_key_says_cancellation_failed_and_the_stop_holds(stack: Stack) -> None:
    """The same n8n with a key it does not know: loopstop's stop holds, the answer says why."""
    work = stack.sidecar.cwd
    config = work / "wrong-key.yaml"
    config.write_text(
        (work / "loopstop.yaml").read_text().replace("E2E_N8N_API_KEY", "E2E_WRONG_KEY")
    )
    other = Sidecar(
        work,
        {
            **stack.sidecar.env,
            "LOOPSTOP_CONFIG": str(config),
            "LOOPSTOP_STORE": f"sqlite:///{work / 'wrong-key.db'}",
            "E2E_WRONG_KEY": "not-a-key-of-this-n8n",
        },
        workers=1,
    ).start()
    try:
        r = requests.post(
            other.base + f"/v1/workflows/{WORKFLOW}/stop",
            json={"reason": "e2e wrong key"},
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=60,
        )
        out = r.json()
        assert r.status_code == 200 and out["stopped"] is not None, out
        assert out["cancellation"]["state"] == "failed"
        assert out["cancellation"]["error"].startswith("key_refused")
        ready = requests.get(other.base + "/readyz", timeout=10).json()
        assert ready["status"] == "ready" and ready["n8n"]["reachable"] is False
    finally:
        other.stop()


def test_a_task_stop_cancels_the_executions_of_that_task(stack: Stack) -> None:
    """Two executions act for one task (the same task key), a third for another task;
    the task stop cancels the first two only."""
    for run in ("t-1", "t-1", "t-2"):
        r = stack.n8n.webhook("loopstop-stop-task", {"run": run, "wait_s": LONG_WAIT_S})
        assert r.status_code == 200, r.text
    parked = stack.wait_for(3, workflow=TASK_WORKFLOW)
    assert len(parked) == 3, stack.statuses(TASK_WORKFLOW)
    tasks = {eid: str(stack.answer_of(eid, "Create Task")["task"]["task_id"]) for eid in parked}
    ordered = sorted(tasks, key=int)
    first = tasks[ordered[0]]
    mine = [eid for eid in ordered if tasks[eid] == first]
    theirs = [eid for eid in ordered if tasks[eid] != first]
    assert len(mine) == 2 and len(theirs) == 1, tasks

    out = stack.admin(f"/v1/tasks/{first}/stop", {"reason": "e2e task"})
    assert (out["envelope"]["status"], out["envelope"]["reason"]) == ("stopped", "operator_stop")
    assert out["cancellation"]["state"] == "confirmed", out
    got = _by_id(out)
    assert set(got) == set(mine)
    assert all(e["status_after"] == "canceled" and e["confirmed"] for e in got.values()), got
    assert {stack.statuses(TASK_WORKFLOW)[e] for e in mine} == {"canceled"}
    time.sleep(2)
    assert stack.statuses(TASK_WORKFLOW)[theirs[0]] == "waiting"
    assert stack.admin(f"/v1/tasks/{first}")["cancellation"] == out["cancellation"]
    cleanup = stack.admin(f"/v1/tasks/{tasks[theirs[0]]}/stop", {"reason": "e2e cleanup"})
    assert _by_id(cleanup)[theirs[0]]["confirmed"] is True
    assert stack.recorder.seen == []


def test_a_task_stop_cancels_a_running_agent(stack: Stack) -> None:
    """The agent's first tool call is held (a slow API): the execution is running, mid-task,
    its id known to the gate from the ``loopstop-execution`` line. A task stop cancels it in
    n8n, confirmed; no model turn reaches the upstream afterwards and the step after the
    agent never runs, even once the held tool call answers."""
    stack.llm.mode = "tool_call"
    run = "agent-1"
    r = stack.n8n.webhook("loopstop-stop-agent", {"run": run, "ticket": run, "question": "Go."})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60
    while not stack.recorder.tools:
        assert time.monotonic() < deadline, stack.statuses(AGENT_WORKFLOW)
        time.sleep(0.25)
    running_now = stack.wait_for(1, workflow=AGENT_WORKFLOW)
    assert list(running_now.values()) == ["running"], running_now
    (execution,) = running_now
    r = requests.post(
        stack.sidecar.base + "/v1/tasks",
        json={"task_key": f"stop-agent-{run}", "workflow": AGENT_WORKFLOW},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text  # the gate made it on the first model turn
    task_id = r.json()["task"]["task_id"]
    known = stack.admin(f"/v1/tasks/{task_id}")["executions"]
    assert [e["execution_id"] for e in known] == [execution]
    turns = len(stack.llm.requests)

    out = stack.admin(f"/v1/tasks/{task_id}/stop", {"reason": "e2e agent"})
    assert (out["envelope"]["status"], out["envelope"]["reason"]) == ("stopped", "operator_stop")
    assert out["cancellation"]["state"] == "confirmed", out
    assert _by_id(out) == {
        execution: {
            "execution_id": execution,
            "status_before": "running",
            "status_after": "canceled",
            "confirmed": True,
            "result": "stopped",
            "error": None,
        }
    }
    stack.recorder.release.set()  # the slow API answers now; nobody may act on it
    time.sleep(5)
    assert stack.statuses(AGENT_WORKFLOW)[execution] == "canceled"
    assert len(stack.llm.requests) == turns  # no model turn after the stop
    assert len(stack.recorder.tools) == 1
    assert stack.recorder.seen == []  # the step after the agent never ran

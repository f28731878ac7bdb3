"""End to end with a real n8n: the example workflows against a real sidecar.

The session's n8n 2.41.1 (``conftest.py``), one sidecar (``loopstop serve``
on SQLite), a small system of record and a fake OpenAI-compatible model are
started for the module; the examples in ``workflows-examples/`` are added as
shipped but for their loopback addresses and their ids and webhook paths,
which end in ``-e2e`` (the session's n8n holds other copies of some), and
driven through their production webhooks. Marked ``n8n``: ``-m "not n8n"``
skips it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "workflows-examples" / "stand-in"))

from fake_llm import FakeLLM  # noqa: E402
from fake_llm import serve as serve_fake_llm  # noqa: E402
from records import Records, serving  # noqa: E402
from served import Sidecar  # noqa: E402

from .n8n_runtime import N8n  # noqa: E402
from .shared import EXAMPLES, own, rewrite, sidecar, sidecar_credentials  # noqa: E402

pytestmark = pytest.mark.n8n

TOKEN = "e2e-n8n-token-0123456789"
MAX_DEPTH = 3
MAX_SAME_CALL = 2
AGENT_MAX_ITERATIONS = 10
#: The example task's model budget (guarded-tools-agent.json, Create Task's limits).
AGENT_MAX_MODEL_CALLS = 8
#: What this module's workflow ids and webhook paths end in.
TAG = "e2e"


def mine(name: str) -> str:
    """A shipped workflow id or webhook path as this module's copy has it."""
    return f"{name}-{TAG}"


@dataclass
class Stack:
    n8n: N8n
    sidecar: Sidecar
    records: Records
    llm: FakeLLM
    #: n8n's credential id by the id the examples name
    credentials: dict[str, str]

    def sidecar_get(self, path: str) -> Any:
        r = requests.get(
            self.sidecar.base + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
        )
        r.raise_for_status()
        return r.json()


def _direct_agent(agent: dict[str, Any]) -> dict[str, Any]:
    """The agent example with its model credential pointing at the model itself."""
    wf = json.loads(json.dumps(agent))
    wf["id"] = "lsExAgentDirect1"
    wf["name"] += " (model called directly)"
    for node in wf["nodes"]:
        node["id"] = str(uuid.uuid4())
        if node["type"] == "n8n-nodes-base.webhook":
            node["parameters"]["path"] = "loopstop-agent-direct"
            node["webhookId"] = str(uuid.uuid4())
        if "openAiApi" in node.get("credentials", {}):
            node["credentials"]["openAiApi"] = {"id": "lsExDirectModel1", "name": "Model, no gate"}
    return wf


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, n8n: N8n) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("n8n-e2e")
    started = time.monotonic()
    with ExitStack() as stack:
        records = Records()
        records_base = stack.enter_context(serving(records))
        llm = stack.enter_context(serve_fake_llm())

        # The examples' own configuration, with the loopback addresses rewritten
        # and the upstream model pointed at the fake one.
        config = (EXAMPLES / "loopstop.yaml").read_text()
        side = sidecar(
            work,
            rewrite(config, recorder=records_base, model=llm.base),
            {"LOOPSTOP_TOKEN_N8N": TOKEN},
        ).start()
        stack.callback(side.stop)

        credentials = n8n.add_credentials(
            [
                *sidecar_credentials(side.base, TOKEN, loop_stop="lsExLoopStopCred"),
                {
                    "id": "lsExDirectModel1",
                    "name": "Model, no gate",
                    "type": "openAiApi",
                    "data": {"apiKey": "sk-upstream-fake", "url": llm.base},
                },
            ]
        )
        flows = []
        for example in sorted(EXAMPLES.glob("*.json")):
            text = rewrite(
                example.read_text(), n8n=n8n.base, sidecar=side.base, recorder=records_base
            )
            flows.append(json.loads(text))
            if example.name == "guarded-tools-agent.json":
                flows.append(_direct_agent(flows[-1]))
        published = (  # the agent's tool workflow before the agents that call it
            "lsExAgentTool001",
            "lsExSelfCall0001",
            "lsExCrmWrite0001",
            "lsExAgent0000001",
            "lsExAgentDirect1",
        )
        n8n.add_workflows(own(flows, TAG), credentials, publish=tuple(map(mine, published)))
        print(f"\n[n8n-e2e] stack ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
        yield Stack(n8n, side, records, llm, credentials)


def _node_output(run: Any, node: str) -> list[list[dict[str, Any]]]:
    """Items per output of a node's first run: ``[[json, ...], ...]``."""
    runs = run["resultData"]["runData"].get(node) or []
    if not runs:
        return []
    return [[item["json"] for item in (out or [])] for out in runs[0]["data"]["main"]]


def test_examples_import_and_every_node_type_exists(stack: Stack) -> None:
    known = stack.n8n.node_types()
    for example in sorted(EXAMPLES.glob("*.json")):
        wf = json.loads(example.read_text())
        assert wf["settings"]["executionOrder"] == "v1"
        assert stack.n8n.workflow_exists(mine(wf["id"])), example.name
        for node in wf["nodes"]:
            versions = known.get(node["type"])
            assert versions is not None, f"{example.name}: {node['type']} is not a node of n8n"
            assert node["typeVersion"] in versions, (
                f"{example.name}: {node['type']} v{node['typeVersion']} not in {versions}"
            )


def test_webhook_self_call_proceeds_max_depth_plus_one_then_drops(stack: Stack) -> None:
    wid = mine("lsExSelfCall0001")
    r = stack.n8n.webhook(mine("loopstop-self-call"), {"run": "e2e-1", "hop": 0})
    assert r.status_code == 200, r.text
    rows = stack.n8n.wait_settled(wid, MAX_DEPTH + 2)
    time.sleep(3)  # a loop that failed to stop would show more executions by now
    rows = stack.n8n.wait_settled(wid, MAX_DEPTH + 2)
    assert [x["status"] for x in rows] == ["success"] * (MAX_DEPTH + 2)

    decisions = []
    chain_ids = set()
    for row in rows:
        out = _node_output(stack.n8n.run_data(row["id"]), "Check Trigger")
        proceed, drop = out[0], out[1]
        assert len(proceed) + len(drop) == 1
        answer = (proceed or drop)[0]["loopstop"]
        decisions.append((answer["decision"], answer["reason"], answer["depth"]))
        chain_ids.add(answer["chain_id"])
    assert decisions == [
        ("proceed", "new_chain", 0),
        *[("proceed", "reentry", d) for d in range(1, MAX_DEPTH + 1)],
        ("drop", "chain_depth", MAX_DEPTH + 1),
    ]
    (chain_id,) = chain_ids
    chain = stack.sidecar_get(f"/v1/chains/{chain_id}")["chain"]
    assert (chain["activations"], chain["drops"]) == (MAX_DEPTH + 1, 1)


def test_crm_write_creates_exactly_one_record(stack: Stack) -> None:
    wid = mine("lsExCrmWrite0001")
    before = len(stack.n8n.executions(wid))

    def deliver(order: dict[str, Any]) -> requests.Response:
        return stack.n8n.webhook(mine("loopstop-crm-write"), order)

    # Five deliveries of the same order at once: one writes (200), the others
    # answer 200 with the receipt (replay) or 503 "send again" (in progress).
    order = {"order_id": "A-100", "amount": 42}
    with ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(lambda _: deliver(order), range(5)))
    assert sorted({a.status_code for a in answers}) in ([200], [200, 503]), [
        (a.status_code, a.text) for a in answers
    ]
    for _ in range(2):  # the sender's retries: replayed, with the receipt
        again = deliver(order)
        assert again.status_code == 200, again.text
    created = [o for o in stack.records.orders if o["order_id"] == "A-100"]
    assert len(created) == 1
    assert again.json() == created[0]
    op = stack.sidecar_get(f"/v1/operations/crm-order-A-100?workflow={wid}")["operation"]
    assert (op["state"], op["attempt"]) == ("committed", 1)
    assert op["receipt"]["id"] == created[0]["id"]

    # The CRM commits, then answers after the node's 2 s timeout: unknown, and
    # the sender is told to send again; the next delivery reconciles against
    # the CRM instead of writing again.
    stack.records.slow_orders.add("B-200")
    slow = {"order_id": "B-200", "amount": 7}
    assert deliver(slow).status_code == 503
    slow_op = stack.sidecar_get(f"/v1/operations/crm-order-B-200?workflow={wid}")["operation"]
    assert slow_op["state"] == "unknown"
    for _ in range(3):
        assert deliver(slow).status_code == 200
    assert len([o for o in stack.records.orders if o["order_id"] == "B-200"]) == 1
    op = stack.sidecar_get(f"/v1/operations/crm-order-B-200?workflow={wid}")["operation"]
    assert op["state"] == "committed" and op["reconciliation"] is not None

    rows = stack.n8n.wait_settled(wid, before + 11)
    assert len(rows) == before + 11
    assert all(x["status"] == "success" for x in rows[before:])


def _agent_run(
    stack: Stack, path: str, wid: str, ticket: str
) -> tuple[requests.Response, int, Any]:
    """Drive the agent example once; returns the answer, the model requests it made, the run."""
    stack.llm.mode = "tool_call"  # the same tool call forever
    before = len(stack.llm.requests)
    runs = len(stack.n8n.executions(wid))
    r = stack.n8n.webhook(
        path, {"ticket": ticket, "question": "Add a note and answer."}, timeout=180
    )
    rows = stack.n8n.wait_settled(wid, runs + 1, timeout=120)
    return r, len(stack.llm.requests) - before, rows[-1]


def test_agent_behind_the_model_gate_ends_with_the_final_message(stack: Stack) -> None:
    wid = mine("lsExAgent0000001")
    notes_before = len(stack.records.notes)
    r, model_requests, row = _agent_run(stack, mine("loopstop-agent"), wid, "T-1")
    assert r.status_code == 200, r.text
    assert row["status"] == "success"
    answer = r.json()
    # The same committed write asked for again is replayed (exempt from the
    # identical-call rule, as the reference runners count): the model budget ends it.
    assert answer["status"] == "partial" and answer["reason"] == "model_budget", answer
    assert answer["answer"].startswith("[loopstop] This task has ended: partial (model_budget)")

    run = stack.n8n.run_data(row["id"])
    task_id = _node_output(run, "Create Task")[0][0]["loopstop"]["task"]["task_id"]
    task = stack.sidecar_get(f"/v1/tasks/{task_id}")
    assert task["task"]["status"] == "partial" and task["envelope"]["reason"] == "model_budget"
    notes = [n for n in stack.records.notes[notes_before:] if n["task_id"] == task_id]
    assert len(notes) == 1  # written once, replayed after
    assert task["task"]["used"]["replays"] >= 1
    assert model_requests <= AGENT_MAX_MODEL_CALLS
    assert model_requests < AGENT_MAX_ITERATIONS
    print(
        f"\n[n8n-e2e] agent behind the gate: {model_requests} model requests upstream, "
        f"{len(notes)} note(s) written, task {task['task']['status']}/{task['envelope']['reason']}",
        file=sys.stderr,
    )


def test_agent_without_the_gate_runs_to_max_iterations(stack: Stack) -> None:
    """The same agent with its credential on the model itself: denied tool calls are
    only more tool output, so the model keeps asking until Max Iterations."""
    wid = mine("lsExAgentDirect1")
    notes_before = len(stack.records.notes)
    r, model_requests, row = _agent_run(stack, mine("loopstop-agent-direct"), wid, "T-2")
    assert row["status"] == "error"
    assert model_requests == AGENT_MAX_ITERATIONS
    # The tools are still guarded: the side effect happened at most once.
    assert len(stack.records.notes) - notes_before <= MAX_SAME_CALL
    print(
        f"\n[n8n-e2e] agent without the gate: {model_requests} model requests upstream "
        f"(HTTP {r.status_code}), execution {row['status']}",
        file=sys.stderr,
    )


def test_node_package_lints_builds_and_passes_its_unit_tests(node_package: Path) -> None:
    """The session's build of ``n8n-nodes/`` (``node_package``), then ``npm run lint &&
    npm test`` in it (n8n's own strict lint; the unit tests stub the sidecar at n8n's
    HTTP helper)."""
    for script in ("lint", "test"):
        proc = subprocess.run(
            ["npm", "run", script], cwd=node_package, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, (
            f"npm run {script}:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
        )


def test_credential_test_fails_a_wrong_token(stack: Stack) -> None:
    """The Loop Stop API credential's Test button (n8n's own credential test)."""
    session = stack.n8n.owner_session()

    def test(token: str) -> dict[str, Any]:
        body = {
            "credentials": {
                "id": stack.credentials["lsExLoopStopCred"],
                "name": "Loop Stop",
                "type": "loopStopApi",
                "data": {"baseUrl": stack.sidecar.base, "token": token},
            }
        }
        r = session.post(stack.n8n.base + "/rest/credentials/test", json=body, timeout=30)
        assert r.status_code == 200, r.text
        return dict(r.json()["data"])

    assert test(TOKEN)["status"] == "OK"
    wrong = test("not-the-token-0123456789")
    assert wrong["status"] == "Error" and wrong["message"] == "UNAUTHORIZED", wrong

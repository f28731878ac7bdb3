"""The model gate names a task's workflow as POST /v1/tasks does (NFC)."""

from __future__ import annotations

from fake_llm import FakeLLM
from test_model_gate import chat, gate_app, llm, request

from conftest import Api, AppFactory

__all__ = ["llm"]

NFC = "caf\u00e9"
NFD = "cafe\u0301"


def test_a_gate_task_key_line_in_nfd_continues_the_task_post_tasks_made(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    """``POST /v1/tasks`` normalizes the workflow to NFC; the gate's
    ``loopstop-workflow`` line must too, or one key and one workflow make two
    tasks (budgets split) and the gate's task carries a workflow name that
    stops and scopes written in NFC never match."""
    api = Api(gate_app(make_app, llm).test_client())
    llm.mode = "final"
    status, made = api.post("/v1/tasks", {"task_key": "k-1", "workflow": NFC})
    assert status == 201, made
    lines = f"\nloopstop-task-key: k-1\nloopstop-workflow: {NFD}"
    status, out = chat(api, request(None, system_extra=lines))
    assert status == 200, out
    status, again = api.get(f"/v1/tasks/{made['task']['task_id']}")
    assert again["task"]["used"]["model_calls"] == 1, again["task"]["used"]


def test_a_gate_workflow_line_that_nfc_lengthens_past_the_limit_is_refused(
    make_app: AppFactory, llm: FakeLLM
) -> None:
    """200 characters of U+0958 are 400 in NFC: the line is refused (400 naming
    it) before any task is made or the upstream is asked, as the same name in
    ``POST /v1/tasks`` is."""
    api = Api(gate_app(make_app, llm).test_client())
    llm.mode = "final"
    lines = "\nloopstop-task-key: k-long\nloopstop-workflow: " + "\u0958" * 200
    status, out = chat(api, request(None, system_extra=lines))
    assert status == 400, out
    assert out["errors"][0]["loc"] == ["body", "system", "loopstop-workflow"], out
    assert llm.requests == []

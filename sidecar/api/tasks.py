"""``/v1/tasks``: bounded agent runs (DESIGN §3)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from flask import Blueprint, Response, g

from sidecar.api.answer import json_answer
from sidecar.api.body import check_path, parse_body, parse_query
from sidecar.api.chain_models import cancellation_view, outlier_view
from sidecar.api.decisions import Scope, record_decision
from sidecar.api.hot import HotRoute
from sidecar.api.models import ModeQuery, rfc3339
from sidecar.api.openapi import route
from sidecar.api.task_models import (
    CALL_ID_PATTERN,
    TASK_ID_PATTERN,
    CompleteBody,
    CompleteResponse,
    ModelCallBody,
    ModelCallResponse,
    ResultBody,
    ResultResponse,
    TaskBody,
    TaskOutcome,
    TaskResponse,
    TaskResumeBody,
    TaskStopBody,
    ToolCallBody,
    ToolCallResponse,
    render,
)
from sidecar.core.check_verdicts import CheckResult
from sidecar.core.tasks import LifecycleDecision, Task, ToolResult
from sidecar.runtime import runtime
from sidecar.service import keys
from sidecar.service.keys import ExecutionMode
from sidecar.service.task_inputs import CallInput, CreateInput

bp = Blueprint("tasks", __name__, url_prefix="/v1/tasks")

_T = TypeVar("_T")

_TASK = re.compile(TASK_ID_PATTERN)
_CALL = re.compile(CALL_ID_PATTERN)
_PATH = {"task_id": TASK_ID_PATTERN}


def _task_id(task_id: str) -> str:
    check_path({"task_id": task_id}, {"task_id": _TASK})
    return task_id


def _answer(
    task: Task,
    outcome: TaskOutcome = None,
    checked: CheckResult | None = None,
    status: int = 200,
    **shown: Any,
) -> Response:
    """Answer with :func:`~sidecar.api.task_models.render`."""
    view = render(task, runtime().clock(), outcome, checked, **shown)
    return json_answer(view, status)


def _log(route_name: str, task: Task, decision: Any, reason: Any, **fields: Any) -> None:
    _record(g._get_current_object(), route_name, task, decision, reason, **fields)


def _record(
    scope: Scope, route_name: str, task: Task, decision: Any, reason: Any, **fields: Any
) -> None:
    record_decision(
        scope,
        route_name,
        decision,
        reason,
        task_id=task.task_id,
        workflow=task.workflow,
        chain_id=task.chain_id,
        attempt=task.attempt,
        **fields,
    )


@route(
    bp,
    "",
    "POST",
    tag="tasks",
    body=TaskBody,
    response=TaskResponse,
    status=201,
    summary="Create a task (idempotent on task_key: a re-activated flow continues it).",
)
def create() -> Response:
    body = parse_body(TaskBody)
    ns = keys.namespace(body.execution_mode)
    task, created = runtime().tasks.create(
        g.principal,
        ns,
        CreateInput(
            body.task_key,
            body.workflow,
            body.chain_id,
            body.policy,
            body.limits.model_dump(exclude_none=True),
            body.initial_revision,
        ),
        body.execution_id,
    )
    decision = LifecycleDecision.CREATED if created else LifecycleDecision.EXISTING
    _log("tasks.create", task, decision, None)
    return _answer(task, status=201 if created else 200)


def _in_task_namespace(mode: ExecutionMode, task_id: str, call: Callable[[str], _T]) -> _T:
    """Run ``call`` in the task's namespace (:meth:`TaskService.in_namespace`), once
    ``task_id`` matched its pattern (``call`` uses it as it is).

    :raises ValidationFailed: ``task_id`` is not a task id.
    """
    return runtime().tasks.in_namespace(mode, _task_id(task_id), call)


@route(
    bp,
    "/<task_id>",
    "GET",
    tag="tasks",
    query=ModeQuery,
    response=TaskResponse,
    path_params=_PATH,
    errors=(401, 403, 404, 422, 503),
    summary="The task and, once it ended, its envelope.",
)
def get(task_id: str) -> Response:
    q = parse_query(ModeQuery)
    task, ns = _in_task_namespace(
        q.execution_mode,
        task_id,
        lambda ns: (runtime().tasks.get(g.principal, ns, task_id), ns),
    )
    return _answer(task, **_watch_fields(ns, task))


def _watch_fields(ns: str, task: Task) -> dict[str, Any]:
    """The task's outlier mark, the executions that acted for it and its last stop's
    cancellation in n8n (DESIGN §6)."""
    rt = runtime()
    watched = rt.tasks.watched(ns, task.task_id)
    return {
        "outlier": outlier_view(watched.get("outlier")),
        "cancellation": cancellation_view(rt.stops.recorded(ns, "task", task.task_id)),
        "executions": [{**e, "at": rfc3339(e.get("at"))} for e in watched.get("executions", [])],
        "gate_exchanges": [
            {
                "call_id": e.get("call_id"),
                "tool": e.get("tool"),
                "operation_id": e.get("operation_id"),
                "decision": e.get("decision"),
                "output": e.get("output"),
                "at": rfc3339(e.get("at")),
            }
            for e in task.exchanges
        ],
    }


@route(
    bp,
    "/<task_id>/model-calls",
    "POST",
    tag="tasks",
    body=ModelCallBody,
    response=ModelCallResponse,
    path_params=_PATH,
    summary="Reserve a model turn before calling the model: admit or deny, and wrap_up.",
)
def model_call(task_id: str) -> Response:
    body = parse_body(ModelCallBody)
    task, out = _in_task_namespace(
        body.execution_mode,
        task_id,
        lambda ns: runtime().tasks.model_call(
            g.principal, ns, task_id, body.tokens_used, execution_id=body.execution_id
        ),
    )
    reason = None if out.reason is None else str(out.reason)
    _log("tasks.model_call", task, out.decision, reason, wrap_up=out.wrap_up)
    return _answer(task, out)


@route(
    bp,
    "/<task_id>/tool-calls",
    "POST",
    tag="tasks",
    body=ToolCallBody,
    response=ToolCallResponse,
    path_params=_PATH,
    summary="Admit a tool call before it executes: execute, replay (writes) or deny.",
)
def tool_call(task_id: str) -> Response:
    body = parse_body(ToolCallBody)
    return json_answer(tool_call_answer(g._get_current_object(), body, _task_id(task_id)))


def tool_call_answer(scope: Scope, body: ToolCallBody, task_id: str) -> TaskResponse:
    """The admission of a tool call to ``task_id`` (a valid id) for the request
    ``scope``, logged: the answer's model (the Flask view's and the hot path's)."""
    rt = scope.runtime
    call = CallInput(body.tool, body.kind, body.args, body.operation_id, body.call_id)
    task, out = rt.tasks.in_namespace(
        body.execution_mode,
        task_id,
        lambda ns: rt.tasks.tool_call(scope.principal, ns, task_id, call, body.execution_id),
    )
    reason = None if out.reason is None else str(out.reason)
    _record(
        scope,
        "tasks.tool_call",
        task,
        out.decision,
        reason,
        tool=body.tool,
        kind=body.kind,
        call_id=out.call_id,
        operation_id=body.operation_id,
    )
    return render(task, rt.clock(), out)


@route(
    bp,
    "/<task_id>/tool-calls/<call_id>/result",
    "POST",
    tag="tasks",
    body=ResultBody,
    response=ResultResponse,
    path_params={**_PATH, "call_id": CALL_ID_PATTERN},
    summary="Record a call's result with trusted evidence; may end the task.",
)
def tool_result(task_id: str, call_id: str) -> Response:
    check_path({"call_id": call_id}, {"call_id": _CALL})
    body = parse_body(ResultBody)
    scope = g._get_current_object()
    return json_answer(tool_result_answer(scope, body, _task_id(task_id), call_id))


def tool_result_answer(scope: Scope, body: ResultBody, task_id: str, call_id: str) -> TaskResponse:
    """A tool call's result for ``task_id`` and ``call_id`` (valid ids) for the
    request ``scope``, logged: the answer's model (the Flask view's and the hot
    path's)."""
    rt = scope.runtime
    res = ToolResult(
        status=body.status,
        result_fp=rt.fingerprinter.fingerprint(body.result),
        result=body.result,
        receipt=body.receipt,
        evidence=None if body.evidence is None else body.evidence.core(),
    )
    task, out, checked = rt.tasks.in_namespace(
        body.execution_mode,
        task_id,
        lambda ns: rt.tasks.tool_result(scope.principal, ns, task_id, call_id, res),
    )
    reason = None if out.reason is None else str(out.reason)
    _record(
        scope, "tasks.tool_result", task, out.decision, reason, call_id=call_id, status=body.status
    )
    return render(task, rt.clock(), out, checked)


@route(
    bp,
    "/<task_id>/complete",
    "POST",
    tag="tasks",
    body=CompleteBody,
    response=CompleteResponse,
    path_params=_PATH,
    summary="Validate the exit with a check or trusted evidence: completed, continue or ended.",
)
def complete(task_id: str) -> Response:
    body = parse_body(CompleteBody)
    evidence = None if body.evidence is None else body.evidence.core()
    task, out, checked = _in_task_namespace(
        body.execution_mode,
        task_id,
        lambda ns: runtime().tasks.complete(
            g.principal, ns, task_id, evidence, body.check, body.input
        ),
    )
    reason = None if out.reason is None else str(out.reason)
    _log("tasks.complete", task, out.decision, reason)
    return _answer(task, out, checked)


@route(
    bp,
    "/<task_id>/stop",
    "POST",
    tag="tasks",
    body=TaskStopBody,
    response=TaskResponse,
    path_params=_PATH,
    summary="Stop the task (sticky operator_stop).",
)
def stop(task_id: str) -> Response:
    body = parse_body(TaskStopBody)
    rt = runtime()
    task, cancellation, ns = _in_task_namespace(
        body.execution_mode,
        task_id,
        lambda ns: (*rt.stops.stop_task(g.principal, ns, task_id), ns),
    )
    _log(
        "tasks.stop",
        task,
        LifecycleDecision.STOPPED,
        body.reason,
        cancellation=str(cancellation.state),
        cancellation_error=cancellation.error,
    )
    return _answer(task, **_watch_fields(ns, task))


@route(
    bp,
    "/<task_id>/resume",
    "POST",
    tag="tasks",
    body=TaskResumeBody,
    response=TaskResponse,
    path_params=_PATH,
    summary="A linked attempt keeping counters and history; extend needs admin.",
)
def resume(task_id: str) -> Response:
    body = parse_body(TaskResumeBody)
    extend = None if body.extend is None else body.extend.model_dump(exclude_none=True)
    task = _in_task_namespace(
        body.execution_mode,
        task_id,
        lambda ns: runtime().tasks.resume(g.principal, ns, task_id, body.reason, extend or None),
    )
    _log(
        "tasks.resume", task, LifecycleDecision.RESUMED, body.reason, extended=bool(extend) or None
    )
    return _answer(task)


#: The routes :mod:`sidecar.api.hot` serves without Flask's per-request work.
HOT = [
    HotRoute("tasks.tool_call", ToolCallBody, tool_call_answer),
    HotRoute("tasks.tool_result", ResultBody, tool_result_answer),
]

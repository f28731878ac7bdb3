"""``/v1/operations``: the idempotent-write ledger (DESIGN §1)."""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, Response, g

from sidecar.api.answer import json_answer
from sidecar.api.body import check_path, parse_body, parse_query
from sidecar.api.decisions import Scope, record_decision
from sidecar.api.hot import HotRoute
from sidecar.api.models import (
    OPERATION_ID_PATTERN,
    BeginBody,
    BeginResponse,
    CommitBody,
    FailBody,
    OperationListQuery,
    OperationPage,
    OperationQuery,
    OperationResponse,
    OperationView,
    ReconcileBody,
    RequestBody,
)
from sidecar.api.openapi import route
from sidecar.canonical import canonical_json
from sidecar.core.operations import Operation, OperationState
from sidecar.errors import PayloadTooLarge, ValidationFailed
from sidecar.runtime import runtime
from sidecar.service import keys
from sidecar.service.operations import BeginInput

bp = Blueprint("operations", __name__, url_prefix="/v1/operations")

_ID = re.compile(OPERATION_ID_PATTERN)
_PATH = {"operation_id": OPERATION_ID_PATTERN}


#: The largest reconcile input, receipt or evidence kept on a record (canonical
#: JSON bytes): they are stored with the record and shown in every answer.
MAX_RECONCILE_BYTES = 16_384


def _bounded(value: Any, where: str) -> None:
    """:raises PayloadTooLarge: when ``value`` encodes to more than 16 KiB."""
    if value is not None and len(canonical_json(value)) > MAX_RECONCILE_BYTES:
        raise PayloadTooLarge(
            f"body.{where} exceeds {MAX_RECONCILE_BYTES} bytes (canonical JSON): keep an id, "
            "not the whole record"
        )


def _operation_id(operation_id: str) -> str:
    check_path({"operation_id": operation_id}, {"operation_id": _ID})
    return operation_id


def _answer(op: Operation, ns: str) -> Response:
    return json_answer(OperationResponse(operation=OperationView.of(op, ns)))


def _settled(
    route_name: str, op: Operation, ns: str, reason: object, body: RequestBody
) -> Response:
    """Log a commit, fail or reconcile (with the n8n execution that sent it) and
    answer with the record."""
    _log_settled(g._get_current_object(), route_name, op, reason, body)
    return _answer(op, ns)


def _log_settled(
    scope: Scope, route_name: str, op: Operation, reason: object, body: RequestBody
) -> None:
    """Log a commit, fail or reconcile with the n8n execution that sent it."""
    record_decision(
        scope,
        route_name,
        op.state,
        reason,
        operation_id=op.operation_id,
        workflow=op.workflow,
        attempt=op.attempt,
        execution_mode=body.execution_mode,
        execution_id=body.execution_id,
    )


@route(
    bp,
    "/<operation_id>/begin",
    "POST",
    tag="operations",
    body=BeginBody,
    response=BeginResponse,
    path_params=_PATH,
    summary="Reserve an operation before the write: execute, replay, in_progress, "
    "reconcile, conflict, stopped or exhausted.",
)
def begin(operation_id: str) -> Response:
    operation_id = _operation_id(operation_id)
    scope = g._get_current_object()
    return json_answer(begin_answer(scope, parse_body(BeginBody), operation_id))


def begin_answer(scope: Scope, body: BeginBody, operation_id: str) -> BeginResponse:
    """The begin of ``operation_id`` (a valid id) for the request ``scope``,
    logged: the answer's model (the Flask view's and the hot path's)."""
    ns = scope.ns = keys.namespace(body.execution_mode)
    if body.reconcile is not None:
        _bounded(body.reconcile.input, "reconcile.input")
    inp = BeginInput(
        body.payload,
        body.workflow,
        body.task_id,
        body.chain_id,
        body.lease_s,
        None if body.reconcile is None else body.reconcile.model_dump(mode="json"),
        shared=body.scope == "shared",
    )
    begun = scope.runtime.operations.begin(scope.principal, ns, operation_id, inp)
    outcome, op = begun.outcome, begun.outcome.operation
    record_decision(
        scope,
        "operations.begin",
        outcome.decision,
        outcome.reason,
        payload_fp=begun.payload_fp,
        operation_id=operation_id,
        workflow=op.workflow if op else body.workflow,
        attempt=op.attempt if op else None,
        execution_mode=body.execution_mode,
        execution_id=body.execution_id,
    )
    return BeginResponse.of(outcome, ns)


@route(
    bp,
    "/<operation_id>/commit",
    "POST",
    tag="operations",
    body=CommitBody,
    response=OperationResponse,
    path_params=_PATH,
    summary="The attempt's write happened: record its receipt.",
)
def commit(operation_id: str) -> Response:
    operation_id = _operation_id(operation_id)
    return json_answer(commit_answer(g._get_current_object(), parse_body(CommitBody), operation_id))


def commit_answer(scope: Scope, body: CommitBody, operation_id: str) -> OperationResponse:
    """The commit of ``operation_id`` (a valid id) for the request ``scope``,
    logged: the answer's model (the Flask view's and the hot path's)."""
    ns = scope.ns = keys.namespace(body.execution_mode)
    op = scope.runtime.operations.commit(
        scope.principal, ns, operation_id, body.attempt, body.receipt, body.result, body.workflow
    )
    _log_settled(scope, "operations.commit", op, None, body)
    return OperationResponse(operation=OperationView.of(op, ns))


@route(
    bp,
    "/<operation_id>/fail",
    "POST",
    tag="operations",
    body=FailBody,
    response=OperationResponse,
    path_params=_PATH,
    summary="The attempt failed: not_committed (rejected) or unknown (timeout).",
)
def fail(operation_id: str) -> Response:
    operation_id = _operation_id(operation_id)
    body = parse_body(FailBody)
    ns = g.ns = keys.namespace(body.execution_mode)
    op = runtime().operations.fail(
        g.principal, ns, operation_id, body.attempt, body.outcome, body.detail, body.workflow
    )
    return _settled("operations.fail", op, ns, body.outcome, body)


@route(
    bp,
    "/<operation_id>/reconcile",
    "POST",
    tag="operations",
    body=ReconcileBody,
    response=OperationResponse,
    path_params=_PATH,
    summary="Settle an operation whose outcome was unknown, with evidence.",
)
def reconcile(operation_id: str) -> Response:
    operation_id = _operation_id(operation_id)
    body = parse_body(ReconcileBody)
    if body.evidence is None:
        raise ValidationFailed([{"loc": ["body", "evidence"], "msg": "evidence is required"}])
    _bounded(body.receipt, "receipt")
    _bounded(body.evidence, "evidence")
    ns = g.ns = keys.namespace(body.execution_mode)
    op = runtime().operations.reconcile(
        g.principal, ns, operation_id, body.outcome, body.receipt, body.evidence, body.workflow
    )
    return _settled("operations.reconcile", op, ns, body.outcome, body)


@route(
    bp,
    "/<operation_id>",
    "GET",
    tag="operations",
    query=OperationQuery,
    response=OperationResponse,
    path_params=_PATH,
    errors=(401, 403, 404, 422, 503),
    summary="The record: state, attempt, receipt, timestamps (never the payload).",
)
def get(operation_id: str) -> Response:
    operation_id = _operation_id(operation_id)
    q = parse_query(OperationQuery)
    ns = g.ns = keys.namespace(q.execution_mode)
    return _answer(runtime().operations.get(g.principal, ns, operation_id, q.workflow), ns)


@route(
    bp,
    "",
    "GET",
    tag="operations",
    query=OperationListQuery,
    response=OperationPage,
    errors=(401, 403, 422, 503),
    summary="The reconciliation queue (state=unknown) or the in-flight writes, paginated.",
)
def list_operations() -> Response:
    q = parse_query(OperationListQuery)
    ns = g.ns = keys.namespace(q.execution_mode)
    page = runtime().operations.list_open(
        g.principal, ns, OperationState(q.state), q.workflow, q.cursor, q.limit
    )
    view = OperationPage(
        items=[OperationView.of(op, ns) for op in page.items], next_cursor=page.next_cursor
    )
    return json_answer(view)


#: The routes :mod:`sidecar.api.hot` serves without Flask's per-request work.
HOT = [
    HotRoute("operations.begin", BeginBody, begin_answer),
    HotRoute("operations.commit", CommitBody, commit_answer),
]

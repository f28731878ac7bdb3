"""``/v1/checks``: validated business exits against the system of record (DESIGN §4)."""

from __future__ import annotations

import re

from flask import Blueprint, Response, g, jsonify
from pydantic import BaseModel, JsonValue

from sidecar.api.answer import json_answer
from sidecar.api.body import check_path, parse_body
from sidecar.api.decisions import log_decision
from sidecar.api.models import RequestBody
from sidecar.api.openapi import route
from sidecar.api.task_models import TASK_ID_PATTERN, CheckView
from sidecar.core.check_verdicts import CheckDecision
from sidecar.errors import ValidationFailed
from sidecar.runtime import runtime
from sidecar.service import keys

bp = Blueprint("checks", __name__, url_prefix="/v1/checks")

_NAME = r"^[A-Za-z0-9._-]{1,100}$"


class CheckBody(RequestBody):
    """``POST /v1/checks/{name}``: run a configured check on ``input``."""

    input: JsonValue = None
    task_id: str | None = None


class CheckInfo(BaseModel):
    name: str
    kind: str


class CheckList(BaseModel):
    checks: list[CheckInfo]


@route(
    bp,
    "",
    "GET",
    tag="checks",
    response=CheckList,
    errors=(401, 403),
    summary="The configured checks the token may run.",
)
def list_checks() -> Response:
    items = [CheckInfo(name=n, kind=k) for n, k in runtime().checks.names(g.principal)]
    return jsonify(CheckList(checks=items).model_dump())


@route(
    bp,
    "/<name>",
    "POST",
    tag="checks",
    body=CheckBody,
    response=CheckView,
    path_params={"name": _NAME},
    summary="Run a check: passed, reason, revision, evidence (never passes by default).",
)
def run_check(name: str) -> Response:
    check_path({"name": name}, {"name": re.compile(_NAME)})
    body = parse_body(CheckBody)
    if body.task_id is not None and not re.fullmatch(TASK_ID_PATTERN, body.task_id):
        raise ValidationFailed([{"loc": ["body", "task_id"], "msg": "not a task id"}])
    ns = keys.namespace(body.execution_mode)
    result = runtime().checks.run(g.principal, ns, name, body.input, body.task_id)
    log_decision(
        "checks.run",
        CheckDecision.of(result.passed),
        result.reason,
        check=name,
        task_id=body.task_id,
    )
    view = CheckView(
        passed=result.passed,
        reason=str(result.reason),
        revision=result.revision,
        evidence=result.evidence,
    )
    return json_answer(view)

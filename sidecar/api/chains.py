"""``/v1/activations``, ``/v1/effects``, ``/v1/chains`` and ``/v1/workflows``:
breaking self-triggering chains (DESIGN §2)."""

from __future__ import annotations

import re

from flask import Blueprint, Response, g

from sidecar.api.answer import json_answer
from sidecar.api.body import check_path, parse_body, parse_query
from sidecar.api.chain_models import (
    ActivationBody,
    ActivationResponse,
    CancellationView,
    ChainResponse,
    ChainView,
    EffectBody,
    EffectResponse,
    ResumeBody,
    StopBody,
    StopView,
    WorkflowResponse,
)
from sidecar.api.decisions import Scope, log_decision, record_decision
from sidecar.api.hot import HotRoute
from sidecar.api.models import ModeQuery, nfc_name
from sidecar.api.openapi import route
from sidecar.core.chains import EffectDecision
from sidecar.core.stops import Stop, StopDecision
from sidecar.errors import ValidationFailed
from sidecar.markers import CHAIN_ID_PATTERN
from sidecar.runtime import runtime
from sidecar.service import keys
from sidecar.service.chains import ActivationInput, ChainInfo, EffectInput
from sidecar.service.keys import ExecutionMode
from sidecar.service.stops import Cancellation

bp = Blueprint("chains", __name__, url_prefix="/v1")

_CHAIN = re.compile(CHAIN_ID_PATTERN)
_WORKFLOW = re.compile(r"^[^/\x00-\x1f\x7f]{1,200}$")
_CHAIN_PATH = {"chain_id": CHAIN_ID_PATTERN}
_WF_PATH = {"workflow": _WORKFLOW.pattern}


@route(
    bp,
    "/activations",
    "POST",
    tag="chains",
    body=ActivationBody,
    response=ActivationResponse,
    summary="Right after a trigger: proceed, or drop an echo, a duplicate, a deep chain.",
)
def activate() -> Response:
    return json_answer(activation_answer(g._get_current_object(), parse_body(ActivationBody)))


def activation_answer(scope: Scope, body: ActivationBody) -> ActivationResponse:
    """The activation ``body`` for the request ``scope``, counted and logged: the
    answer's model (the Flask view's and the hot path's)."""
    ns = scope.ns = keys.namespace(body.execution_mode)
    rt = scope.runtime
    result = rt.chains.activate(
        scope.principal,
        ns,
        ActivationInput(
            workflow=body.workflow,
            event_key=body.event_key,
            related_keys=tuple(body.related_keys),
            subject_key=body.subject_key,
            content=body.content,
            event=body.event,
            marker=body.marker,
            execution_id=body.execution_id,
            execution_mode=body.execution_mode,
        ),
    )
    out = result.outcome
    if result.invalid_markers:
        rt.metrics.invalid_markers.inc(result.invalid_markers)
    record_decision(
        scope,
        "activations",
        out.decision,
        out.reason,
        workflow=body.workflow,
        trigger=body.trigger,
        chain_id=out.chain_id,
        depth=out.depth,
        activation_id=result.activation_id,
        invalid_markers=result.invalid_markers or None,
        execution_mode=body.execution_mode,
        execution_id=body.execution_id,
    )
    return ActivationResponse.of(result)


@route(
    bp,
    "/effects",
    "POST",
    tag="chains",
    body=EffectBody,
    response=EffectResponse,
    summary="Register what this execution writes, so its return is recognized as an echo.",
)
def register_effect() -> Response:
    body = parse_body(EffectBody)
    if body.workflow is None and body.chain_id is None:
        raise ValidationFailed(
            [{"loc": ["body", "workflow"], "msg": "name the workflow (or the chain_id)"}]
        )
    ns = g.ns = keys.namespace(body.execution_mode)
    chain, effect = runtime().chains.register_effect(
        g.principal,
        ns,
        EffectInput(
            chain_id=body.chain_id,
            workflow=body.workflow,
            target_keys=body.targets(),
            content=body.content,
            ttl_s=body.ttl_s,
            strict=body.strict,
            execution_id=body.execution_id,
            execution_mode=body.execution_mode,
        ),
    )
    log_decision(
        "effects",
        EffectDecision.REGISTERED,
        None,
        workflow=effect.workflow,
        chain_id=chain.chain_id,
        effect_id=effect.effect_id,
        execution_mode=body.execution_mode,
    )
    view = EffectResponse.of(chain, effect, len(body.targets()))
    return json_answer(view)


def _chain_answer(info: ChainInfo, ns: str, cancellation: Cancellation | None = None) -> Response:
    rt = runtime()
    recorded = (
        cancellation.to_doc()
        if cancellation is not None
        else rt.stops.recorded(ns, "chain", info.chain.chain_id)
    )
    view = ChainResponse(
        chain=ChainView.of(info.chain, info.stop, rt.clock()),
        cancellation=CancellationView.of(recorded),
    )
    return json_answer(view)


@route(
    bp,
    "/chains/<chain_id>",
    "GET",
    tag="chains",
    query=ModeQuery,
    response=ChainResponse,
    path_params=_CHAIN_PATH,
    errors=(401, 403, 404, 422, 503),
    summary="A chain: depth, activations, drops, effects, stop state, recent activations.",
)
def get_chain(chain_id: str) -> Response:
    check_path({"chain_id": chain_id}, {"chain_id": _CHAIN})
    q = parse_query(ModeQuery)
    ns = keys.namespace(q.execution_mode)
    return _chain_answer(runtime().chains.chain(g.principal, ns, chain_id), ns)


@route(
    bp,
    "/chains/<chain_id>/stop",
    "POST",
    tag="chains",
    body=StopBody,
    response=ChainResponse,
    path_params=_CHAIN_PATH,
    summary="Stop a chain (admin): later activations and begins are refused; the n8n "
    "executions that acted for it are stopped and confirmed.",
)
def stop_chain(chain_id: str) -> Response:
    body = parse_body(StopBody)
    return _set_chain_stop(chain_id, body.execution_mode, body.reason, stopped=True)


@route(
    bp,
    "/chains/<chain_id>/resume",
    "POST",
    tag="chains",
    body=ResumeBody,
    response=ChainResponse,
    path_params=_CHAIN_PATH,
    summary="Lift a chain's stop (admin).",
)
def resume_chain(chain_id: str) -> Response:
    body = parse_body(ResumeBody)
    return _set_chain_stop(chain_id, body.execution_mode, body.reason or "", stopped=False)


def _set_chain_stop(chain_id: str, mode: ExecutionMode, reason: str, stopped: bool) -> Response:
    """Stop (and reach n8n) or resume a chain (admin), log it, answer with the chain."""
    check_path({"chain_id": chain_id}, {"chain_id": _CHAIN})
    rt = runtime()
    ns = keys.namespace(mode)
    cancellation = None
    if stopped:
        info, cancellation = rt.stops.stop_chain(g.principal, mode, chain_id, reason)
    else:
        info = rt.chains.stop_chain(g.principal, ns, chain_id, reason, stopped=False)
    route_name = "chains.stop" if stopped else "chains.resume"
    log_decision(
        route_name,
        StopDecision.STOPPED if stopped else StopDecision.RESUMED,
        reason or None,
        chain_id=chain_id,
        workflow=info.chain.workflow,
        cancellation=None if cancellation is None else str(cancellation.state),
        cancellation_error=None if cancellation is None else cancellation.error,
    )
    return _chain_answer(info, ns, cancellation)


def _path_workflow(workflow: str) -> str:
    """The workflow named in a path, checked and in NFC, as a body's ``workflow`` is
    (``cafe%CC%81`` and ``caf%C3%A9`` are one workflow).

    :raises ValidationError: (422) not a workflow name.
    """
    check_path({"workflow": workflow}, {"workflow": _WORKFLOW})
    try:  # NFC may lengthen a name (U+0958 is two code points): checked again after
        return nfc_name(workflow)
    except ValueError as exc:
        raise ValidationFailed([{"loc": ["path", "workflow"], "msg": str(exc)}]) from exc


def _workflow_answer(
    workflow: str, stop: Stop | None, ns: str, cancellation: Cancellation | None = None
) -> Response:
    recorded = (
        cancellation.to_doc()
        if cancellation is not None
        else runtime().stops.recorded(ns, "workflow", workflow)
    )
    view = WorkflowResponse(
        workflow=workflow, stopped=StopView.of(stop), cancellation=CancellationView.of(recorded)
    )
    return json_answer(view)


@route(
    bp,
    "/workflows/<workflow>",
    "GET",
    tag="chains",
    query=ModeQuery,
    response=WorkflowResponse,
    path_params=_WF_PATH,
    errors=(401, 403, 422, 503),
    summary="Whether a workflow is stopped.",
)
def get_workflow(workflow: str) -> Response:
    workflow = _path_workflow(workflow)
    q = parse_query(ModeQuery)
    ns = keys.namespace(q.execution_mode)
    stop = runtime().chains.workflow_stop(g.principal, ns, workflow)
    return _workflow_answer(workflow, stop, ns)


@route(
    bp,
    "/workflows/<workflow>/stop",
    "POST",
    tag="chains",
    body=StopBody,
    response=WorkflowResponse,
    path_params=_WF_PATH,
    summary="Stop a workflow (admin): activations, task admissions and begins are refused; "
    "its running and waiting n8n executions are stopped and confirmed.",
)
def stop_workflow(workflow: str) -> Response:
    workflow = _path_workflow(workflow)
    body = parse_body(StopBody)
    ns = keys.namespace(body.execution_mode)
    stop, cancellation = runtime().stops.stop_workflow(
        g.principal, body.execution_mode, workflow, body.reason
    )
    log_decision(
        "workflows.stop",
        StopDecision.STOPPED,
        body.reason,
        workflow=workflow,
        cancellation=str(cancellation.state),
        cancellation_error=cancellation.error,
    )
    return _workflow_answer(workflow, stop, ns, cancellation)


@route(
    bp,
    "/workflows/<workflow>/resume",
    "POST",
    tag="chains",
    body=ResumeBody,
    response=WorkflowResponse,
    path_params=_WF_PATH,
    summary="Lift a workflow's stop (admin).",
)
def resume_workflow(workflow: str) -> Response:
    workflow = _path_workflow(workflow)
    body = parse_body(ResumeBody)
    ns = keys.namespace(body.execution_mode)
    stop = runtime().chains.stop_workflow(
        g.principal, ns, workflow, body.reason or "", stopped=False
    )
    log_decision("workflows.resume", StopDecision.RESUMED, body.reason, workflow=workflow)
    return _workflow_answer(workflow, stop, ns)


#: The routes :mod:`sidecar.api.hot` serves without Flask's per-request work.
HOT = [HotRoute("chains.activate", ActivationBody, activation_answer)]

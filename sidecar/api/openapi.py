"""The OpenAPI 3.1 document, generated from the pydantic models of each route.

Routes are declared with :func:`route`, which registers the Flask view and
records its request and response models; :func:`document` turns that
registry into ``/openapi.json`` with pydantic's own JSON Schema generator
(``models_json_schema``), so the document cannot drift from validation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from flask import Blueprint
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

import sidecar
from sidecar.api.models import Problem


@dataclass(frozen=True)
class RouteDoc:
    """What one route takes and answers."""

    path: str
    method: str
    summary: str
    tag: str
    body: type[BaseModel] | None
    query: type[BaseModel] | None
    response: type[BaseModel] | None
    errors: tuple[int, ...]
    auth: bool
    status: int = 200
    path_params: dict[str, str] = field(default_factory=dict)


REGISTRY: list[RouteDoc] = []

_STANDARD_ERRORS = (400, 401, 403, 404, 409, 413, 415, 422, 503)


def route(
    bp: Blueprint,
    rule: str,
    method: Literal["GET", "POST"],
    *,
    summary: str,
    tag: str,
    body: type[BaseModel] | None = None,
    query: type[BaseModel] | None = None,
    response: type[BaseModel] | None = None,
    errors: tuple[int, ...] = _STANDARD_ERRORS,
    auth: bool = True,
    path_params: dict[str, str] | None = None,
    status: int = 200,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a Flask view and document it.

    :param rule: the Flask rule relative to the blueprint (``/<name>/begin``).
    :param path_params: ``{name: regex}`` for the document.
    """
    prefix = bp.url_prefix or ""
    path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", prefix + rule)
    REGISTRY.append(
        RouteDoc(
            path,
            method.lower(),
            summary,
            tag,
            body,
            query,
            response,
            errors,
            auth,
            status,
            path_params=path_params or {},
        )
    )

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        bp.add_url_rule(rule, view_func=view, methods=[method])
        return view

    return decorate


def document() -> dict[str, Any]:
    """Build the OpenAPI 3.1 document from :data:`REGISTRY`."""
    models: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {}
    for r in REGISTRY:
        if r.body is not None:
            models[(r.body, "validation")] = None
        if r.response is not None:
            models[(r.response, "serialization")] = None
    models[(Problem, "serialization")] = None
    refs, schema = models_json_schema(
        list(models),
        ref_template="#/components/schemas/{model}",
    )
    paths: dict[str, dict[str, Any]] = {}
    for r in REGISTRY:
        op: dict[str, Any] = {
            "summary": r.summary,
            "tags": [r.tag],
            "operationId": f"{r.method}_{r.path}".replace("/", "_"),
        }
        params: list[dict[str, Any]] = [
            {"name": n, "in": "path", "required": True, "schema": {"type": "string", "pattern": p}}
            for n, p in r.path_params.items()
        ]
        if r.query is not None:
            qschema = r.query.model_json_schema()
            for name, prop in qschema.get("properties", {}).items():
                params.append(
                    {
                        "name": name,
                        "in": "query",
                        "required": name in qschema.get("required", []),
                        "schema": prop,
                    }
                )
        if params:
            op["parameters"] = params
        if r.body is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": refs[(r.body, "validation")]}},
            }
        responses: dict[str, Any] = {}
        codes = {200, r.status} if r.status == 201 else {r.status}  # 201 created, 200 found
        if r.response is not None:
            for code in sorted(codes):
                responses[str(code)] = {
                    "description": "OK",
                    "content": {
                        "application/json": {"schema": refs[(r.response, "serialization")]}
                    },
                }
        for code in r.errors:
            responses[str(code)] = {
                "description": "problem details (RFC 9457)",
                "content": {
                    "application/problem+json": {"schema": refs[(Problem, "serialization")]}
                },
            }
        if r.path_params or r.query is not None:
            responses["414"] = {
                "description": "request line over 8190 bytes (the HTTP server's "
                "own answer, before loopstop sees the request)"
            }
        op["responses"] = responses
        if r.auth:
            op["security"] = [{"bearer": []}]
        paths.setdefault(r.path, {})[r.method] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "loopstop",
            "version": sidecar.__version__,
            "description": "A sidecar for n8n that makes automation loops stop.",
        },
        "paths": paths,
        "components": {
            "schemas": schema.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }

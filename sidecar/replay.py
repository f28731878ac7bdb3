"""Replay a scenario file: a captured trajectory of requests with the answer
expected at each step, run against a fresh in-process sidecar.

The same files under ``tests/scenarios/`` are the test suite's scenario
tables and what ``loopstop replay`` reads, so a captured incident becomes a
new file, not new code.

File shape (JSON)::

    {"name": "...", "description": "...",
     "config": {...optional sections of loopstop.yaml...},
     "steps": [
       {"note": "...", "post": "/v1/operations/x/begin", "body": {...},
        "expect": {"status": 200, "json": {"decision": "execute"}}},
       {"get": "/v1/operations/x", "expect": {"json": {"operation": {"state": "unknown"}}}},
       {"advance_s": 61}
     ]}

``expect.json`` matches as a subset: every key given must be present with
an equal value (recursively; a list matches a list of the same length whose
items match in order); keys not given are not checked.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

SCENARIO_EPOCH = 1_790_000_000.0  # 2026-09-21T14:13:20Z: scenarios never read the real clock


class Expect(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: int = 200
    json_: dict[str, JsonValue] | None = Field(default=None, alias="json")


class Step(BaseModel):
    """One request (``post`` or ``get``) or one move of the clock (``advance_s``)."""

    model_config = ConfigDict(extra="forbid")

    note: str | None = None
    post: str | None = None
    get: str | None = None
    body: JsonValue = None
    advance_s: float | None = None
    expect: Expect | None = None

    @model_validator(mode="after")
    def _one_action(self) -> Step:
        if sum(x is not None for x in (self.post, self.get, self.advance_s)) != 1:
            raise ValueError("a step has exactly one of post, get, advance_s")
        return self


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    config: dict[str, JsonValue] = {}
    steps: list[Step]


@dataclass
class StepResult:
    index: int
    step: Step
    status: int | None
    body: Any
    mismatches: list[str]

    @property
    def ok(self) -> bool:
        return not self.mismatches


def mismatches(expected: Any, actual: Any, path: str = "$") -> list[str]:
    """Where ``actual`` differs from the ``expected`` subset (empty when it matches)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: expected an object, got {json.dumps(actual)}"]
        out: list[str] = []
        for key, value in expected.items():
            if key not in actual:
                out.append(f"{path}.{key}: missing")
            else:
                out += mismatches(value, actual[key], f"{path}.{key}")
        return out
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: expected {len(expected)} items, got {json.dumps(actual)}"]
        return [
            m
            for i, (e, a) in enumerate(zip(expected, actual, strict=True))
            for m in mismatches(e, a, f"{path}[{i}]")
        ]
    if expected != actual or isinstance(expected, bool) != isinstance(actual, bool):
        return [f"{path}: expected {json.dumps(expected)}, got {json.dumps(actual)}"]
    return []


def load(path: Path) -> Scenario:
    """Parse a scenario file.

    :raises pydantic.ValidationError: when the file does not have the shape above.
    :raises ValueError: when it is not JSON.
    """
    return Scenario.model_validate_json(path.read_text())


def run(scenario: Scenario, store_url: str | None = None) -> Iterator[StepResult]:
    """Run every step against a fresh sidecar; yields one result per step.

    :param store_url: the store to use (default: a temporary SQLite file).
    """
    from sidecar.app import create_app

    now = [SCENARIO_EPOCH]
    with tempfile.TemporaryDirectory(prefix="loopstop-replay-") as tmp:
        config = {"store": store_url or f"sqlite:///{tmp}/replay.db", **scenario.config}
        app = create_app(
            config,
            environ={"LOOPSTOP_SECRET": "replay-secret-0123456789"},
            clock=lambda: now[0],
            announce=False,
        )
        client = app.test_client()
        try:
            for i, step in enumerate(scenario.steps):
                if step.advance_s is not None:
                    now[0] += step.advance_s
                    yield StepResult(i, step, None, None, [])
                    continue
                if step.post is not None:
                    resp = client.post(step.post, json=step.body if step.body is not None else {})
                else:
                    resp = client.get(step.get or "")
                body = resp.get_json(silent=True)
                problems: list[str] = []
                if step.expect is not None:
                    if resp.status_code != step.expect.status:
                        problems.append(
                            f"status: expected {step.expect.status}, got {resp.status_code}"
                        )
                    if step.expect.json_ is not None:
                        problems += mismatches(step.expect.json_, body)
                yield StepResult(i, step, resp.status_code, body, problems)
        finally:
            app.extensions["loopstop"].store.close()

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

A step may ``save`` values of its answer (``{"name": "dotted.path"}``);
later steps use them as ``${name}`` in paths and bodies (a string that is
exactly ``${name}`` takes the saved value with its type). A ``post`` step
with ``"concurrent": N`` sends N copies at once; ``expect.counts`` then
counts answers by ``decision/reason`` (``{"proceed/new_chain": 1,
"drop/duplicate_event": 2}``). ``"repeat": N, "every_s": S`` sends the
request N times in a row, moving the clock S seconds before each repeat,
with ``${i}`` counting repeats from 0; ``expect.json`` then applies to the
last answer and ``expect.counts`` to all of them.

``expect.json`` matches as a subset: every key given must be present with
an equal value (recursively; a list matches a list of the same length whose
items match in order); keys not given are not checked.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from flask import Flask
from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

SCENARIO_EPOCH = 1_790_000_000.0  # 2026-09-21T14:13:20Z: scenarios never read the real clock


class Expect(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: int = 200
    json_: dict[str, JsonValue] | None = Field(default=None, alias="json")
    counts: dict[str, int] | None = None


class Step(BaseModel):
    """One request (``post`` or ``get``) or one move of the clock (``advance_s``)."""

    model_config = ConfigDict(extra="forbid")

    note: str | None = None
    post: str | None = None
    get: str | None = None
    body: JsonValue = None
    advance_s: float | None = None
    concurrent: int | None = Field(default=None, ge=2, le=64)
    repeat: int | None = Field(default=None, ge=2, le=10_000)
    every_s: float = 0.0
    save: dict[str, str] = {}
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


_VAR = re.compile(r"\$\{([A-Za-z0-9_]+)\}")


def substitute(value: Any, saved: dict[str, Any]) -> Any:
    """Replace ``${name}`` with saved values, recursively.

    :raises KeyError: a name that no earlier step saved.
    """
    if isinstance(value, str):
        whole = _VAR.fullmatch(value)
        if whole:
            return saved[whole.group(1)]
        return _VAR.sub(lambda m: str(saved[m.group(1)]), value)
    if isinstance(value, dict):
        return {k: substitute(v, saved) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, saved) for v in value]
    return value


def lookup(body: Any, path: str) -> Any:
    """The value at a dotted path (``operation.receipt``, ``items.0.state``)."""
    for part in path.split("."):
        body = body[int(part)] if isinstance(body, list) else body[part]
    return body


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
        saved: dict[str, Any] = {}
        try:
            for i, step in enumerate(scenario.steps):
                if step.advance_s is not None:
                    now[0] += step.advance_s
                    yield StepResult(i, step, None, None, [])
                    continue
                try:
                    yield _request(app, i, step, saved, now)
                except KeyError as exc:
                    yield StepResult(i, step, None, None, [f"no saved value {exc}"])
        finally:
            app.extensions["loopstop"].store.close()


def _post(app: Flask, path: str, body: Any, _: int) -> Any:
    return app.test_client().post(path, json=body)


def _request(
    app: Flask, index: int, step: Step, saved: dict[str, Any], now: list[float]
) -> StepResult:
    answers = []
    for k in range(step.repeat or 1):
        if k:
            now[0] += step.every_s
        saved["i"] = k
        body = substitute(step.body if step.body is not None else {}, saved)
        if step.post is not None:
            path = substitute(step.post, saved)
            copies = step.concurrent or 1
            with ThreadPoolExecutor(copies) as pool:
                answers += list(pool.map(partial(_post, app, path, body), range(copies)))
        else:
            answers.append(app.test_client().get(substitute(step.get or "", saved)))
    resp = answers[-1]
    status, payload = resp.status_code, resp.get_json(silent=True)
    problems: list[str] = []
    expect = step.expect
    if expect is not None:
        bad = [a.status_code for a in answers if a.status_code != expect.status]
        if bad:
            problems.append(f"status: expected {expect.status}, got {bad}")
        if expect.json_ is not None:
            problems += mismatches(substitute(expect.json_, saved), payload)
        if expect.counts is not None:
            got = Counter(
                f"{a.get_json().get('decision')}/{a.get_json().get('reason')}" for a in answers
            )
            if dict(got) != expect.counts:
                problems.append(f"counts: expected {expect.counts}, got {dict(got)}")
    for name, where in step.save.items():
        try:
            saved[name] = lookup(payload, where)
        except (KeyError, IndexError, TypeError, ValueError):
            problems.append(f"save {name}: no value at {where}")
    return StepResult(index, step, status, payload, problems)

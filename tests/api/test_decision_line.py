"""The decision log line (DESIGN "Observability") reaches every handler as
configured: a plain ``%(message)s`` stream handler (``loopstop serve``'s) gets
the line as logging would write it; any other handler, format or filter gets
it through logging."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from conftest import Api, AppFactory

DECISIONS = logging.getLogger("loopstop.decisions")


@pytest.fixture
def decisions() -> Iterator[logging.Logger]:
    saved = (DECISIONS.handlers[:], DECISIONS.level, DECISIONS.propagate)
    DECISIONS.handlers.clear()
    DECISIONS.setLevel(logging.INFO)
    DECISIONS.propagate = False
    try:
        yield DECISIONS
    finally:
        DECISIONS.handlers[:], DECISIONS.level, DECISIONS.propagate = (
            saved[0],
            saved[1],
            saved[2],
        )


def _handler(fmt: str) -> tuple[logging.StreamHandler[io.StringIO], io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(fmt))
    return handler, stream


def test_plain_handler_gets_the_line_itself(
    make_app: AppFactory, decisions: logging.Logger
) -> None:
    handler, stream = _handler("%(message)s")
    decisions.addHandler(handler)
    Api(make_app().test_client()).begin("op-line", {"n": 1}, workflow="wf-a")
    (line,) = stream.getvalue().splitlines()
    doc = json.loads(line)
    assert stream.getvalue() == line + "\n"
    assert doc["event"] == "decision" and doc["route"] == "operations.begin"
    assert doc["decision"] == "execute" and doc["operation_id"] == "op-line"
    assert {"ts", "request_id", "reason", "token", "method", "payload_fp", "workflow"} <= set(doc)


def test_other_formats_levels_and_filters_are_honoured(
    make_app: AppFactory, decisions: logging.Logger
) -> None:
    formatted, formatted_out = _handler("%(levelname)s %(name)s %(message)s")
    filtered, filtered_out = _handler("%(message)s")
    filtered.addFilter(lambda record: False)
    quiet, quiet_out = _handler("%(message)s")
    quiet.setLevel(logging.WARNING)
    for h in (formatted, filtered, quiet):
        decisions.addHandler(h)
    Api(make_app().test_client()).begin("op-fmt", {"n": 1}, workflow="wf-a")
    (line,) = formatted_out.getvalue().splitlines()
    assert line.startswith("INFO loopstop.decisions {")
    assert json.loads(line.split(" ", 2)[2])["operation_id"] == "op-fmt"
    assert filtered_out.getvalue() == quiet_out.getvalue() == ""


def test_below_info_nothing_is_written(make_app: AppFactory, decisions: logging.Logger) -> None:
    handler, stream = _handler("%(message)s")
    decisions.addHandler(handler)
    decisions.setLevel(logging.WARNING)
    Api(make_app().test_client()).begin("op-quiet", {"n": 1}, workflow="wf-a")
    assert stream.getvalue() == ""

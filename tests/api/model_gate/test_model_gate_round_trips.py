"""Store round trips per model turn, on the stores that have them (Redis,
PostgreSQL; SQLite is a file in the process): a turn's admission decides on
the task as this process last wrote it, checked by the compare-and-set, so it
costs one round trip, and so does the admission of the calls it proposes, or
the settle of its tokens."""

from __future__ import annotations

import pytest
from fake_llm import FakeLLM
from flask import Flask
from task_agent import Agent
from test_model_gate import ask, gate_app, llm

from conftest import Api, AppFactory

__all__ = ["llm"]


def _trips(app: Flask) -> float:
    registry = app.extensions["loopstop"].metrics.registry
    return registry.get_sample_value("loopstop_store_round_trips_total") or 0.0


@pytest.mark.all_stores
@pytest.mark.parametrize("mode", ["tool_call", "final"])
def test_a_turn_of_a_task_this_process_wrote_reads_nothing_first(
    make_app: AppFactory, store_url: str, llm: FakeLLM, mode: str
) -> None:
    """A turn that proposes a call: its admission and the call's, one round trip
    each; a turn that answers in text: its admission, then its tokens (a
    settle sent to a store that stalls is fenced: it never lands unseen)."""
    if store_url.startswith("sqlite"):
        pytest.skip("SQLite makes no round trips")
    app = gate_app(make_app, llm)
    api = Api(app.test_client())
    agent = Agent(api)
    llm.mode = mode
    assert ask(api, "chat", False, agent.id)[0] == 200  # the task is now this process's
    before = _trips(app)
    assert ask(api, "chat", False, agent.id)[0] == 200
    assert _trips(app) - before == 2

"""An activation decides on a guess: the keys this process knows as it last
saw them, the others absent (a new event, a new chain), the workflow's rate
counters checked at commit against the side of the limit the decision stood
on. A new event costs one store round trip; a guess that did not hold (a
duplicate delivery, another instance's counts past the limit) is decided
again on what the store answered, and never changes an answer."""

from __future__ import annotations

import pytest
from flask import Flask
from test_chains_api import activate

from conftest import Api, AppFactory, Clock

pytestmark = pytest.mark.all_stores

LIMITS = {"workflow_rate_limit": 5, "workflow_rate_window_s": 60, "rate_limit": 100}


def _trips(app: Flask) -> float:
    registry = app.extensions["loopstop"].metrics.registry
    return registry.get_sample_value("loopstop_store_round_trips_total") or 0.0


def test_a_new_event_is_one_round_trip(make_app: AppFactory, store_url: str) -> None:
    if store_url.startswith("sqlite"):
        pytest.skip("SQLite makes no round trips")
    app = make_app(chains={"default": LIMITS})
    api = Api(app.test_client())
    assert activate(api, event_key="first")["reason"] == "new_chain"
    before = _trips(app)
    assert activate(api, event_key="second", subject_key="s2")["reason"] == "new_chain"
    assert _trips(app) - before == 1


def test_two_instances_admit_no_more_than_the_workflow_rate_between_them(
    make_app: AppFactory, clock: Clock
) -> None:
    """Each instance counts the other's activations only through the store:
    its guess of the counters is checked against the limit at commit."""
    clock.now = 1_790_000_040.0  # the start of a window
    apis = [Api(make_app(chains={"default": LIMITS}).test_client()) for _ in range(2)]
    reasons = [activate(apis[i % 2], event_key=f"e{i}")["reason"] for i in range(8)]
    assert reasons == ["new_chain"] * 5 + ["workflow_rate"] * 3
    clock.now += 90  # half the previous window still counts: 5 * 0.5 = 2.5
    reasons = [activate(apis[i % 2], event_key=f"f{i}")["reason"] for i in range(4)]
    assert reasons == ["new_chain"] * 3 + ["workflow_rate"]


def test_a_delivery_another_instance_took_is_a_duplicate(make_app: AppFactory) -> None:
    first, second = (Api(make_app(chains={"default": LIMITS}).test_client()) for _ in range(2))
    assert activate(first, event_key="row-7", content={"v": 1})["reason"] == "new_chain"
    assert activate(second, event_key="row-7", content={"v": 1})["reason"] == "duplicate_event"
    assert activate(first, event_key="row-7", content={"v": 1})["reason"] == "duplicate_event"

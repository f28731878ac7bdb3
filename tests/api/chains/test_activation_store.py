"""Activations and their store. An activation decides on a guess (the keys
this instance last saw, the others absent), one round trip for a new event;
the workflow's rate counters, which other instances move, are checked at
commit against the side of the limit the decision stood on. Through two
instances on one store the rate is counted across both and a delivery one
took is a duplicate for the other; an activation answered 503 while the store
stalled admitted nothing, ever (its write is fenced); a counter that is not
a count fails closed."""

from __future__ import annotations

import os
import signal

import pytest
from flask import Flask
from test_chains_api import activate

from conftest import Api, AppFactory, Clock, store_server_pids
from sidecar.service import keys
from sidecar.store import Plan, Snapshot, Write, store_from_url

pytestmark = pytest.mark.all_stores

LIMITS = {"workflow_rate_limit": 5, "workflow_rate_window_s": 60, "rate_limit": 100}


def _trips(app: Flask) -> float:
    registry = app.extensions["loopstop"].metrics.registry
    return registry.get_sample_value("loopstop_store_round_trips_total") or 0.0


def test_a_new_event_is_one_round_trip(make_app: AppFactory, store_url: str) -> None:
    """It decides on a guess (the keys this instance last saw, the others
    absent; the rate counters checked against the limit at commit)."""
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
    """Each instance counts the other's activations only through the store."""
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


def test_an_activation_answered_503_admitted_nothing(
    make_app: AppFactory, store_url: str, request: pytest.FixtureRequest
) -> None:
    """The store stops answering (its processes paused) past the decision's
    deadline: the activation is a 503, and once the store answers again
    nothing of it is there: its redelivery (n8n's Retry On Fail) proceeds.
    A decision that sent its write before it heard from the store would see
    that write land late, and its redelivery dropped as a duplicate."""
    if store_url.startswith("sqlite"):
        pytest.skip("a SQLite file has no server to pause")
    api = Api(make_app(chains={"default": LIMITS}, store_timeout_s=1.0).test_client())
    assert activate(api, event_key="warm")["reason"] == "new_chain"  # connections open
    pids = store_server_pids(store_url, request)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        status, body = api.post(
            "/v1/activations", {"workflow": "wf-sheets", "event_key": "row-1", "content": {"v": 1}}
        )
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert status == 503, body
    again = activate(api, event_key="row-1", content={"v": 1})
    assert again["reason"] == "new_chain"


@pytest.mark.parametrize(
    "count",
    ["1000", True, -1000, 1.5, float("inf"), float("nan"), 10**400, None, [3]],
    ids=["string", "true", "negative", "fraction", "inf", "nan", "huge", "null", "list"],
)
@pytest.mark.parametrize("window", [-1, 0, 1])
def test_a_rate_counter_that_is_not_a_count_fails_closed(
    make_app: AppFactory, store_url: str, clock: Clock, count: object, window: int
) -> None:
    """A workflow's rate counter written by something else (a string, a
    negative, a fraction, a number past any count): the activation is a
    503 that admits nothing, never a 500 and never past the limit."""
    clock.now = 1_790_000_040.0
    api = Api(make_app(chains={"default": LIMITS}).test_client())
    key = keys.workflow_rate(keys.namespace("production"), "wf-sheets", 29_833_334 + window)
    assert int(clock.now // 60) == 29_833_334
    store = store_from_url(store_url)
    try:

        def damage(snap: Snapshot) -> Plan[None]:
            snap.get(key)
            return Plan(None, {key: Write({"count": count}, 600)})

        store.transact([key], damage)
    finally:
        store.close()
    status, body = api.post("/v1/activations", {"workflow": "wf-sheets", "event_key": "e"})
    assert status == 503, body
    assert body["type"].endswith("store-unavailable")

"""Liveness, readiness, the OpenAPI document and request ids."""

from __future__ import annotations

import pytest
from flask import Flask
from openapi_spec_validator import validate

from conftest import ADMIN_TOKEN, Api, AppFactory


@pytest.mark.all_stores  # the backend /readyz names
def test_healthz_and_readyz(api: Api, store_url: str) -> None:
    assert api.get("/healthz", token=None) == (200, {"status": "ok"})
    status, body = api.get("/readyz", token=None)
    assert status == 200 and body["status"] == "ready"
    assert body["store"]["backend"] == store_url.split(":")[0]


@pytest.mark.all_stores  # a backend-specific warning
def test_redis_without_persistence_is_a_readiness_warning(api: Api, store_url: str) -> None:
    status, body = api.get("/readyz", token=None)
    if store_url.startswith("redis"):
        assert status == 200 and any("persistence" in w for w in body["store"]["warnings"])
    else:
        assert body["store"]["warnings"] == []


def test_openapi_document_is_valid_and_complete(api: Api) -> None:
    status, doc = api.get("/openapi.json", token=None)
    assert status == 200
    validate(doc)  # OpenAPI 3.1 meta-schema
    begin = doc["paths"]["/v1/operations/{operation_id}/begin"]["post"]
    assert begin["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "BeginBody"
    )
    assert set(begin["responses"]) >= {"200", "401", "403", "409", "422", "503"}
    decisions = doc["components"]["schemas"]["BeginDecision"]["enum"]
    assert set(decisions) == {
        "execute",
        "replay",
        "in_progress",
        "reconcile",
        "conflict",
        "exhausted",
        "stopped",
    }
    assert "payload" in doc["components"]["schemas"]["BeginBody"]["required"]


def test_request_id_is_echoed_or_made(make_app: AppFactory) -> None:
    client = make_app().test_client()
    r = client.get("/healthz", headers={"X-Request-Id": "n8n-exec-991"})
    assert r.headers["X-Request-Id"] == "n8n-exec-991"
    r = client.get("/healthz")
    assert len(r.headers["X-Request-Id"]) == 32


def test_no_tokens_means_loopback_only(make_app: AppFactory) -> None:
    client = make_app(tokens=False).test_client()
    r = client.get("/v1/whoami", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert r.status_code == 200 and r.get_json()["authenticated"] is False
    r = client.get("/v1/whoami", environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert r.status_code == 403 and r.mimetype == "application/problem+json"


def test_metrics_names_and_optional_protection(make_app: AppFactory) -> None:
    api = Api(make_app().test_client())
    api.begin("met-1", workflow="wf")
    api.post(
        "/v1/activations",
        {
            "workflow": "wf",
            "content": {"a": 1},
            "marker": "ls1.c00000000000000000000.1." + "0" * 32,
        },
    )
    text = api.client.get("/metrics").get_data(as_text=True)
    for name in (
        "loopstop_decisions_total",
        "loopstop_decision_seconds_bucket",
        "loopstop_invalid_markers_total",
        "loopstop_operations_awaiting_reconciliation",
        "loopstop_task_envelopes_total",
        "loopstop_store_errors_total",
        "loopstop_model_turns_total",
        "loopstop_model_tokens_total",
    ):
        assert name in text, name
    protected = make_app(
        http={"metrics_token_env": "METRICS_TOKEN"},
        environ={"METRICS_TOKEN": "scrape-0123456789abcdef"},
    ).test_client()
    assert protected.get("/metrics").status_code == 401
    ok = protected.get("/metrics", headers={"Authorization": "Bearer scrape-0123456789abcdef"})
    assert ok.status_code == 200


def test_metric_labels_stay_bounded(make_app: AppFactory) -> None:
    """An operator's free-text stop reason is logged, but never becomes a metric label."""
    api = Api(make_app().test_client())
    api.post(
        "/v1/workflows/wf/stop",
        {"reason": "order ORD-555 customer ana@example.com"},
        token=ADMIN_TOKEN,
    )
    r = api.client.get("/metrics")
    text = r.get_data(as_text=True)
    assert "ana@example.com" not in text
    assert 'reason="other",route="workflows.stop"' in text
    assert r.headers["Content-Type"].count("charset") == 1


def _sample_sum(app: Flask, name: str) -> float:
    """The sum of a counter's samples over its labels, as this app's /metrics shows it."""
    text = app.test_client().get("/metrics").get_data(as_text=True)
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((f"{name}{{", f"{name} "))
    )


@pytest.mark.all_stores  # each store reports its round trips to the app that built it
def test_two_apps_in_one_process_count_apart(make_app: AppFactory, store_url: str) -> None:
    """Metrics are built by create_app, each app on a registry of its own: a decision
    (and its store's round trips) is counted by the app that made it only."""
    first, second = make_app(), make_app()
    assert first.extensions["loopstop"].metrics is not second.extensions["loopstop"].metrics

    def trips(app: Flask) -> float:  # read from the registry: a scrape makes round trips
        registry = app.extensions["loopstop"].metrics.registry
        return registry.get_sample_value("loopstop_store_round_trips_total") or 0.0

    first_trips, second_trips = trips(first), trips(second)
    Api(first.test_client()).begin("count-apart", workflow="wf")
    if not store_url.startswith("sqlite"):  # SQLite has no round trips to count
        assert trips(first) > first_trips
    assert trips(second) == second_trips
    assert _sample_sum(first, "loopstop_decisions_total") == 1
    assert _sample_sum(second, "loopstop_decisions_total") == 0

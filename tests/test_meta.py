"""Liveness, readiness, the OpenAPI document and request ids."""

from __future__ import annotations

from openapi_spec_validator import validate

from conftest import Api, AppFactory


def test_healthz_and_readyz(api: Api, store_url: str) -> None:
    assert api.get("/healthz", token=None) == (200, {"status": "ok"})
    status, body = api.get("/readyz", token=None)
    assert status == 200 and body["status"] == "ready"
    assert body["store"]["backend"] == store_url.split(":")[0]


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

"""Authentication failures are logged and counted, and the metrics token is compared over
digests (first hardening, item 15)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from flask import Flask

from conftest import N8N_TOKEN, Api, AppFactory

AUTH = {"Authorization": f"Bearer {N8N_TOKEN}"}
EVIL = "http://evil.example"


def begin(api: Api, op_id: str, **fields: Any) -> dict[str, Any]:
    return api.begin(op_id, {"x": 1}, **fields)


pytestmark = pytest.mark.security


# -- 15. authentication failures are logged and counted --------------------------


def _failures(app: Flask, reason: str) -> float:
    registry = app.extensions["loopstop"].metrics.registry
    return registry.get_sample_value("loopstop_auth_failures_total", {"reason": reason}) or 0.0


def test_auth_failures_are_logged_and_counted(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    client = app.test_client()
    before = _failures(app, "unauthenticated"), _failures(app, "foreign-origin")
    with caplog.at_level(logging.WARNING, logger="loopstop"):
        r = client.get("/v1/whoami", headers={"Authorization": "Bearer wrong-token-00000000"})
        assert r.status_code == 401
        r = client.get("/v1/whoami", headers={**AUTH, "Origin": EVIL})
        assert r.status_code == 403
    assert _failures(app, "unauthenticated") == before[0] + 1
    assert _failures(app, "foreign-origin") == before[1] + 1
    lines = [m for m in caplog.messages if "authentication refused" in m]
    assert any("/v1/whoami" in m and "127.0.0.1" in m for m in lines)
    assert not any("wrong-token" in m for m in caplog.messages)  # never the value


def test_metrics_token_is_compared_over_digests(make_app: AppFactory) -> None:
    app = make_app(
        http={"metrics_token_env": "METRICS_TOKEN"},
        environ={"METRICS_TOKEN": "metrics-0123456789"},
    )
    client = app.test_client()
    for given in ("", "metrics-0123456788", "metrics-0123456789x", "m"):
        r = client.get("/metrics", headers={"Authorization": f"Bearer {given}"})
        assert r.status_code == 401
    r = client.get("/metrics", headers={"Authorization": "Bearer metrics-0123456789"})
    assert r.status_code == 200 and b"loopstop_auth_failures_total" in r.data

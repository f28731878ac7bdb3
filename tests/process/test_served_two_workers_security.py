"""``loopstop serve --workers 2``: rounds of 40 concurrent begins of one id, each
round's attempt failed by whichever worker answers; one execute per round, and
every decision line complete."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from served import Sidecar, tokens_yaml, write_config

from conftest import N8N_TOKEN, TOKENS_ENV, empty_store_url

pytestmark = [pytest.mark.slow, pytest.mark.all_stores, pytest.mark.security]


@pytest.fixture
def served(tmp_path, store_kind: str, request: pytest.FixtureRequest) -> Iterator[Sidecar]:  # type: ignore[no-untyped-def]
    config = write_config(tmp_path / "loopstop.yaml", tokens_yaml())
    env = {
        **TOKENS_ENV,
        "LOOPSTOP_STORE": empty_store_url(store_kind, tmp_path, request),
        "LOOPSTOP_CONFIG": str(config),
    }
    s = Sidecar(tmp_path, env, workers=2).start()
    yield s
    s.stop()


def test_rounds_of_begins_on_two_workers(served: Sidecar) -> None:
    headers = {"Authorization": f"Bearer {N8N_TOKEN}"}
    base = served.base
    for round_ in range(3):
        barrier = threading.Barrier(40)

        def one(_: int, barrier: threading.Barrier = barrier) -> str:
            with requests.Session() as s:
                barrier.wait()
                r = s.post(
                    f"{base}/v1/operations/op/begin",
                    json={"payload": {"x": 1}},
                    headers=headers,
                    timeout=30,
                )
                assert r.status_code == 200, r.text
                return str(r.json()["decision"])

        with ThreadPoolExecutor(40) as pool:
            decisions = list(pool.map(one, range(40)))
        assert decisions.count("execute") == 1, (round_, decisions)
        for _ in range(3):  # the fail lands on either worker
            r = requests.post(
                f"{base}/v1/operations/op/fail",
                json={"attempt": round_ + 1, "outcome": "not_committed"},
                headers=headers,
                timeout=30,
            )
        assert r.status_code in (200, 409), r.text
    served.stop()
    lines = [json.loads(x) for x in served.log.read_text().splitlines() if x.startswith("{")]
    begins = [x for x in lines if x.get("route") == "operations.begin"]
    assert len(begins) == 120
    for x in begins:
        assert {
            "ts",
            "request_id",
            "route",
            "decision",
            "reason",
            "token",
            "method",
            "operation_id",
            "payload_fp",
            "latency_ms",
        } <= set(x), x

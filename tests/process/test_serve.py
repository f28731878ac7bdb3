"""``loopstop serve`` for real: gunicorn with 4 worker processes over HTTP."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from served import Sidecar, tokens_yaml, write_config

from conftest import N8N_TOKEN, TOKENS_ENV, empty_store_url

pytestmark = [pytest.mark.slow, pytest.mark.all_stores]  # races across workers, per store


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, store_kind: str, request: pytest.FixtureRequest
) -> Iterator[Sidecar]:
    """One ``loopstop serve`` (4 workers) per store for this module's tests: each uses
    its own ids and workflows and reads the metrics as differences, so they share it."""
    folder = tmp_path_factory.mktemp(f"served-{store_kind}")
    config = write_config(folder / "loopstop.yaml", tokens_yaml())
    env = {
        **TOKENS_ENV,
        "LOOPSTOP_STORE": empty_store_url(store_kind, folder, request),
        "LOOPSTOP_CONFIG": str(config),
    }
    s = Sidecar(folder, env).start()
    yield s
    s.stop()


def race(base: str, op_id: str, n: int, payload: Any, headers: dict[str, str]) -> Counter[str]:
    barrier = threading.Barrier(n)

    def one(_: int) -> str:
        with requests.Session() as session:
            barrier.wait()
            r = session.post(
                f"{base}/v1/operations/{op_id}/begin",
                json={"payload": payload},
                headers=headers,
                timeout=30,
            )
            assert r.status_code == 200, r.text
            return str(r.json()["decision"])

    with ThreadPoolExecutor(n) as pool:
        return Counter(pool.map(one, range(n)))


def test_race_32_clients_across_4_workers_exactly_one_execute(served: Sidecar) -> None:
    headers = {"Authorization": f"Bearer {N8N_TOKEN}"}
    for round_ in range(3):
        got = race(served.base, f"race-{round_}", 32, {"order": round_}, headers)
        print(f"race round {round_}: {dict(got)}")
        assert got == Counter({"execute": 1, "in_progress": 31})


def test_no_configuration_four_workers_one_execute_then_replay_after_restart(
    tmp_path: Path,
) -> None:
    """The embedded default: no file, no tokens, no secret given."""
    s = Sidecar(tmp_path, {}).start()
    try:
        got = race(s.base, "welcome-mail-7", 50, {"to": "a@example.com", "n": 1}, {})
        print(f"no-config race: {dict(got)}")
        assert got == Counter({"execute": 1, "in_progress": 49})
        secret = tmp_path / "loopstop.secret"
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        assert (tmp_path / "loopstop.db").exists()
        r = requests.post(
            f"{s.base}/v1/operations/welcome-mail-7/commit",
            json={"attempt": 1, "receipt": {"message_id": "<m1@x>"}},
            timeout=5,
        )
        assert r.status_code == 200
    finally:
        s.stop()
    s = Sidecar(tmp_path, {}).start()
    try:
        r = requests.post(
            f"{s.base}/v1/operations/welcome-mail-7/begin",
            json={"payload": {"n": 1.0, "to": "a@example.com"}},
            timeout=5,
        )
        assert r.json()["decision"] == "replay"
        assert r.json()["operation"]["receipt"] == {"message_id": "<m1@x>"}
    finally:
        s.stop()


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], **(env or {})},
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("bind", ["0.0.0.0:0", "192.0.2.1:8765", "example.com:80"])
def test_serve_refuses_public_bind_without_tokens(tmp_path: Path, bind: str) -> None:
    out = run_cli("serve", "--bind", bind, cwd=tmp_path)
    assert out.returncode == 2
    assert "refusing to bind" in out.stderr and "tokens" in out.stderr


def test_serve_refuses_bad_config_file(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "bad.yaml", "limits:\n  max_tool_calls: -1\n")
    out = run_cli("serve", cwd=tmp_path, env={"LOOPSTOP_CONFIG": str(cfg)})
    assert out.returncode == 2 and "limits.max_tool_calls" in out.stderr
    assert not (tmp_path / "loopstop.db").exists()


def test_ten_concurrent_deliveries_across_workers_one_proceed(served: Sidecar) -> None:
    """A provider re-sends a slow webhook while the first execution still runs."""
    headers = {"Authorization": f"Bearer {N8N_TOKEN}"}
    item = {
        "headers": {"x-delivery": "1"},
        "params": {},
        "query": {},
        "body": {"id": "evt_77", "type": "order.updated"},
    }
    barrier = threading.Barrier(10)

    def deliver(i: int) -> str:
        event = {**item, "headers": {"x-delivery": str(i)}}
        with requests.Session() as session:
            barrier.wait()
            r = session.post(
                f"{served.base}/v1/activations",
                headers=headers,
                timeout=30,
                json={"workflow": "wf-shop", "event_key": "evt_77", "event": event},
            )
            assert r.status_code == 200, r.text
            return f"{r.json()['decision']}/{r.json()['reason']}"

    with ThreadPoolExecutor(10) as pool:
        got = Counter(pool.map(deliver, range(10)))
    print(f"10 concurrent deliveries: {dict(got)}")
    assert got == Counter({"proceed/new_chain": 1, "drop/duplicate_event": 9})


def test_ten_copies_of_120_events_give_exactly_120_proceeds(served: Sidecar) -> None:
    """The bar n8n's Remove Duplicates node sets: 752 side effects for 120 events."""
    headers = {"Authorization": f"Bearer {N8N_TOKEN}"}
    jobs = [(e, c) for e in range(120) for c in range(10)]

    def deliver(job: tuple[int, int]) -> str:
        event, _copy = job
        r = requests.post(
            f"{served.base}/v1/activations",
            headers=headers,
            timeout=30,
            json={
                "workflow": "wf-dedupe",
                "event_key": f"evt-{event}",
                "subject_key": f"customer-{event}",
                "content": {"id": event, "kind": "order"},
            },
        )
        assert r.status_code == 200, r.text
        return str(r.json()["decision"])

    with ThreadPoolExecutor(32) as pool:
        got = Counter(pool.map(deliver, jobs))
    print(f"10 copies of 120 events: {dict(got)}")
    assert got == Counter({"proceed": 120, "drop": 1080})


def test_chunked_body_over_the_limit_is_413_not_truncated(served: Sidecar) -> None:
    headers = {"Authorization": f"Bearer {N8N_TOKEN}", "Content-Type": "application/json"}
    valid = b'{"payload": "' + b"x" * (262_144 - 16) + b'"}'
    assert len(valid) == 262_144 - 16 + 15

    def chunks(data: bytes) -> Iterator[bytes]:
        for i in range(0, len(data), 8192):
            yield data[i : i + 8192]

    r = requests.post(
        f"{served.base}/v1/operations/chunk-1/begin",
        headers=headers,
        data=chunks(valid + b" " * 5000),
        timeout=30,
    )
    assert r.status_code == 413 and r.headers["Content-Type"] == "application/problem+json"
    r = requests.get(f"{served.base}/v1/operations/chunk-1", headers=headers, timeout=5)
    assert r.status_code == 404
    r = requests.post(
        f"{served.base}/v1/operations/chunk-2/begin",
        headers=headers,
        data=chunks(b'{"payload": {"small": true}}'),
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["decision"] == "execute"


def test_tool_budget_holds_across_workers(served: Sidecar) -> None:
    headers = {"Authorization": f"Bearer {N8N_TOKEN}"}
    r = requests.post(
        f"{served.base}/v1/tasks",
        headers=headers,
        timeout=10,
        json={"workflow": "wf-agent", "limits": {"max_tool_calls": 5}},
    )
    task_id = r.json()["task"]["task_id"]
    barrier = threading.Barrier(24)

    def admit(i: int) -> str:
        with requests.Session() as session:
            barrier.wait()
            r = session.post(
                f"{served.base}/v1/tasks/{task_id}/tool-calls",
                headers=headers,
                json={"tool": "search", "kind": "read", "args": {"q": i}},
                timeout=30,
            )
            assert r.status_code == 200, r.text
            return str(r.json()["decision"])

    with ThreadPoolExecutor(24) as pool:
        got = Counter(pool.map(admit, range(24)))
    print(f"24 concurrent admissions, budget 5: {dict(got)}")
    assert got == Counter({"execute": 5, "deny": 19})


def _decisions(text: str, label: str) -> float:
    """The sum of ``loopstop_decisions_total`` over the series with ``label`` (``k="v"``)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("loopstop_decisions_total{") and label in line
    )


def test_metrics_count_every_decision_across_four_workers(served: Sidecar) -> None:
    """200 begins over 10 ids add 200 decisions and 10 executes to what /metrics
    shows (the server may have decided before: the difference is counted)."""
    headers = {"Authorization": f"Bearer {N8N_TOKEN}"}
    before = requests.get(f"{served.base}/metrics", timeout=10).text

    def begin(i: int) -> None:
        r = requests.post(
            f"{served.base}/v1/operations/m-{i % 10}/begin",
            headers=headers,
            json={"payload": {"i": i % 10}},
            timeout=30,
        )
        assert r.status_code == 200

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(begin, range(200)))
    text = requests.get(f"{served.base}/metrics", timeout=10).text
    begins = 'route="operations.begin"'
    total = _decisions(text, begins) - _decisions(before, begins)
    print(f"decisions counted by /metrics over 4 workers: {total:.0f} of 200")
    assert total == 200
    executes = 'decision="execute"'
    assert _decisions(text, executes) - _decisions(before, executes) == 10  # 10 distinct ids
    assert "loopstop_operations_awaiting_reconciliation" in text

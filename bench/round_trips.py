"""Redis round trips and commands per decision, on each hot path.

    .venv/bin/python bench/round_trips.py [--time 300]

Runs the sidecar in process (Flask's test client) on a private redis-server
and prints, for each hot path, the round trips the store made (its own
``loopstop_store_round_trips_total``) and the commands Redis ran (``INFO
commandstats`` deltas, a script's own ``GET``/``SET``/``ZADD`` included), as
the median of a few repetitions. ``--time N`` also times each hot path over
N rounds (median and p90 microseconds, in process: no HTTP server, so two
builds of the sidecar compare without gunicorn's share of the noise).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import NOT_DECISIONS, SECRET, TOKEN, start_redis

from sidecar.app import create_app

CONFIG: dict[str, Any] = {
    "tokens": [{"name": "bench", "env": "BENCH_TOKEN", "workflows": ["*"], "admin": True}],
    "operations": {"retention_s": 3600},
    "chains": {
        "default": {
            "rate_limit": 1_000_000,
            "workflow_rate_limit": 1_000_000,
            "max_activations": 1_000_000,
        }
    },
}
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(
        int(v["calls"])
        for k, v in stats.items()
        if k.removeprefix("cmdstat_").split("|")[0] not in NOT_DECISIONS
    )


def one_round(
    post: Callable[[str, dict[str, Any]], dict[str, Any]],
    measure: Callable[[str, Callable[[], Any]], None],
) -> None:
    """Each hot path once, on fresh ids."""
    op = "op-" + uuid.uuid4().hex[:12]
    begin = {"payload": {"n": 1}, "workflow": "bench"}
    measure("begin (new id)", lambda: post(f"/operations/{op}/begin", begin))
    measure(
        "begin (replay, in progress)",
        lambda: post(f"/operations/{op}/begin", begin),
    )
    measure(
        "commit",
        lambda: post(
            f"/operations/{op}/commit",
            {"attempt": 1, "workflow": "bench", "receipt": {"id": op}},
        ),
    )
    measure(
        "begin (replay, committed)",
        lambda: post(f"/operations/{op}/begin", begin),
    )
    key = "evt-" + uuid.uuid4().hex[:12]
    event = {"workflow": "bench", "event_key": key, "content": {"id": key, "v": 1}}
    first: dict[str, Any] = {}
    measure("activation (new)", lambda: first.update(post("/activations", event)))
    measure("activation (duplicate)", lambda: post("/activations", event))
    post(
        "/effects",
        {
            "workflow": "bench",
            "chain_id": first["chain_id"],
            "target_key": key + "-row",
            "content": {"id": key, "v": 2},
        },
    )
    echo = {"workflow": "bench", "event_key": key + "-row", "content": {"id": key, "v": 2}}
    measure("activation (echo)", lambda: post("/activations", echo))
    task = post("/tasks", {"workflow": "bench"})["task"]["task_id"]
    call: dict[str, Any] = {}
    measure(
        "tool call admission",
        lambda: call.update(
            post(
                f"/tasks/{task}/tool-calls",
                {"tool": "search", "kind": "read", "args": {"q": task}},
            )
        ),
    )
    measure(
        "tool call result",
        lambda: post(
            f"/tasks/{task}/tool-calls/{call['call_id']}/result",
            {"status": "ok", "result": {"n": 1}},
        ),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description="round trips and commands per hot path (Redis)")
    ap.add_argument("--time", type=int, default=0, metavar="N", help="also time N rounds")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="loopstop-rtt-"))
    server, port, client = start_redis(tmp)
    try:
        url = f"redis://127.0.0.1:{port}/0"
        env = {"LOOPSTOP_SECRET": SECRET, "BENCH_TOKEN": TOKEN, "LOOPSTOP_STORE": url}
        app = create_app({**CONFIG, "store": url}, environ=env)
        http = app.test_client()
        registry = app.extensions["loopstop"].metrics.registry

        def round_trips() -> float:
            return registry.get_sample_value("loopstop_store_round_trips_total") or 0.0

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            r = http.post("/v1" + path, json=body, headers=HEADERS)
            assert r.status_code < 300, (path, r.status_code, r.get_data(as_text=True))
            out: dict[str, Any] = r.get_json()
            return out

        def count(step: Callable[[], Any]) -> tuple[float, float]:
            trips0 = round_trips()
            calls0 = commands(client)
            step()
            return round_trips() - trips0, commands(client) - calls0

        rows: dict[str, list[tuple[float, float]]] = {}

        def measure(name: str, step: Callable[[], Any]) -> None:
            rows.setdefault(name, []).append(count(step))

        for _ in range(5):
            one_round(post, measure)
        timed: dict[str, list[float]] = {}

        def clock(name: str, step: Callable[[], Any]) -> None:
            started = time.perf_counter()
            step()
            timed.setdefault(name, []).append((time.perf_counter() - started) * 1e6)

        for _ in range(args.time):
            one_round(post, clock)
        head = f"{'hot path':<30} {'round trips':>11} {'commands':>9}"
        print(head + (f" {'p50 us':>8} {'p90 us':>8}" if timed else ""))
        for name, counts in rows.items():
            trips = statistics.median(t for t, _ in counts)
            cmds = statistics.median(c for _, c in counts)
            line = f"{name:<30} {trips:>11.0f} {cmds:>9.0f}"
            if name in timed:
                cuts = statistics.quantiles(timed[name], n=10)
                line += f" {statistics.median(timed[name]):>8.0f} {cuts[8]:>8.0f}"
            print(line)
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

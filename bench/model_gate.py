"""What the model gate adds to a model turn, measured on this machine.

- non-streamed turns: the p50 / p90 of a turn through the gate (the app
  in-process on a SQLite store, forwarding over HTTP to the local fake
  upstream of ``workflows-examples/stand-in/model.py``) minus the p50 / p90 of the same request
  sent to the fake upstream directly, for both OpenAI APIs and Anthropic's
  Messages API, with and without a
  proposed tool call (which the gate admits through the task guard); a
  fresh task every 20 turns (the default ``max_model_calls``), and, for
  the tool call, also one task for every turn, whose growing call history
  each admission reads and writes;
- streamed turns: the first-token delay, from the moment the fake upstream
  writes its first text event to the moment the gate hands that event on,
  in process and through ``loopstop serve`` (gunicorn, one worker) over
  loopback HTTP, read as n8n's client reads a stream.

Beside each case, the floor of a turn on the same store: a Flask route that
reads and writes the task's document in one SQLite transaction (WAL,
``synchronous=FULL``, as the sidecar's store) and forwards the body to the
same upstream with ``requests``, nothing else (bench/floors.py's
``sql_work``); "vs floor" is the floor's added time over the gate's.

Run: ``.venv/bin/python bench/model_gate.py [turns]`` (default 400 per case).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fake_llm import serve
from flask import Flask, Response, request

from sidecar.app import create_app

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floors import sqlite_work

#: Turns per task: the default ``max_model_calls``, so a task's call history stays
#: the size a task under the default limits can reach (the "one task" rows keep
#: one task for every turn, its history growing past 400 calls).
TURNS_PER_TASK = 20

#: Task limits no benchmark run reaches: a turn is measured, never refused.
LIMITS = {
    "max_model_calls": 10**6,
    "max_tool_calls": 10**6,
    "max_same_call": 10**6,
    "max_cycle_repeats": 1000,
    "max_tokens": 10**10,
    "deadline_s": 86400,
}


def floor_app(folder: str, upstream: str) -> Flask:
    """A model turn's floor: one store transaction (the task read and
    written), then the body forwarded upstream and its answer returned."""
    work = sqlite_work(f"{folder}/floor.db")
    session = requests.Session()
    app = Flask("floor-model-gate")

    @app.post("/v1/openai/<path:path>")
    @app.post("/v1/anthropic/<path:path>", endpoint="anthropic")
    def turn(path: str) -> Response:
        body = request.get_json()
        work["task"]("t")
        base = upstream if request.path.startswith("/v1/openai/") else upstream.removesuffix("/v1")
        r = session.post(f"{base}/{path}", json=body, timeout=10)
        return Response(r.content, r.status_code, mimetype="application/json")

    return app


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


#: The APIs measured: OpenAI's two and Anthropic's Messages API.
APIS = ("chat", "responses", "messages")
#: Each API's route prefix at the gate (the stand-in serves both on one port).
PREFIX = {"chat": "/v1/openai", "responses": "/v1/openai", "messages": "/v1/anthropic"}


def _direct(llm: Any, api: str) -> str:
    """The stand-in's base for ``api`` (Anthropic's paths carry their own ``/v1``)."""
    return str(llm.root if api == "messages" else llm.base)


def _body(api: str, task_id: str, stream: bool = False) -> tuple[str, dict[str, Any]]:
    system = {"role": "system", "content": f"You are an agent.\nloopstop-task: {task_id}"}
    user = {"role": "user", "content": "Where is order ORD-7?"}
    if api == "messages":
        tools = [{"name": "lookup", "input_schema": {"type": "object"}}]
        body: dict[str, Any] = {
            "model": "m",
            "max_tokens": 1024,
            "system": system["content"],
            "messages": [user],
            "tools": tools,
        }
        path = "/v1/messages"
    elif api == "chat":
        tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
        body = {"model": "m", "messages": [system, user], "tools": tools}
        path = "/chat/completions"
    else:
        tools = [{"type": "function", "name": "lookup", "parameters": {}}]
        body = {"model": "m", "input": [{"type": "message", **system}, user], "tools": tools}
        path = "/responses"
    if stream:
        body["stream"] = True
    return path, body


def main(turns: int) -> None:
    with tempfile.TemporaryDirectory() as folder, serve() as llm:
        app = create_app(
            {
                "store": f"sqlite:///{folder}/bench.db",
                "limits": LIMITS,
                "model_gate": {
                    "upstream_url": llm.base,
                    "upstreams": {"anthropic": {"url": llm.root}},
                    "timeout_s": 10,
                },
            },
            environ={"LOOPSTOP_SECRET": "bench-secret-0123456789abcdef"},
            announce=False,
        )
        client = app.test_client()
        floor = floor_app(folder, llm.base).test_client()
        direct = requests.Session()
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"model gate, {turns} turns per case, SQLite store (synchronous=FULL), fake upstream "
            f"on loopback; load average {load} on {os.cpu_count()} CPUs"
        )
        print(
            f"{'case':34} {'upstream p50':>12} {'gate p50':>9} {'added p50':>10} {'added p90':>10}"
            f" {'floor added p50':>16} {'vs floor':>9}"
        )
        cases = [
            (api, mode, per_task)
            for api in APIS
            for mode, per_task in (
                ("final", TURNS_PER_TASK),
                ("tool_call", TURNS_PER_TASK),
                ("tool_call", None),
            )
        ]
        for api, mode, per_task in cases:
            llm.mode = mode
            own, through, floored = [], [], []
            for i in range(turns + 20):
                if i == 0 or (per_task is not None and i % per_task == 0):
                    task_id = client.post("/v1/tasks", json={}).get_json()["task"]["task_id"]
                    path, body = _body(api, task_id)
                t0 = time.perf_counter()
                r = direct.post(_direct(llm, api) + path, json=body, timeout=10)
                t1 = time.perf_counter()
                g = client.post(PREFIX[api] + path, json=body)
                t2 = time.perf_counter()
                f = floor.post(PREFIX[api] + path, json=body)
                t3 = time.perf_counter()
                assert r.status_code == 200 and g.status_code == 200, g.get_data()
                assert f.status_code == 200
                if i >= 20:  # warm-up excluded
                    own.append((t1 - t0) * 1000)
                    through.append((t2 - t1) * 1000)
                    floored.append((t3 - t2) * 1000)
            added = [b - a for a, b in zip(own, through, strict=True)]
            floor_added = [b - a for a, b in zip(own, floored, strict=True)]
            name = f"{api}, {'tool call admitted' if mode == 'tool_call' else 'text answer'}"
            if per_task is None:
                name = f"{api}, tool call, one task"
            print(
                f"{name:34} {_pct(own, 50):10.2f}ms {_pct(through, 50):7.2f}ms "
                f"{statistics.median(added):8.2f}ms {_pct(added, 90):8.2f}ms "
                f"{statistics.median(floor_added):14.2f}ms "
                f"{statistics.median(floor_added) / statistics.median(added):9.2f}"
            )
        llm.requests.clear()
        print()
        print(f"{'stream':34} {'first-token delay p50':>22} {'p90':>8} {'max':>8}")
        llm.mode = "final"
        for api in APIS:
            task_id = client.post("/v1/tasks", json={}).get_json()["task"]["task_id"]
            path, body = _body(api, task_id, stream=True)

            def send(path: str = PREFIX[api] + path, body: dict[str, Any] = body) -> Any:
                resp = client.post(path, json=body, buffered=False)
                try:
                    yield from resp.response
                finally:
                    resp.close()

            delays = _first_token_delay(send, llm, min(turns, 200))
            print(
                f"{api + ', in process':34} {statistics.median(delays):20.2f}ms "
                f"{_pct(delays, 90):6.2f}ms {max(delays):6.2f}ms"
            )
        served_streams(llm, folder, min(turns, 200))


def _first_token_delay(send: Any, llm: Any, rounds: int) -> list[float]:
    """Milliseconds from the upstream writing its first text event to ``send``'s
    iterator yielding the bytes that hold it, per round (the first 10 are warm-up)."""
    delays = []
    for i in range(rounds + 10):
        llm.first_text_at = None
        seen = b""
        arrived = None
        for chunk in send():
            seen += chunk
            if arrived is None and b"FINAL " in seen:
                arrived = time.perf_counter()
        assert arrived is not None and llm.first_text_at is not None
        if i >= 10:
            delays.append((arrived - llm.first_text_at) * 1000)
    return delays


def served_streams(llm: Any, folder: str, rounds: int) -> None:
    """The first-token delay through ``loopstop serve`` (gunicorn, one worker) over HTTP."""
    from served import Sidecar

    config = Path(folder) / "served.yaml"
    config.write_text(
        f"model_gate: {{upstream_url: '{llm.base}', timeout_s: 10,\n"
        f"             upstreams: {{anthropic: {{url: '{llm.root}'}}}}}}\n"
        "limits: {max_model_calls: 1000000, max_tokens: 10000000000}\n"
    )
    env = {
        "LOOPSTOP_CONFIG": str(config),
        "LOOPSTOP_STORE": f"sqlite:///{folder}/served.db",
        "LOOPSTOP_SECRET": "bench-secret-0123456789abcdef",
    }
    server = Sidecar(Path(folder), env, workers=1).start()
    try:
        session = requests.Session()
        for api in APIS:
            task = session.post(server.base + "/v1/tasks", json={}, timeout=10).json()
            path, body = _body(api, task["task"]["task_id"], stream=True)

            def send(path: str = PREFIX[api] + path, body: dict[str, Any] = body) -> Any:
                with session.post(server.base + path, json=body, stream=True, timeout=10) as r:
                    assert r.status_code == 200, r.text
                    yield from r.iter_content(chunk_size=None)

            delays = _first_token_delay(send, llm, rounds)
            print(
                f"{api + ', loopstop serve over HTTP':34} {statistics.median(delays):20.2f}ms "
                f"{_pct(delays, 90):6.2f}ms {max(delays):6.2f}ms"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 400)

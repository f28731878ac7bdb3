"""What the model gate adds to a non-streamed turn of Ollama and Azure OpenAI.

For each API, the median / p90 of a turn through the gate (the app in
process on a SQLite store, forwarding over HTTP to the local stand-in model
of ``workflows-examples/stand-in/model.py``) minus those of the same request
sent to the stand-in directly, with a text answer and with a proposed tool
call (admitted through the task guard); a fresh task every 20 turns (the
default ``max_model_calls``). See bench/model_gate.py for the OpenAI routes,
streams and the floor.

Run: ``.venv/bin/python bench/model_gate_apis.py [turns]`` (default 50 per case).
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

from sidecar.app import create_app

TURNS_PER_TASK = 20
WARM_UP = 10
API_VERSION = "2025-03-01-preview"


def _body(api: str, task_id: str) -> tuple[str, str, dict[str, Any]]:
    """The gate's path, the upstream's path and the body of one turn."""
    messages = [
        {"role": "system", "content": f"You are an agent.\nloopstop-task: {task_id}"},
        {"role": "user", "content": "Where is order ORD-7?"},
    ]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    if api == "ollama":
        body = {"model": "m", "messages": messages, "tools": tools, "stream": False}
        return "/v1/ollama/api/chat", "/api/chat", body
    path = f"/openai/deployments/dep/chat/completions?api-version={API_VERSION}"
    return "/v1/azure" + path, path, {"messages": messages, "tools": tools}


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


def main(turns: int) -> None:
    with tempfile.TemporaryDirectory() as folder, serve() as llm:
        limits = {"max_model_calls": 10**6, "max_same_call": 10**6, "max_tokens": 10**10}
        app = create_app(
            {
                "store": f"sqlite:///{folder}/bench.db",
                "limits": {**limits, "max_tool_calls": 10**6, "max_cycle_repeats": 1000},
                "model_gate": {
                    "timeout_s": 10,
                    "upstreams": {"ollama": {"url": llm.root}, "azure": {"url": llm.root}},
                },
            },
            environ={"LOOPSTOP_SECRET": "bench-secret-0123456789abcdef"},
            announce=False,
        )
        client = app.test_client()
        direct = requests.Session()
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"model gate, {turns} non-streamed turns per case, SQLite store, stand-in on "
            f"loopback; load average {load} on {os.cpu_count()} CPUs"
        )
        print(f"{'case':30} {'direct p50':>11} {'gate p50':>9} {'added p50':>10} {'added p90':>10}")
        for api in ("ollama", "azure"):
            for mode in ("final", "tool_call"):
                llm.mode = mode
                own, through = [], []
                for i in range(turns + WARM_UP):
                    if i % TURNS_PER_TASK == 0:
                        task_id = client.post("/v1/tasks", json={}).get_json()["task"]["task_id"]
                        gate_path, up_path, body = _body(api, task_id)
                    t0 = time.perf_counter()
                    r = direct.post(llm.root + up_path, json=body, timeout=10)
                    t1 = time.perf_counter()
                    g = client.post(gate_path, json=body)
                    t2 = time.perf_counter()
                    assert r.status_code == 200 and g.status_code == 200, g.get_data()
                    if i >= WARM_UP:
                        own.append((t1 - t0) * 1000)
                        through.append((t2 - t1) * 1000)
                added = [b - a for a, b in zip(own, through, strict=True)]
                name = f"{api}, {'tool call admitted' if mode == 'tool_call' else 'text answer'}"
                print(
                    f"{name:30} {statistics.median(own):9.2f}ms "
                    f"{statistics.median(through):7.2f}ms {statistics.median(added):8.2f}ms "
                    f"{_pct(added, 90):8.2f}ms"
                )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)

"""What the model gate adds to a Gemini turn, measured on this machine.

Non-streamed ``:generateContent`` turns: the median and p90 of a turn
through the gate (the app in-process on a SQLite store, forwarding over
HTTP to the stand-in model of ``workflows-examples/stand-in/model.py`` in
Gemini mode) minus those of the same request sent to the stand-in directly,
for a text answer and for a proposed call the gate admits (its history
carrying the earlier calls and outputs back, as n8n sends them, so each
turn also matches and records the outputs); a fresh task every 20 turns.

Run: ``.venv/bin/python bench/model_gate_gemini.py [turns]`` (default 50 per case).
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
MODEL = "gemini-2.5-flash"
PATH = f"/v1beta/models/{MODEL}:generateContent"


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def _body(key: str, calls: int) -> dict[str, Any]:
    """A turn of n8n's Gemini node after ``calls`` executed calls."""
    history: list[dict[str, Any]] = []
    for n in range(calls):
        args = {"q": "again", "id": f"00000000-0000-4000-8000-{n:012d}"}
        history.append(
            {"role": "model", "parts": [{"functionCall": {"name": "echo", "args": args}}]}
        )
        history.append(
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "echo", "response": {"result": f"r{n}"}}}],
            }
        )
    return {
        "generationConfig": {"stopSequences": []},
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "echo",
                        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                    }
                ]
            }
        ],
        "systemInstruction": {"role": "system", "parts": [{"text": f"loopstop-task-key: {key}"}]},
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}, *history],
    }


def main(turns: int) -> None:
    with tempfile.TemporaryDirectory() as folder, serve(api="gemini") as llm:
        app = create_app(
            {
                "store": f"sqlite:///{folder}/bench.db",
                "limits": {
                    "max_model_calls": 10**6,
                    "max_tool_calls": 10**6,
                    "max_same_call": 10**6,
                    "max_idle": 10**6,
                    "max_cycle_repeats": 1000,
                    "max_tokens": 10**10,
                    "deadline_s": 86400,
                },
                "model_gate": {"upstreams": {"gemini": {"url": llm.root}}, "timeout_s": 10},
            },
            environ={"LOOPSTOP_SECRET": "bench-secret-0123456789abcdef"},
            announce=False,
        )
        client = app.test_client()
        direct = requests.Session()
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"model gate, Gemini generateContent, {turns} turns per case, SQLite store, "
            f"stand-in upstream on loopback; load average {load} on {os.cpu_count()} CPUs"
        )
        print(
            f"{'case':30} {'upstream p50':>12} {'gate p50':>9} {'added p50':>10} {'added p90':>10}"
        )
        for mode in ("final", "tool_call"):
            llm.mode = mode
            own, through = [], []
            for i in range(turns + 10):
                key = f"bench-{mode}-{i // TURNS_PER_TASK}"
                calls = (i % TURNS_PER_TASK) if mode == "tool_call" else 0
                body = _body(key, calls)
                t0 = time.perf_counter()
                r = direct.post(llm.root + PATH, json=body, timeout=10)
                t1 = time.perf_counter()
                g = client.post("/v1/gemini" + PATH, json=body)
                t2 = time.perf_counter()
                assert r.status_code == 200 and g.status_code == 200, g.get_data()
                if i >= 10:  # warm-up excluded
                    own.append((t1 - t0) * 1000)
                    through.append((t2 - t1) * 1000)
            added = [b - a for a, b in zip(own, through, strict=True)]
            name = "tool call admitted" if mode == "tool_call" else "text answer"
            print(
                f"{name:30} {_pct(own, 50):10.2f}ms {_pct(through, 50):7.2f}ms "
                f"{statistics.median(added):8.2f}ms {_pct(added, 90):8.2f}ms"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)

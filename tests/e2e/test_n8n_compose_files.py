"""End to end: the Compose walk-through's own files, in a real n8n 2.41.1, without Docker.

``docs/getting-started.md`` ("With Docker Compose") brings up n8n, loopstop,
Redis and the examples' two stand-ins, runs ``loopstop-import-examples`` in
the n8n container, restarts n8n and calls two webhooks. No Docker engine
runs in CI, so this module runs the same pieces as processes: the script
``deploy/n8n/import-examples.sh`` itself with the n8n CLI on the session's
n8n (stopped for it, started again after: the restart), loopstop on
``deploy/loopstop.yaml`` (only the stand-in model's address moved from
``model:8791`` to a free loopback port), and the stand-ins by the commands
the compose file gives them. The script's workflow ids and webhook paths
are the shipped ones: no other module uses them in the session's n8n. The
self-call loop ends at its depth and the gate-only agent is ended by the
gate. Marked ``n8n``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

from conftest import free_port  # noqa: E402

from .n8n_runtime import N8n  # noqa: E402
from .shared import Sidecar, sidecar  # noqa: E402

pytestmark = pytest.mark.n8n

TOKEN = "compose-files-n8n-token-0123"
ADMIN = "compose-files-admin-token-0123"
STAND_IN = ROOT / "workflows-examples" / "stand-in"


@dataclass
class Stack:
    n8n: N8n
    sidecar: Sidecar
    records: str


def _stand_in(script: str, port: int) -> subprocess.Popen[str]:
    """A stand-in started as the compose file starts it (on loopback here)."""
    proc = subprocess.Popen(
        [sys.executable, str(STAND_IN / script), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert f"127.0.0.1:{port}" in proc.stdout.readline()  # listening
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, n8n_home: N8n) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("n8n-compose-files")
    with ExitStack() as stack:
        records_port, model_port = free_port(), free_port()
        stack.callback(_stop, _stand_in("records.py", records_port))
        stack.callback(_stop, _stand_in("model.py", model_port))
        shipped = (ROOT / "deploy" / "loopstop.yaml").read_text()
        assert "http://model:8791/v1" in shipped
        side = sidecar(
            work,
            shipped.replace("http://model:8791", f"http://127.0.0.1:{model_port}"),
            {"LOOPSTOP_TOKEN_N8N": TOKEN, "LOOPSTOP_TOKEN_ADMIN": ADMIN},
        ).start()
        stack.callback(side.stop)

        n8n = n8n_home
        n8n.stop()  # the walk-through imports, then restarts n8n
        records = f"http://127.0.0.1:{records_port}"
        env = {
            **n8n.env(n8n.broker_port + 1),  # the CLI's own task broker port, as cli() uses
            "LOOPSTOP_TOKEN_N8N": TOKEN,
            "LOOPSTOP_URL": side.base,
            "RECORDS_URL": records,
            "LOOPSTOP_EXAMPLES": str(ROOT / "workflows-examples"),
        }
        out = subprocess.run(
            ["sh", str(ROOT / "deploy" / "n8n" / "import-examples.sh")],
            cwd=n8n.home,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert "loopstop-gate-agent" in out.stdout  # it says what to call next
        n8n.start()
        yield Stack(n8n, side, records)


def test_the_self_call_loop_ends_at_its_depth(stack: Stack) -> None:
    r = stack.n8n.webhook("loopstop-self-call", {"run": "r1", "hop": 0})
    assert r.status_code == 200, r.text
    rows = stack.n8n.wait_settled("lsExSelfCall0001", 5, timeout=120)
    assert [row["status"] for row in rows] == ["success"] * 5
    time.sleep(3)  # a sixth would have started by now
    assert len(stack.n8n.executions("lsExSelfCall0001")) == 5


def test_the_gate_only_agent_is_ended_by_the_gate(stack: Stack) -> None:
    r = stack.n8n.webhook(
        "loopstop-gate-agent", {"ticket": "T-1", "question": "Add a note."}, timeout=180
    )
    assert r.status_code == 200, r.text
    assert r.json()["output"].startswith("[loopstop] This task has ended: partial (same_call)")
    task = requests.post(
        stack.sidecar.base + "/v1/tasks",
        json={"task_key": "lsExGateAgent001-T-1", "workflow": "lsExGateAgent001"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert task.status_code == 200, task.text  # the gate made it
    out = task.json()
    assert (out["envelope"]["status"], out["envelope"]["reason"]) == ("partial", "same_call")
    assert out["task"]["used"]["tool_calls"] == 2  # max_same_call: 2 (the default)

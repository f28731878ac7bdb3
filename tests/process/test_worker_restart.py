"""A worker that exits gracefully must leave the other workers serving."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from served import Sidecar, tokens_yaml, write_config

from conftest import N8N_TOKEN

pytestmark = pytest.mark.slow


@pytest.fixture
def served2(tmp_path: Path, sidecar_env: dict[str, str]) -> Iterator[Sidecar]:
    config = write_config(tmp_path / "loopstop.yaml", tokens_yaml())
    s = Sidecar(tmp_path, {**sidecar_env, "LOOPSTOP_CONFIG": str(config)}, workers=2).start()
    yield s
    s.stop()


def _workers(master: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_a_worker_exiting_gracefully_keeps_the_metrics_folder_and_requests_answer(
    served2: Sidecar,
) -> None:
    """gunicorn restarts a worker (SIGTERM to it, a reload, a timed-out worker):
    the inherited exit handler of ``serve`` must not remove the metric folder
    every worker writes to, or every later request is a 500."""
    assert served2.proc is not None
    headers = {"Authorization": f"Bearer {N8N_TOKEN}"}
    deadline = time.monotonic() + 30
    while len(before := _workers(served2.proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)  # ready once one worker answers; the other may still be forking
    assert len(before) == 2
    os.kill(before[0], signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = _workers(served2.proc.pid)
        if len(now) == 2 and before[0] not in now:
            break
        time.sleep(0.1)
    time.sleep(1)
    codes = [
        requests.post(
            f"{served2.base}/v1/operations/after-restart-{i}/begin",
            json={"payload": {"i": i}},
            headers=headers,
            timeout=10,
        ).status_code
        for i in range(8)
    ]
    assert codes == [200] * 8

"""Scenario tables as data: every file under tests/scenarios/ replays on both stores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar import replay

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.json"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path, store_url: str) -> None:
    scenario = replay.load(path)
    results = list(replay.run(scenario, store_url))
    assert len(results) == len(scenario.steps)
    failures = [f"step {r.index}: {m}" for r in results for m in r.mismatches]
    assert not failures, "\n".join(failures)


def test_replay_command_reports_a_mismatch(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"name": "wrong expectation", "steps": [{"post": "/v1/operations/o/begin",'
        ' "body": {"payload": 1}, "expect": {"json": {"decision": "replay"}}}]}'
    )
    run = [sys.executable, "-m", "sidecar", "replay", str(bad), *map(str, SCENARIOS)]
    out = subprocess.run(
        run,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": os.environ["PATH"]},
        cwd=tmp_path,
    )
    assert out.returncode == 1
    assert '$.decision: expected "replay", got "execute"' in out.stdout
    assert out.stdout.count("FAIL") == 1

"""Scenario tables as data: every file under tests/scenarios/ replays on every store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TESTS
from sidecar import replay

SCENARIOS = sorted((TESTS / "scenarios").glob("*.json"))


@pytest.mark.all_stores  # the trajectories replayed on every store
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path, store_url: str) -> None:
    scenario = replay.load(path)
    results = list(replay.run(scenario, store_url))
    assert len(results) == len(scenario.steps)
    failures = [f"step {r.index}: {m}" for r in results for m in r.mismatches]
    assert not failures, "\n".join(failures)


@pytest.mark.slow  # runs the CLI in a process
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


@pytest.mark.slow  # runs the CLI in a process
def test_replay_with_a_policy_file_tunes_limits(tmp_path: Path) -> None:
    """A captured incident replayed under looser limits no longer stops where it did."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("chains:\n  default: {max_depth: 10}\n")
    scenario = TESTS / "scenarios" / "webhook-calls-itself.json"
    run = [sys.executable, "-m", "sidecar", "replay", str(scenario)]
    env = {"PATH": os.environ["PATH"]}
    same = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert same.returncode == 0 and "drop/chain_depth depth=4" in same.stdout
    tuned = subprocess.run(
        [*run, "--policy", str(policy)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert tuned.returncode == 1 and "proceed/reentry depth=4" in tuned.stdout


@pytest.mark.slow  # runs the CLI in a process
def test_replay_prints_the_final_envelope() -> None:
    scenario = TESTS / "scenarios" / "task-global-budget-keeps-last-state.json"
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "replay", str(scenario)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": os.environ["PATH"]},
    )
    assert out.returncode == 0
    assert '"reason": "tool_budget"' in out.stdout.split("final envelope:")[1]

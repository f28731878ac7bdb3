"""What `loopstop serve` says when it cannot start, and what it names when it does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _serve(tmp_path: Path, port: int, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        env={
            **os.environ,
            "LOOPSTOP_STORE": f"sqlite:///{tmp_path / 'l.db'}",
            "LOOPSTOP_CONFIG": "",
            **env,
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_address_in_use_is_one_clear_line_and_exit_code_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _serve(tmp_path, port)
    assert out.returncode == 2, out.stderr
    assert f"127.0.0.1:{port} is in use" in out.stderr
    assert "loopstop: cannot listen:" in out.stderr
    assert "invalid configuration" not in out.stderr  # an address in use is not a config error
    assert "listening on" not in out.stderr


def test_the_start_line_names_the_configuration_file(tmp_path: Path) -> None:
    """A served process is stopped once its start line is out: it names the file it read."""
    config = tmp_path / "loopstop.yaml"
    config.write_text("limits: {max_same_call: 3}\n")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {
        **os.environ,
        "LOOPSTOP_STORE": f"sqlite:///{tmp_path / 'l.db'}",
        "LOOPSTOP_CONFIG": str(config),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        env=env,
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "listening on" in line:
                assert f"configuration {config}" in line
                break
        else:
            raise AssertionError("no start line")
    finally:
        proc.terminate()
        proc.communicate(timeout=30)

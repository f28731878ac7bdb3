"""A real ``loopstop serve`` (gunicorn) on a free loopback port, for the tests
that need the process: races across workers, slow clients, faults, n8n."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import requests

from conftest import TOKENS_CONFIG, free_port


class Sidecar:
    """A ``loopstop serve`` process on a free loopback port."""

    def __init__(
        self, cwd: Path, env: dict[str, str], workers: int = 4, extra: tuple[str, ...] = ()
    ) -> None:
        self.cwd = cwd
        self.env = env
        self.workers = workers
        self.extra = extra
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[str] | None = None
        self.log = cwd / f"serve-{self.port}.log"

    def start(self) -> Sidecar:
        env = {"PATH": os.environ["PATH"], **self.env}
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sidecar",
                    "serve",
                    "--bind",
                    f"127.0.0.1:{self.port}",
                    "--workers",
                    str(self.workers),
                    *self.extra,
                ],
                cwd=self.cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited: {self.log.read_text()[-2000:]}")
            try:
                if requests.get(self.base + "/readyz", timeout=5).status_code == 200:
                    return self
            except requests.RequestException:  # not listening yet, or a worker still booting
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"serve did not become ready: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def tokens_yaml() -> str:
    lines = ["tokens:"]
    for t in TOKENS_CONFIG:
        lines.append(f"  - name: {t['name']}")
        lines.append(f"    env: {t['env']}")
        lines.append(f"    workflows: {list(t['workflows'])}")
        lines.append(f"    admin: {str(t.get('admin', False)).lower()}")
    return "\n".join(lines) + "\n"

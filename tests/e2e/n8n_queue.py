"""n8n in queue mode for the end-to-end suite: a main, workers, PostgreSQL and Redis.

The main (``n8n start``) takes the webhooks and triggers and puts each
execution on a Bull queue in Redis; each worker (``n8n worker``) takes
executions from it and runs them; all of them share one PostgreSQL
database and one ``N8N_ENCRYPTION_KEY``. Settings n8n 2.41.1 needs for it,
beside those of :class:`~n8n_runtime.N8n`:

- ``EXECUTIONS_MODE=queue``, ``QUEUE_BULL_REDIS_HOST`` / ``_PORT`` / ``_DB``;
- ``DB_TYPE=postgresdb`` and ``DB_POSTGRESDB_HOST`` / ``_PORT`` /
  ``_DATABASE`` / ``_USER`` (the suite's private cluster trusts loopback);
- per process: a user folder (``N8N_USER_FOLDER``: the community node
  package must be installed in each, the workers run the node), a task
  runner broker port (``N8N_RUNNERS_BROKER_PORT``), and for a worker its
  health server (``QUEUE_HEALTH_CHECK_ACTIVE=true``,
  ``QUEUE_HEALTH_CHECK_PORT``, ``N8N_WORKER_SERVER_ADDRESS``), which answers
  ``/healthz/readiness`` once the worker takes jobs.

Which worker ran an execution is read from its log: a worker logs
``Worker started execution <id> (job <n>)`` at level info.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import requests

from .n8n_runtime import Install, N8n, terminate, unflatten

STARTED = re.compile(r"Worker started execution (\d+) \(job")


class QueueN8n(N8n):
    """The main of an n8n in queue mode (``n8n start``), on PostgreSQL and Redis.

    :param database: a libpq URL of n8n's database (``postgresql://user@host:port/db``).
    :param redis_port: the Bull queue's Redis on 127.0.0.1.
    """

    def __init__(
        self,
        install: Install,
        home: Path,
        port: int,
        broker_port: int,
        database: str,
        redis_port: int,
    ) -> None:
        super().__init__(install, home, port, broker_port)
        self.database_url = database
        self.redis_port = redis_port

    def env(self, broker_port: int | None = None) -> dict[str, str]:
        from urllib.parse import urlparse

        db = urlparse(self.database_url)
        return {
            **super().env(broker_port),
            "EXECUTIONS_MODE": "queue",
            "QUEUE_BULL_REDIS_HOST": "127.0.0.1",
            "QUEUE_BULL_REDIS_PORT": str(self.redis_port),
            "QUEUE_BULL_REDIS_DB": "0",
            "DB_TYPE": "postgresdb",
            "DB_POSTGRESDB_HOST": db.hostname or "127.0.0.1",
            "DB_POSTGRESDB_PORT": str(db.port or 5432),
            "DB_POSTGRESDB_DATABASE": db.path.lstrip("/"),
            "DB_POSTGRESDB_USER": db.username or "postgres",
            "DB_POSTGRESDB_PASSWORD": db.password or "",
            "EXECUTIONS_DATA_SAVE_ON_PROGRESS": "false",
            "N8N_GRACEFUL_SHUTDOWN_TIMEOUT": "5",
        }

    def workflow_exists(self, workflow_id: str) -> bool:
        with psycopg.connect(self.database_url) as db:
            row = db.execute("select 1 from workflow_entity where id = %s", (workflow_id,))
            return row.fetchone() is not None

    def executions(self, workflow_id: str) -> list[dict[str, Any]]:
        with psycopg.connect(self.database_url) as db:
            cur = db.execute(
                'select id, mode, status, finished from execution_entity where "workflowId" = %s'
                " order by id",
                (workflow_id,),
            )
            return [
                {"id": str(r[0]), "mode": r[1], "status": r[2], "finished": r[3]}
                for r in cur.fetchall()
            ]

    def run_data(self, execution_id: int | str) -> Any:
        with psycopg.connect(self.database_url) as db:
            row = db.execute(
                'select data from execution_data where "executionId" = %s', (int(execution_id),)
            ).fetchone()
        return unflatten(json.loads(row[0])) if row else None

    def worker(self, name: str, broker_port: int, health_port: int) -> N8nWorker:
        """A worker of this main: its own user folder (with this one's community
        packages copied in), broker port and health port."""
        home = self.home.parent / f"worker-{name}"
        nodes = self.home / ".n8n" / "nodes"
        if nodes.exists() and not (home / ".n8n" / "nodes").exists():
            shutil.copytree(nodes, home / ".n8n" / "nodes", symlinks=True)
        home.mkdir(parents=True, exist_ok=True)
        return N8nWorker(self, name, home, broker_port, health_port)


class N8nWorker:
    """One ``n8n worker`` process of a :class:`QueueN8n`."""

    def __init__(
        self, main: QueueN8n, name: str, home: Path, broker_port: int, health_port: int
    ) -> None:
        self.main = main
        self.name = name
        self.home = home
        self.broker_port = broker_port
        self.health_port = health_port
        self.log = home / "worker.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        return {
            **self.main.env(self.broker_port),
            "HOME": str(self.home),
            "N8N_USER_FOLDER": str(self.home),
            "QUEUE_HEALTH_CHECK_ACTIVE": "true",
            "QUEUE_HEALTH_CHECK_PORT": str(self.health_port),
            "N8N_WORKER_SERVER_ADDRESS": "127.0.0.1",
        }

    def start(self, concurrency: int = 20, timeout: float = 120) -> N8nWorker:
        """Start ``n8n worker`` and wait for its ``/healthz/readiness``.

        :raises RuntimeError: the worker exited or did not get ready in ``timeout`` s.
        """
        install = self.main.install
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(install.node), str(install.n8n), "worker", f"--concurrency={concurrency}"],
                cwd=self.home,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{self.health_port}/healthz/readiness"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"n8n worker exited: {self.log.read_text()[-3000:]}")
            try:
                if requests.get(url, timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass  # not listening yet
            time.sleep(0.25)
        raise RuntimeError(
            f"n8n worker not ready after {timeout} s: {self.log.read_text()[-3000:]}"
        )

    def started(self) -> list[str]:
        """The ids of the executions this worker logged it started, in order."""
        if not self.log.exists():
            return []
        return STARTED.findall(self.log.read_text(errors="replace"))

    def kill(self) -> None:
        """SIGKILL the worker and its task runner (nothing is cleaned up: a crash)."""
        if self.proc and self.proc.poll() is None:
            children = subprocess.run(
                ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
            ).stdout.split()
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            for child in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(child), signal.SIGKILL)

    def stop(self) -> None:
        terminate(self.proc)

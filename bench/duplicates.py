"""Duplicate deliveries through two loopstop instances on one PostgreSQL store, as
n8n in queue mode sends them (each copy an execution on some worker, each request
to either instance): every event is written once, and the logs stay quiet.

    .venv/bin/python bench/duplicates.py [--events 600] [--copies 10] [--clients 64]

Each copy is one guarded write: ``begin`` (with its own ``execution_id``) and,
when the answer is ``execute``, the write (counted here) and its ``commit``;
every request goes to a randomly chosen instance. The copies of an event are
sent together, so they race each other on the store. It starts a private
PostgreSQL cluster (``initdb`` into a temporary folder, fsync on, a free
loopback port; the server programs are found as the tests find them:
``LOOPSTOP_TEST_PG_BIN``, ``/usr/lib/postgresql/*/bin``, then PATH) and two
``loopstop serve`` instances (2 workers each, logging at the production
default, INFO), then prints the decisions, side effects per event, the
store's lost compare-and-sets (``loopstop_store_conflicts_total``) and every
log line at WARNING or above, and a traceback count. Exits 1 when an event
was written other than once or any instance logged a warning or a traceback.

It needs only loopstop installed (``./scripts/serve`` makes such a venv) and
PostgreSQL's server programs, not the test dependencies.
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from run import SECRET, TOKEN, free_port, wait_ready  # noqa: E402

CONFIG = """
tokens:
  - {name: bench, env: BENCH_TOKEN, workflows: ["*"], admin: true}
operations: {max_open_per_workflow: 1000000}
"""
NOISY = re.compile(r" (WARNING|ERROR|CRITICAL) |Traceback")


def pg_program(name: str) -> str:
    """A PostgreSQL server program (``initdb``, ``postgres``), found as the tests find it.

    :raises SystemExit: it is not installed.
    """
    folder = os.environ.get("LOOPSTOP_TEST_PG_BIN")
    candidates = [os.path.join(folder, name)] if folder else []
    candidates += sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    candidates += [found] if (found := shutil.which(name)) else []
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit(f"PostgreSQL's {name} is not installed (package postgresql)")


class Cluster:
    """A private PostgreSQL cluster on a free loopback port, fsync on, trusting loopback.

    As root the cluster belongs to ``nobody`` (``initdb`` refuses root).
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.user = "nobody" if os.geteuid() == 0 else None
        self.root = Path(tempfile.mkdtemp(prefix="loopstop-duplicates-pg-"))
        self.url = f"postgresql://loopstop@127.0.0.1:{self.port}/postgres"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Cluster:
        """Run ``initdb`` and ``postgres``; wait (30 s at most) until it takes connections."""
        data = str(self.root / "data")
        if self.user:
            os.chmod(self.root, 0o755)
            shutil.chown(self.root, self.user)
        quiet = subprocess.DEVNULL
        initdb = [pg_program("initdb"), "-D", data, "-U", "loopstop", "--auth=trust"]
        subprocess.run(
            [*initdb, "-E", "UTF8", "--locale=C", "--no-sync"],
            check=True,
            stdout=quiet,
            stderr=quiet,
            user=self.user,
        )
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.root),
            "fsync": "on",
            "max_connections": "400",
        }
        options = [arg for k, v in settings.items() for arg in ("-c", f"{k}={v}")]
        server = [pg_program("postgres"), "-D", data, "-p", str(self.port), *options]
        self.proc = subprocess.Popen(server, stdout=quiet, stderr=quiet, user=self.user)
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=1).close()
                return self
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("postgres did not start") from None
                time.sleep(0.1)

    def cleanup(self) -> None:
        """Stop the server (a fast shutdown) and remove the cluster."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(30)
        shutil.rmtree(self.root, ignore_errors=True)


def start(store: str, workdir: Path, workers: int) -> tuple[subprocess.Popen[bytes], str, Path]:
    """One ``loopstop serve`` logging to a file; returns (process, base URL, log)."""
    port = free_port()
    config = workdir / "loopstop.yaml"
    config.write_text(CONFIG)
    log = workdir / f"serve-{port}.log"
    env = {
        "PATH": os.environ["PATH"],
        "LOOPSTOP_CONFIG": str(config),
        "LOOPSTOP_STORE": store,
        "LOOPSTOP_SECRET": SECRET,
        "BENCH_TOKEN": TOKEN,
    }
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sidecar",
                "serve",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(workers),
            ],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/readyz", proc)
    return proc, base, log


def conflicts(bases: list[str]) -> float:
    """Lost compare-and-sets the instances counted (summed over their workers)."""
    total = 0.0
    for base in bases:
        text = requests.get(base + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("loopstop_store_conflicts_total "):
                total += float(line.split()[1])
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=600)
    ap.add_argument("--copies", type=int, default=10)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="gunicorn workers per instance")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="loopstop-duplicates-"))
    pg = Cluster().start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        started = [start(pg.url, tmp, args.workers) for _ in range(2)]
        procs = [p for p, _, _ in started]
        bases = [b for _, b, _ in started]
        logs = [log for _, _, log in started]
        before = {log: log.stat().st_size for log in logs}
        conflicts_before = conflicts(bases)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        local = threading.local()
        written: Counter[int] = Counter()
        lock = threading.Lock()

        def deliver(copy: tuple[int, int]) -> str:
            event, n = copy
            if not hasattr(local, "session"):
                local.session = requests.Session()
            session: requests.Session = local.session
            op = f"{args.events}x{args.copies}-order-{event}"
            body = {
                "workflow": "wf-crm",
                "payload": {"order": event},
                "execution_id": f"{event}{n:03d}",
            }
            r = session.post(
                f"{random.choice(bases)}/v1/operations/{op}/begin",
                json=body,
                headers=headers,
                timeout=60,
            )
            r.raise_for_status()
            answer = r.json()
            if answer["decision"] == "execute":
                with lock:
                    written[event] += 1  # the side effect
                c = session.post(
                    f"{random.choice(bases)}/v1/operations/{op}/commit",
                    json={
                        "workflow": "wf-crm",
                        "attempt": answer["operation"]["attempt"],
                        "receipt": {"id": f"crm-{event}"},
                        "execution_id": body["execution_id"],
                    },
                    headers=headers,
                    timeout=60,
                )
                c.raise_for_status()
            return str(answer["decision"])

        # The copies of one event sent side by side: they race each other.
        copies = [(e, n) for e in range(args.events) for n in range(args.copies)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            decisions = Counter(pool.map(deliver, copies))
        elapsed = time.perf_counter() - t0
        lost_cas = conflicts(bases) - conflicts_before
        noisy: list[str] = []
        for log in logs:
            with open(log, "rb") as f:
                f.seek(before[log])
                noisy += [
                    line
                    for line in f.read().decode(errors="replace").splitlines()
                    if NOISY.search(line)
                ]
        wrong = [e for e in range(args.events) if written[e] != 1]
        print(
            f"{args.events} events x {args.copies} copies through 2 instances "
            f"({args.workers} workers each) on PostgreSQL in {elapsed:.1f} s: "
            f"decisions {dict(decisions)}; side effects {sum(written.values())} "
            f"({len(wrong)} events not written exactly once); lost compare-and-sets "
            f"{lost_cas:.0f}; log lines at WARNING or above, or tracebacks: {len(noisy)}"
        )
        for line in noisy[:20]:
            print("  " + line)
        return 1 if wrong or noisy else 0
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
        pg.cleanup()


if __name__ == "__main__":
    sys.exit(main())

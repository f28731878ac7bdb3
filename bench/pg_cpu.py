"""CPU and wall time per request of the sidecar in process on PostgreSQL.

    .venv/bin/python bench/pg_cpu.py [--requests 600]

The sidecar's app (as ``bench/profile.py`` builds it: the decision log at INFO
to a discarded stream, prometheus in multiprocess mode) on the tests' private
PostgreSQL cluster (fsync on); each route's requests go through the WSGI
callable (``bench/parts.py``'s driver), and the figure is the best of three
rounds: the client's CPU (:func:`time.process_time`, the server's not counted)
and the wall time, per request, in microseconds. One process, so a guess on
what it last wrote always holds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600, help="requests per round")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="loopstop-pgcpu-"))
    (tmp / "prom").mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(tmp / "prom")
    import parts
    import run

    from conftest import PostgresServer

    pg = PostgresServer(fsync=True).start()
    try:
        app, make_tasks = parts._sidecar(pg.url, tmp)
        driver = parts.Driver(parts.Parts(), app, run.TOKEN, "s")
        driver.tasks = make_tasks(16)
        print(f"in process on PostgreSQL, load average {os.getloadavg()[0]:.1f}")
        for route in parts.ROUTES:
            driver.run(route, 200)
            cpu = wall = float("inf")
            for _ in range(3):
                c, w = time.process_time(), time.perf_counter()
                driver.run(route, args.requests)
                cpu = min(cpu, (time.process_time() - c) / args.requests * 1e6)
                wall = min(wall, (time.perf_counter() - w) / args.requests * 1e6)
            print(f"{route:<18} cpu {cpu:6.0f} us  wall {wall:6.0f} us")
    finally:
        pg.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

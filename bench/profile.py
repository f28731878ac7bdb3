"""Where a decision's time goes beyond its store's floor, per route, in
microseconds of CPU time per request, the sidecar's beside the floor's.

    .venv/bin/python bench/profile.py [--store redis] [--requests 2000]
    .venv/bin/python bench/profile.py --metrics-cost      # prometheus, per call
    .venv/bin/python bench/profile.py --sample [--duration 10]   # py-spy on gunicorn

By default it runs in process (``bench/parts.py``): the floor's app
(bench/floors.py) and the sidecar's (``create_app``, logging one decision
line per request to a discarded stream, prometheus in multiprocess mode as
under ``loopstop serve``) on the same private redis-server, each route's
requests sent through the WSGI callable, and each part's CPU time
(:func:`time.process_time`, so time waiting on the store is not counted)
split into parse, auth, validate, fingerprint, service, transaction, store
client, render, log, metrics and the framework's rest. CPU time is much less
sensitive to the machine's load than a throughput; it leaves out gunicorn's
HTTP parsing, which is the same on both sides. Its last line counts the
function calls per request (Python and C, :func:`parts.calls_per_request`),
which no load moves. ``PYTHONPATH=<another checkout>`` measures that
checkout's sidecar against the same floor.

``--sample`` is the older whole-server view: for each route it serves the
floor and then the sidecar, each with one gunicorn worker of ``loopstop
serve``'s class and settings, drives it with wrk (the routes' scripts of
bench/run.py) and samples the worker with py-spy (``--gil``: only the thread
holding the interpreter). Each sample is given to the innermost frame that
belongs to one of :data:`PARTS` (a ``json`` call counts for whoever made it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # bench/run.py: servers, wrk, the routes' scripts

#: (part, patterns) in the order a frame is matched; a pattern is a substring of
#: the frame's file path as py-spy names it, after a leading ``/``
#: (``redis/client.py`` is matched by ``/redis/``; ``sidecar/store/redis/store.py``
#: is the store layer, whose pattern a frame is matched against first).
#: Frames that match none (``json``, ``threading``, ``socket``, ``hmac``...)
#: count for the caller that does.
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("store layer (plans, documents)", ("/sidecar/store/",)),
    ("store client (redis-py, psycopg)", ("/redis/", "/psycopg/", "/psycopg_pool/")),
    ("body validation (pydantic)", ("/pydantic/", "/pydantic_core/", "/sidecar/api/body.py")),
    ("canonical JSON and fingerprints", ("/rfc8785/", "/sidecar/canonical.py")),
    ("decision log line", ("/logging/", "/sidecar/api/decisions.py")),
    ("metrics (prometheus multiprocess)", ("/prometheus_client/", "/sidecar/metrics.py")),
    ("policy core", ("/sidecar/core/",)),
    ("services (keys, mappers, seam)", ("/sidecar/service/", "/sidecar/auth.py")),
    ("views and response models", ("/sidecar/api/",)),
    ("the floor's route", ("/floors.py", "/bare.py")),
    ("Flask and werkzeug", ("/flask/", "/werkzeug/", "/sidecar/app.py")),
    ("gunicorn (HTTP parsing, worker)", ("/gunicorn/", "/sidecar/serving.py")),
]
OTHER = "other"
FRAME_FILE = re.compile(r"\(([^():]+):\d+\)$")


def part_of(stack: str) -> str:
    """The part a raw py-spy stack (root first, ``;``-separated) is counted for."""
    for frame in reversed(stack.split(";")):
        found = FRAME_FILE.search(frame)
        path = "/" + (found.group(1) if found else frame)
        for part, patterns in PARTS:
            if any(p in path for p in patterns):
                return part
    return OTHER


def profile(pid: int, seconds: int, rate: int, out: Path) -> subprocess.Popen[bytes]:
    """Start sampling ``pid`` for ``seconds`` (py-spy, raw stacks into ``out``)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen(
        [
            *(spy, "record", "-p", str(pid), "-d", str(seconds), "-r", str(rate), "--gil"),
            *("-f", "raw", "-o", str(out), "--nonblocking"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def parts_per_request(raw: Path, rate: int, requests: float) -> Counter[str]:
    """Microseconds of interpreter time per request, by part."""
    per: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            per[part_of(stack)] += int(count)
    return Counter({k: v / rate / requests * 1e6 for k, v in per.items()})


def worker_pid(master: int) -> int:
    """The one gunicorn worker of ``master``."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        kids = subprocess.run(
            ["pgrep", "-P", str(master)], capture_output=True, text=True, check=False
        ).stdout.split()
        if kids:
            return int(kids[0])
        time.sleep(0.1)
    raise RuntimeError(f"no worker under {master}")


def measure(
    base: str, master: int, scenario: str, args: argparse.Namespace, env: dict[str, str]
) -> tuple[dict[str, Any], Counter[str]]:
    """wrk on ``scenario`` while py-spy samples the worker; figures and parts."""
    raw = Path(tempfile.mkstemp(suffix=".raw")[1])
    spy = profile(worker_pid(master), args.duration - 2, args.rate, raw)
    try:
        figures = run.wrk(base, scenario, args, env)
    finally:
        spy.wait(60)
    # Sampling covers duration - 2 s of the run: scale the requests to that window.
    sampled = figures["requests"] * (args.duration - 2) / args.duration
    parts = parts_per_request(raw, args.rate, sampled)
    raw.unlink()
    return figures, parts


def sample_main(args: argparse.Namespace) -> int:
    """The py-spy profile of live gunicorn workers (``--sample``)."""
    if not shutil.which("wrk"):
        print("wrk is missing: apt-get install wrk", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="loopstop-profile-"))
    redis_proc, redis_port, client = run.start_redis(tmp)
    model, upstream = run.start_model(tmp)
    postgres = None
    if args.store == "postgres":
        sys.path.insert(0, str(run.ROOT / "tests"))
        from conftest import PostgresServer

        postgres = PostgresServer(fsync=True).start()
    url = {
        "redis": f"redis://127.0.0.1:{redis_port}/0",
        "sqlite": f"sqlite:///{tmp}/profile.db",
        "postgres": postgres.url if postgres else "",
    }[args.store]
    floor_url = f"sqlite:///{tmp}/floor.db" if args.store == "sqlite" else url
    env = {"BENCH_TOKEN": run.TOKEN, "BENCH_THREADS": str(args.threads)}
    fake_tasks = ",".join(f"t{i:020x}" for i in range(2 * args.connections))
    results: dict[str, dict[str, tuple[dict[str, Any], Counter[str]]]] = {}
    scenarios = args.scenarios.split(",")
    try:
        floor, floor_base = run.start_bare(1, floor_url, upstream)
        try:
            run.warm_up(floor_base, args, {**env, "BENCH_RUN": "warmflr"})
            for scenario in scenarios:
                extra = {"BENCH_TASKS": fake_tasks, "BENCH_RUN": f"flr{scenario[:3]}"}
                results.setdefault(scenario, {})["floor"] = measure(
                    floor_base, floor.pid, scenario, args, {**env, **extra}
                )
        finally:
            run.stop(floor)
        client.flushdb()
        workdir = tmp / "sidecar"
        workdir.mkdir()
        proc, base = run.start_sidecar(url, workdir, 1, upstream)
        try:
            run.warm_up(base, args, {**env, "BENCH_RUN": "warmside"})
            for scenario in scenarios:
                extra = {"BENCH_RUN": f"side{scenario[:3]}"}
                if scenario.startswith(("tool", "model")):
                    extra["BENCH_TASKS"] = run.make_tasks(base, 2 * args.connections)
                results[scenario]["sidecar"] = measure(
                    base, proc.pid, scenario, args, {**env, **extra}
                )
        finally:
            run.stop(proc)
    finally:
        run.stop_all(model, redis_proc, postgres, tmp)

    print(
        f"\nloopstop profile on {args.store}: 1 gunicorn worker, wrk -t{args.threads} "
        f"-c{args.connections} -d{args.duration}s, py-spy --gil at {args.rate}/s, "
        f"load average {os.getloadavg()[0]:.1f}\n"
    )
    names = [p for p, _ in PARTS] + [OTHER]
    for scenario in scenarios:
        (ff, fp), (sf, sp) = results[scenario]["floor"], results[scenario]["sidecar"]
        print(
            f"{scenario}: floor {ff['per_s']:.0f}/s, sidecar {sf['per_s']:.0f}/s "
            f"(vs floor {sf['per_s'] / ff['per_s']:.2f}); interpreter time per request:"
        )
        print(f"  {'part':<36} {'floor us':>9} {'sidecar us':>11} {'beyond us':>10}")
        for name in names:
            if fp[name] or sp[name]:
                print(
                    f"  {name:<36} {fp[name]:>9.0f} {sp[name]:>11.0f} {sp[name] - fp[name]:>10.0f}"
                )
        tf, ts = sum(fp.values()), sum(sp.values())
        print(f"  {'total':<36} {tf:>9.0f} {ts:>11.0f} {ts - tf:>10.0f}\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="redis", choices=("redis", "sqlite", "postgres"))
    ap.add_argument("--sample", action="store_true", help="py-spy on gunicorn workers")
    ap.add_argument("--metrics-cost", action="store_true", help="prometheus calls, timed")
    ap.add_argument("--requests", type=int, default=3000, help="requests per route (in process)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each route (in process)")
    ap.add_argument("--duration", type=int, default=10, help="seconds per run (--sample)")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rate", type=int, default=500, help="samples per second (--sample)")
    ap.add_argument("--scenarios", default=",".join(run.SCENARIOS))
    args = ap.parse_args()
    if args.sample:
        return sample_main(args)
    import parts

    if args.metrics_cost:
        return parts.metrics_cost()
    return parts.main(args)


if __name__ == "__main__":
    raise SystemExit(main())

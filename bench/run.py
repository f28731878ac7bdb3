"""Benchmarks: decisions per second and latency of the sidecar on SQLite, Redis
and PostgreSQL, side by side with a bare Flask route under the same gunicorn settings,
driven by the same load tool (wrk).

    apt-get install wrk          # Debian's wrk
    .venv/bin/python bench/run.py [--duration 10] [--connections 16] [--big 1000000]

It prints, for an operation's first begin, begin+commit, activation,
tool-call admission + result and a model turn through the model gate (to the
stand-in model, workflows-examples/stand-in/model.py, which both sides
share): decisions/s, p50/p95/p99 latency, the ratio to the bare route and
to the store's floor, and on Redis the round trips (counted by the
sidecar's own client) and the commands (INFO commandstats deltas) per
decision; then begin+commit latency with 1k and with ``--big`` records
already in each store (seeded directly). ``--quick`` runs 3 s each and
skips the size run.

Baselines, served with ``loopstop serve``'s gunicorn worker class and
settings (:data:`SERVE_SETTINGS`): ``bare`` is a Flask route answering a
decision-sized JSON body (bench/bare.py); ``floor <store>`` is that route
plus the least store work each decision needs on that store, one Redis
script or one SQL transaction (bench/floors.py). ``vs floor`` is the
sidecar's ratio to its own store's floor: what the sidecar costs beyond
the store work no design can skip.
The sidecar logs at its production default (INFO: one decision line per
request, written to a discarded stderr).
Everything runs on loopback: the servers it starts, a private redis-server and
a private PostgreSQL cluster (initdb into a temp folder, fsync on).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import requests

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
TOKEN = "bench-token-0123456789abcdef"
SECRET = "bench-secret-0123456789abcdef"
CONFIG = """
tokens:
  - {name: bench, env: BENCH_TOKEN, workflows: ["*"], admin: true}
operations: {retention_s: 3600, max_open_per_workflow: 1000000}  # begin-only runs leave ids open
chains:
  default: {rate_limit: 1000000, workflow_rate_limit: 1000000, max_activations: 1000000}
"""
SCENARIOS = {
    "begin": "begin.lua",
    "begin+commit": "begin_commit.lua",
    "activation": "activation.lua",
    "tool call+result": "tool_call.lua",
    "model turn": "model_turn.lua",
}
#: Scenarios whose script starts with bench/tasks.lua (tasks split over threads).
ON_TASKS = ("tool call+result", "model turn")
#: The stand-in model the model-turn route's floor and sidecar forward to.
STAND_IN = ROOT / "workflows-examples" / "stand-in" / "model.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {url}")
        try:
            if requests.get(url, timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"not ready: {url}")


def start_redis(folder: Path) -> tuple[subprocess.Popen[bytes], int, redis.Redis]:
    """A private redis-server on a free loopback port (no persistence), once it
    answers: the process, its port and a client."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--dir", str(folder)),
        ],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, decode_responses=True)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    return proc, port, client


def stop_all(
    model: subprocess.Popen[bytes], redis_proc: subprocess.Popen[bytes], postgres: Any, tmp: Path
) -> None:
    """Stop the stand-in model, the private redis-server and PostgreSQL; remove ``tmp``."""
    stop(model)
    redis_proc.terminate()
    redis_proc.wait(10)
    if postgres:
        postgres.cleanup()
    shutil.rmtree(tmp, ignore_errors=True)


def start_model(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The stand-in model (answers a short text with its usage); its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(STAND_IN), "--port", str(port), "--mode", "final"],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/v1"
    wait_ready(base + "/models", proc)
    return proc, base


def start_sidecar(
    store: str, workdir: Path, workers: int, upstream: str = ""
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    model_gate = f"model_gate: {{upstream_url: '{upstream}'}}\n" if upstream else ""
    (workdir / "loopstop.yaml").write_text(CONFIG + model_gate)
    env = {
        "PATH": os.environ["PATH"],
        "LOOPSTOP_CONFIG": str(workdir / "loopstop.yaml"),
        "LOOPSTOP_STORE": store,
        "LOOPSTOP_SECRET": SECRET,
        "BENCH_TOKEN": TOKEN,
        # ``PYTHONPATH=<another checkout>`` serves that checkout's sidecar.
        **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ},
    }
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
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/readyz", proc)
    return proc, base


#: ``loopstop serve``'s gunicorn settings (sidecar/cli.py), which the baselines share.
SERVE_SETTINGS = [
    "-k",
    "sidecar.serving.BoundedThreadWorker",
    "--threads",
    "8",
    "--worker-connections",
    "1000",
    "--keep-alive",
    "5",
    "--timeout",
    "60",
]


def start_bare(
    workers: int,
    store_url: str | None = None,
    upstream: str = "",
    environ: dict[str, str] | None = None,
    factory: str | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """The bare route (``store_url`` None), or the floor of the store it names
    (bench/floors.py: the least store work of each route); ``environ`` adds to the
    floor's settings (``FLOOR_TASK_DOC_BYTES``). ``factory`` serves another of
    bench/'s apps under the same settings (``forward:create_app()``)."""
    port = free_port()
    if factory is None:
        factory = "bare:create_app()" if store_url is None else "floors:create_app()"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--chdir",
            str(BENCH),
            "-w",
            str(workers),
            "-b",
            f"127.0.0.1:{port}",
            *SERVE_SETTINGS,
            "--log-level",
            "warning",
            factory,
        ],
        env={
            **os.environ,
            "FLOOR_STORE": store_url or "",
            "FLOOR_UPSTREAM": upstream,
            "PYTHONPATH": str(ROOT),
            **(environ or {}),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            requests.post(base + "/v1/activations", json={}, timeout=1)
            return proc, base
        except requests.RequestException:
            time.sleep(0.1)
    raise RuntimeError("bare app not ready")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(30)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) used so far by process ``pid`` and every
    process below it (gunicorn's master and its workers), from ``/proc``."""
    ticks = os.sysconf("SC_CLK_TCK")
    used: dict[int, float] = {}
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a process that ended meanwhile
        used[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
        children.setdefault(int(fields[1]), []).append(int(entry.name))  # by parent
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        total += used.get(current, 0.0)
        stack += children.get(current, [])
    return total


def wrk(
    base: str,
    scenario: str,
    args: argparse.Namespace,
    env: dict[str, str],
    server: int | None = None,
) -> dict[str, Any]:
    """One wrk run of ``scenario``; with ``server`` (a pid), also the CPU
    microseconds the server's processes spent per request (``cpu_us``)."""
    cpu0 = tree_cpu_s(server) if server is not None else 0.0
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    parts = (["tasks.lua"] if scenario in ON_TASKS else []) + [SCENARIOS[scenario], "report.lua"]
    script.write_text("\n".join((BENCH / name).read_text() for name in parts))
    try:
        out = subprocess.run(
            [
                "wrk",
                "-t",
                str(args.threads),
                "-c",
                str(args.connections),
                "-d",
                f"{args.duration}s",
                "-s",
                str(script),
                base,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            check=False,
            timeout=args.duration + 60,
        )
    finally:
        script.unlink()
    if out.returncode != 0:
        raise RuntimeError(
            f"wrk {scenario} on {base} exited {out.returncode}: {out.stderr[-2000:]}"
        )
    line = next(x for x in out.stdout.splitlines() if x.startswith("BENCH "))
    figures: dict[str, Any] = json.loads(line.removeprefix("BENCH "))
    figures["per_s"] = figures["requests"] / figures["duration_s"]
    if server is not None:
        figures["cpu_us"] = (tree_cpu_s(server) - cpu0) / max(1, figures["requests"]) * 1e6
    return figures


def warm_up(base: str, args: argparse.Namespace, env: dict[str, str]) -> None:
    """One short discarded run, so the first scenario measured is not the
    workers' first requests (imports, connections, caches); once more when
    wrk fails it (a server's first connections, seen now and then on a
    PostgreSQL floor)."""
    short = argparse.Namespace(**{**vars(args), "duration": 1})
    try:
        wrk(base, "activation", short, env)
    except RuntimeError as exc:
        print(f"warm-up failed, once more: {exc}", file=sys.stderr)
        wrk(base, "activation", short, env)


#: A bench task's limits: high enough that no run ends a task.
TASK_LIMITS = {
    "max_tool_calls": 1_000_000,
    "max_same_call": 1_000_000,
    "max_idle": 1_000_000,
    "max_model_calls": 1_000_000,
    "max_tokens": 1_000_000_000,
    "deadline_s": 31_000_000,
}


def per_decision(f: dict[str, Any]) -> tuple[str, str]:
    """A run's round trips and commands per decision, as printed ("": not counted)."""
    rtt = f"{f['round_trips']:.2f}" if "round_trips" in f else ""
    cmds = f"{f['commands']:.2f}" if "commands" in f else ""
    return rtt, cmds


def make_tasks(base: str, n: int) -> str:
    ids = []
    for _ in range(n):
        r = requests.post(
            base + "/v1/tasks",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={
                "workflow": "bench",
                "limits": TASK_LIMITS,
            },
            timeout=10,
        )
        r.raise_for_status()
        ids.append(r.json()["task"]["task_id"])
    return ",".join(ids)


def store_counts(base: str) -> tuple[float, float, float]:
    """The sidecar's decisions, Redis round trips and compare-and-set conflicts
    so far, from its own /metrics (so requests still in flight when wrk stops
    count on both sides of a ratio)."""
    text = requests.get(base + "/metrics", timeout=10).text
    decisions = sum(
        float(v)
        for v in re.findall(r"^loopstop_decisions_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
    )
    counts = []
    for name in ("round_trips", "conflicts"):
        found = re.search(rf"^loopstop_store_{name}_total (\S+)$", text, re.MULTILINE)
        counts.append(float(found.group(1)) if found else 0.0)
    return decisions, counts[0], counts[1]


#: Commands the bench itself, redis-py's connection set-up and health checks send.
NOT_DECISIONS = ("info", "ping", "config", "client", "hello", "select", "flushdb", "mset")


def redis_calls(client: redis.Redis) -> int:
    """Commands Redis has run so far, those a script runs included (``INFO
    commandstats`` counts a script's own GET, SET, ZADD... as commands), less
    the bench's and the connection's own."""
    stats = client.info("commandstats")
    return sum(
        int(v["calls"])
        for k, v in stats.items()
        if k.removeprefix("cmdstat_").split("|")[0] not in NOT_DECISIONS
    )


def seed_sqlite(path: Path, n: int) -> None:
    from sidecar.store.sqlite import SQLiteStore

    SQLiteStore(path).close()  # the schema
    doc = json.dumps({"operation_id": "x", "state": "committed", "attempt": 1, "pad": "y" * 200})
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT OR REPLACE INTO kv (key, doc, expires_at) VALUES (?, ?, NULL)",
            ((f"p:op:seed-{i}", doc) for i in range(n)),
        )


def seed_redis(client: redis.Redis, n: int) -> None:
    doc = json.dumps({"operation_id": "x", "state": "committed", "attempt": 1, "pad": "y" * 200})
    for start in range(0, n, 10_000):
        client.mset({f"loopstop:p:op:seed-{i}": doc for i in range(start, min(n, start + 10_000))})


#: Short names of the scenarios for ``--routes``.
ROUTE_NAMES = {
    "begin": "begin",
    "begin_commit": "begin+commit",
    "activation": "activation",
    "tool_call": "tool call+result",
    "model_turn": "model turn",
}


def print_vs_floor(
    bases: dict[str, dict[str, dict[str, Any]]], rows: list[tuple[str, str, dict[str, Any]]]
) -> None:
    """One line per store and route: the floor's and the sidecar's decisions/s and
    p99, the ratio, and on Redis the round trips and commands per decision."""
    print(
        f"{'store':<10} {'route':<18} {'floor /s':>9} {'floor p99':>10} {'sidecar /s':>11} "
        f"{'p99 ms':>8} {'vs floor':>9} {'RTT/dec':>8} {'cmds/dec':>9} {'non-2xx':>8}"
    )
    for name, scenario, f in rows:
        floor = bases[f"floor {name}"][scenario]
        rtt, cmds = per_decision(f)
        print(
            f"{name:<10} {scenario:<18} {floor['per_s']:>9.0f} {floor['p99_ms']:>10.2f} "
            f"{f['per_s']:>11.0f} {f['p99_ms']:>8.2f} {f['vs_floor']:>9.2f} {rtt:>8} "
            f"{cmds:>9} {f['errors'] + f['non_2xx']:>8}"
        )


def measure_sidecar(
    name: str,
    base: str,
    scenario: str,
    args: argparse.Namespace,
    env: dict[str, str],
    client: redis.Redis,
    server: int | None = None,
) -> dict[str, Any]:
    """One wrk run of ``scenario`` against the sidecar at ``base``, with its round
    trips and conflicts per decision (its own /metrics), on Redis the commands
    per decision (INFO commandstats), and with ``server`` (its pid) its CPU
    microseconds per request."""
    extra = {"BENCH_RUN": f"{name}{scenario[:3]}{time.monotonic_ns() % 10**6}"}
    if scenario.startswith(("tool", "model")):
        extra["BENCH_TASKS"] = make_tasks(base, 2 * args.connections)
        extra["BENCH_THREADS"] = str(args.threads)
    (decided0, trips0, conflicts0), calls0 = store_counts(base), redis_calls(client)
    figures = wrk(base, scenario, args, {**env, **extra}, server)
    if name in ("redis", "postgres"):
        time.sleep(1)  # let the requests wrk left in flight finish
        decided, trips, conflicts = store_counts(base)
        n = decided - decided0
        if n <= 0:
            raise RuntimeError(
                f"{name} {scenario}: the sidecar counted no decision "
                f"(wrk: {figures['requests']} requests, "
                f"{figures['errors']} errors, {figures['non_2xx']} non-2xx)"
            )
        figures["round_trips"] = (trips - trips0) / n
        figures["conflicts"] = (conflicts - conflicts0) / n
        if name == "redis":
            figures["commands"] = (redis_calls(client) - calls0) / n
    return figures


def vs_floor_rounds(
    args: argparse.Namespace,
    scenarios: list[str],
    store_urls: dict[str, str],
    upstream: str,
    env: dict[str, str],
    client: redis.Redis,
) -> None:
    """``--vs-floor --rounds N``: per store, the floor and the sidecar served side by
    side (the floor on its own Redis database), and each route driven ``N`` times
    against each in turn (floor first in odd rounds, sidecar first in even ones), so
    a drift of the machine (other work, a neighbour's steal) falls on both alike.
    Prints each round's ratio and their median per route, and beside them the
    CPU microseconds the servers' processes (gunicorn's master and workers)
    spent per request, floor / sidecar, and their ratio (the median of the
    rounds'): a figure the machine's other load moves far less than a
    throughput, as long as both sides are CPU-bound."""
    print(
        f"{'store':<10} {'route':<18} {'floor /s':>9} {'sidecar /s':>11} {'p99 ms':>8} "
        f"{'vs floor':>9} {'rounds':>24} {'CPU us/req':>13} {'ratio':>5} "
        f"{'RTT/dec':>8} {'cmds/dec':>9} {'non-2xx':>8}"
    )
    for name, url in store_urls.items():
        floor_url = (
            f"sqlite:///{Path(url.removeprefix('sqlite:///')).parent}/floor.db"
            if (name == "sqlite")
            else (url.rsplit("/", 1)[0] + "/1" if name == "redis" else url)
        )
        workdir = Path(tempfile.mkdtemp(prefix=f"loopstop-bench-{name}-"))
        floor, floor_base = start_bare(args.workers, floor_url, upstream)
        proc, base = start_sidecar(url, workdir, args.workers, upstream)
        try:
            warm_up(floor_base, args, {**env, "BENCH_RUN": "warmfloor"})
            warm_up(base, args, {**env, "BENCH_RUN": f"warm{name}"})
            for scenario in scenarios:
                floors: list[dict[str, Any]] = []
                sidecars: list[dict[str, Any]] = []
                for r in range(args.rounds):
                    floor_env = {
                        **env,
                        "BENCH_TASKS": ",".join(f"t{i:020x}" for i in range(2 * args.connections)),
                        "BENCH_THREADS": str(args.threads),
                        "BENCH_RUN": f"fl{scenario[:3]}{r}",
                    }
                    order = ["floor", "sidecar"] if r % 2 == 0 else ["sidecar", "floor"]
                    for side in order:
                        if side == "floor":
                            floors.append(wrk(floor_base, scenario, args, floor_env, floor.pid))
                        else:
                            sidecars.append(
                                measure_sidecar(name, base, scenario, args, env, client, proc.pid)
                            )
                ratios = sorted(
                    s["per_s"] / f["per_s"] for s, f in zip(sidecars, floors, strict=True)
                )
                median = statistics.median(ratios)
                cpu = statistics.median(
                    f["cpu_us"] / s["cpu_us"] for s, f in zip(sidecars, floors, strict=True)
                )
                cpu_floor = statistics.median(f["cpu_us"] for f in floors)
                cpu_side = statistics.median(s["cpu_us"] for s in sidecars)
                mid = sorted(sidecars, key=lambda f: f["per_s"])[len(sidecars) // 2]
                floor_mid = sorted(floors, key=lambda f: f["per_s"])[len(floors) // 2]
                rtt, cmds = per_decision(mid)
                failed = sum(f["errors"] + f["non_2xx"] for f in sidecars + floors)
                each = " ".join(f"{x:.2f}" for x in ratios)
                print(
                    f"{name:<10} {scenario:<18} {floor_mid['per_s']:>9.0f} "
                    f"{mid['per_s']:>11.0f} {mid['p99_ms']:>8.2f} {median:>9.2f} "
                    f"{each:>24} {cpu_floor:>6.0f} /{cpu_side:>5.0f} {cpu:>5.2f} "
                    f"{rtt:>8} {cmds:>9} {failed:>8}",
                    flush=True,
                )
        finally:
            stop(proc)
            stop(floor)
            proc.wait(10)
            floor.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description="loopstop benchmarks (wrk)")
    ap.add_argument("--duration", type=int, default=10, help="seconds per run")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--big", type=int, default=1_000_000, help="records for the size run")
    ap.add_argument(
        "--stores", default="sqlite,redis,postgres", help="comma-separated: sqlite, redis, postgres"
    )
    ap.add_argument("--no-size", action="store_true", help="skip the 1k vs --big run")
    ap.add_argument(
        "--quick", action="store_true", help="3 s a run, no size run: a first look in about 2 min"
    )
    ap.add_argument(
        "--routes",
        default=",".join(SCENARIOS),
        help="comma-separated scenarios (begin, begin+commit or begin_commit, activation, "
        "tool_call, model_turn)",
    )
    ap.add_argument(
        "--vs-floor",
        action="store_true",
        help="only the floors and the sidecar (no bare route, no size run); "
        "print decisions/s, p99 and vs floor per route",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="with --vs-floor: drive each route this many times against the floor and the "
        "sidecar in turn, both served at once, and print the median ratio (0: one run each, "
        "every floor first)",
    )
    args = ap.parse_args()
    if args.quick:
        args.duration, args.no_size = 3, True
    if args.vs_floor:
        args.no_size = True
    scenarios = [ROUTE_NAMES.get(r, r) for r in args.routes.split(",")]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or not scenarios:
        print(f"unknown routes: {unknown}; choose from {', '.join(ROUTE_NAMES)}", file=sys.stderr)
        return 2
    load_at_start = os.getloadavg()
    if not shutil.which("wrk"):
        print("wrk is missing: apt-get install wrk", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="loopstop-bench-"))
    redis_proc, redis_port, client = start_redis(tmp)
    postgres = None
    if "postgres" in args.stores.split(","):
        sys.path.insert(0, str(ROOT / "tests"))
        from conftest import PostgresServer  # the tests' private cluster, fsync on

        postgres = PostgresServer(fsync=True).start()
    pg_url = postgres.url if postgres else ""
    model, upstream = start_model(tmp)
    env = {"BENCH_TOKEN": TOKEN}
    rows: list[tuple[str, str, dict[str, Any]]] = []
    fake_tasks = ",".join(f"t{i:020x}" for i in range(2 * args.connections))
    try:
        bases: dict[str, dict[str, dict[str, Any]]] = {}
        chosen = args.stores.split(",")
        store_urls = {
            "sqlite": f"sqlite:///{tmp}/bench.db",
            "redis": f"redis://127.0.0.1:{redis_port}/0",
            "postgres": pg_url,
        }
        if args.vs_floor and args.rounds:
            print(
                f"\nloopstop vs floor, interleaved: {args.workers} gunicorn workers, wrk "
                f"-t{args.threads} -c{args.connections} -d{args.duration}s, {args.rounds} rounds, "
                f"{os.cpu_count()} cores, load average {load_at_start[0]:.2f} at the start\n",
                flush=True,
            )
            urls = {name: url for name, url in store_urls.items() if name in chosen}
            vs_floor_rounds(args, scenarios, urls, upstream, env, client)
            print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
            return 0
        targets: list[tuple[str, str | None]] = [] if args.vs_floor else [("bare", None)]
        targets += [
            (f"floor {name}", f"sqlite:///{tmp}/floor.db" if name == "sqlite" else url)
            for name, url in store_urls.items()
            if name in chosen
        ]
        for label, url in targets:
            bare, bare_base = start_bare(args.workers, url, upstream)
            warm_up(bare_base, args, {**env, "BENCH_RUN": f"warm{label[-3:]}"})
            bases[label] = {}
            for scenario in scenarios:
                calls0 = redis_calls(client)
                figures = wrk(
                    bare_base,
                    scenario,
                    args,
                    {
                        **env,
                        "BENCH_TASKS": fake_tasks,
                        "BENCH_THREADS": str(args.threads),
                        "BENCH_RUN": f"{label[-3:]}{scenario[:3]}",
                    },
                )
                if url is not None and url.startswith("redis"):
                    time.sleep(1)  # let the requests wrk left in flight finish
                    figures["commands"] = (redis_calls(client) - calls0) / figures["requests"]
                bases[label][scenario] = figures
            stop(bare)
            failed = sum(f["errors"] + f["non_2xx"] for f in bases[label].values())
            if failed:
                raise RuntimeError(f"the {label} baseline answered {failed} errors")
        baseline = bases.get("bare", {})
        client.flushdb()
        stores = {name: url for name, url in store_urls.items() if name in chosen}
        for name, url in stores.items():
            workdir = tmp / name
            workdir.mkdir()
            proc, base = start_sidecar(url, workdir, args.workers, upstream)
            try:
                warm_up(base, args, {**env, "BENCH_RUN": f"warm{name}"})
                for scenario in scenarios:
                    figures = measure_sidecar(name, base, scenario, args, env, client)
                    figures["ratio"] = (
                        figures["per_s"] / baseline[scenario]["per_s"] if baseline else math.nan
                    )
                    figures["vs_floor"] = (
                        figures["per_s"] / bases[f"floor {name}"][scenario]["per_s"]
                    )
                    rows.append((name, scenario, figures))
            finally:
                stop(proc)
        sizes: dict[str, dict[int, dict[str, Any]]] = {}
        for name in [] if args.no_size else [n for n in stores if n != "postgres"]:
            sizes[name] = {}
            for count in sorted({1_000, args.big}):
                client.flushdb()
                workdir = tmp / f"{name}-{count}"
                workdir.mkdir()
                url = (
                    f"sqlite:///{workdir}/size.db"
                    if name == "sqlite"
                    else f"redis://127.0.0.1:{redis_port}/0"
                )
                if name == "sqlite":
                    seed_sqlite(workdir / "size.db", count)
                else:
                    seed_redis(client, count)
                proc, base = start_sidecar(url, workdir, args.workers)
                try:
                    sizes[name][count] = wrk(
                        base, "begin+commit", args, {**env, "BENCH_RUN": f"size{count}"}
                    )
                finally:
                    stop(proc)
    finally:
        stop_all(model, redis_proc, postgres, tmp)

    print(
        f"\nloopstop benchmarks: {args.workers} gunicorn workers, wrk -t{args.threads} "
        f"-c{args.connections} -d{args.duration}s, {os.cpu_count()} cores, load average "
        f"{load_at_start[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end\n"
    )
    if args.vs_floor:
        print_vs_floor(bases, rows)
        return 0
    print(
        f"{'target':<14} {'scenario':<18} {'decisions/s':>11} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'vs bare':>8} {'vs floor':>8} {'RTT/dec':>8} {'cmds/dec':>8} "
        f"{'non-2xx':>8}"
    )
    for label, by_scenario in bases.items():
        for scenario, f in by_scenario.items():
            ratio = f["per_s"] / baseline[scenario]["per_s"] if baseline else math.nan
            _, cmds = per_decision(f)
            print(
                f"{label:<14} {scenario:<18} {f['per_s']:>11.0f} {f['p50_ms']:>8.2f} "
                f"{f['p95_ms']:>8.2f} {f['p99_ms']:>8.2f} {ratio:>8.2f} {'':>8} {'':>8} "
                f"{cmds:>8} {f['errors'] + f['non_2xx']:>8}"
            )
    for name, scenario, f in rows:
        rtt, cmds = per_decision(f)
        print(
            f"{name:<14} {scenario:<18} {f['per_s']:>11.0f} {f['p50_ms']:>8.2f} "
            f"{f['p95_ms']:>8.2f} {f['p99_ms']:>8.2f} {f['ratio']:>8.2f} "
            f"{f['vs_floor']:>8.2f} {rtt:>8} {cmds:>8} {f['errors'] + f['non_2xx']:>8}"
        )
    print(
        "\nbegin+commit with records already stored:"
        if sizes
        else "\nbegin+commit with records already stored: not measured (--quick, --no-size)"
    )
    for name, by_count in sizes.items():
        small, big = by_count[1_000], by_count[args.big]
        print(
            f"  {name:<7} 1k: p99 {small['p99_ms']:.2f} ms, {small['per_s']:.0f}/s;  "
            f"{args.big:,}: p99 {big['p99_ms']:.2f} ms, {big['per_s']:.0f}/s;  "
            f"p99 ratio {big['p99_ms'] / small['p99_ms']:.2f}"
        )
    for name, scenario, f in rows:
        if "conflicts" in f:
            print(
                f"{name} {scenario}: {f['conflicts'] * 1000:.1f} compare-and-set conflicts "
                "per 1,000 decisions"
            )
    errors = sum(f["errors"] + f["non_2xx"] for _, _, f in rows)
    print(f"\nerrors and non-2xx answers across the sidecar runs: {errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

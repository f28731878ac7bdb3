"""What the model gate adds to a non-streamed turn, beside what LiteLLM's proxy adds.

One run, interleaved: every round sends the same turn straight to the
stand-in model (``workflows-examples/stand-in/model.py``, served in this
process) and through each target, in an order that rotates from round to
round; a target's "added" time is its turn's time minus the direct turn's
time of the same round (p50 and p90 over the rounds). The targets:

- ``gate, in process``: ``create_app`` on a private redis-server (or SQLite,
  ``--store sqlite``), its WSGI callable called as gunicorn calls it (an
  environ of the request's headers and body, no socket; not werkzeug's test
  client, whose own request building and response wrapping cost about
  0.35 ms a request), with its decision log at INFO to a discarded stream,
  as ``loopstop serve`` logs;
- ``gate, loopstop serve``: the real ``loopstop serve`` (gunicorn,
  ``--workers``, its gthread worker) on the same redis-server, over
  loopback HTTP with keep-alive, its log to a file;
- ``floor, served``: bench/floors.py's model turn under the same gunicorn
  worker class and settings (one Redis script reading and writing a task
  document of ``FLOOR_TASK_DOC_BYTES``, 4,000 here, about a task's of 20
  turns; then the body forwarded with urllib3 and the answer relayed):
  the least any served gate on that store adds (``--no-floor`` skips it);
- ``forward, served``: bench/forward.py under the same gunicorn worker class
  and settings, a bare WSGI callable that forwards the body with urllib3 and
  relays the answer (no framework, no store): what the served hop alone
  adds on this machine (skipped with ``--no-floor`` too);
- ``LiteLLM proxy``: ``litellm --config`` with one model routed to the
  stand-in as an OpenAI-compatible upstream (``openai/<model>``,
  ``api_base``), over loopback HTTP with keep-alive (skipped with
  ``--no-litellm``, or when its environment is missing).

Cases: OpenAI Chat Completions and Responses, each with a text answer and
with a proposed tool call (the gate admits it through the task guard); a
fresh task every 20 turns (the default ``max_model_calls``). Each gate
request names its own task and carries a token, as n8n sends it.

LiteLLM lives in its own virtual environment, never a dependency of the
project (git-ignored)::

    python3 -m venv bench/.venv-litellm
    bench/.venv-litellm/bin/pip install 'litellm[proxy]'

Run: ``.venv/bin/python bench/gate_vs_litellm.py [--turns 300] [--store redis|sqlite]``;
with ``PYTHONPATH=<another checkout>`` it measures that checkout's sidecar
(in process and served), for a before and after in one sitting.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fake_llm import serve  # noqa: E402
from served import Sidecar  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from model_gate import LIMITS  # noqa: E402

from sidecar.app import create_app  # noqa: E402

LITELLM = ROOT / "bench" / ".venv-litellm" / "bin" / "litellm"
SECRET = "bench-secret-0123456789abcdef"
TOKEN = "bench-token-0123456789abcdef0123"
LITELLM_KEY = "sk-bench-0123456789abcdef0123456789abcdef"
TURNS_PER_TASK = 20
WARM_UP = 20
CASES = (
    ("chat", "final"),
    ("chat", "tool_call"),
    ("responses", "final"),
    ("responses", "tool_call"),
)
PATHS = {"chat": "/chat/completions", "responses": "/responses"}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _body(api: str, task_id: str) -> dict[str, Any]:
    """One turn of an agent, as n8n's OpenAI Chat Model sends it."""
    system = f"You are an agent.\nloopstop-task: {task_id}"
    user = {"role": "user", "content": "Where is order ORD-7?"}
    if api == "chat":
        tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
        return {
            "model": "m",
            "messages": [{"role": "system", "content": system}, user],
            "tools": tools,
        }
    tools = [{"type": "function", "name": "lookup", "parameters": {}}]
    items = [{"type": "message", "role": "system", "content": system}, user]
    return {"model": "m", "input": items, "tools": tools}


def _wsgi_post(app: Any, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    """POST ``body`` as JSON to ``app``'s WSGI callable with the bench token, as
    gunicorn hands it a request: its status and its whole body."""
    raw = json.dumps(body).encode()
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8787",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1:8787",
        "HTTP_AUTHORIZATION": f"Bearer {TOKEN}",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(raw)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(raw),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    status: list[str] = []
    chunks = app(environ, lambda line, headers, exc_info=None: status.append(line))
    try:
        answer = b"".join(chunks)
    finally:
        getattr(chunks, "close", lambda: None)()
    return int(status[0][:3]), answer


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


@contextmanager
def _redis(folder: str) -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", folder],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                import redis

                redis.Redis(port=port).ping()
                break
            except Exception:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def _floor(folder: str, redis_url: str, upstream: str, workers: int) -> Iterator[str]:
    """bench/floors.py's app under ``loopstop serve``'s gunicorn settings."""
    from run import start_bare

    proc, base = start_bare(workers, f"{redis_url}/3", upstream, {"FLOOR_TASK_DOC_BYTES": "4000"})
    try:
        yield base + "/v1/openai"
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def _forward(upstream: str, workers: int) -> Iterator[str]:
    """bench/forward.py under ``loopstop serve``'s gunicorn settings."""
    from run import start_bare

    proc, base = start_bare(
        workers, None, environ={"FORWARD_UPSTREAM": upstream}, factory="forward:create_app()"
    )
    try:
        yield base + "/v1/openai"
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def _litellm(folder: str, upstream: str) -> Iterator[str | None]:
    """LiteLLM's proxy in front of the stand-in (None: not installed)."""
    if not LITELLM.exists():
        yield None
        return
    port = _free_port()
    config = Path(folder) / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: m\n"
        "    litellm_params:\n"
        "      model: openai/m\n"
        f"      api_base: {upstream}\n"
        "      api_key: sk-stand-in\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_KEY}\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  set_verbose: false\n"
    )
    log = open(Path(folder) / "litellm.log", "w")  # noqa: SIM115 (closed below)
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "NO_DOCKER": "True",
    }
    proc = subprocess.Popen(
        [str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=folder,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError((Path(folder) / "litellm.log").read_text()[-3000:])
            try:
                if requests.get(base + "/health/liveliness", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.3)
        else:
            raise RuntimeError("litellm did not start")
        yield base + "/v1"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


class Target:
    """One way to send a turn: ``send(api, body) -> status``, and a task maker;
    ``trips()``, when given, counts the store round trips made so far."""

    def __init__(
        self,
        name: str,
        send: Callable[[str, dict[str, Any]], int],
        new_task: Callable[[], str] | None,
        trips: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        self.send = send
        self.new_task = new_task
        self.trips = trips
        self.task_id = ""


def _http_target(name: str, base: str, session: requests.Session, gate: bool) -> Target:
    headers = {"Authorization": f"Bearer {TOKEN}" if gate else f"Bearer {LITELLM_KEY}"}

    def send(api: str, body: dict[str, Any]) -> int:
        r = session.post(base + PATHS[api], json=body, headers=headers, timeout=30)
        r.content  # noqa: B018 (read it whole)
        return r.status_code

    def new_task() -> str:
        root = base.removesuffix("/v1/openai")
        r = session.post(root + "/v1/tasks", json={}, headers=headers, timeout=10)
        return str(r.json()["task"]["task_id"])

    def fresh_id() -> str:  # the floor keys its task document by the id
        return "t" + os.urandom(10).hex()

    return Target(name, send, new_task if gate else fresh_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=300, help="measured turns per case")
    parser.add_argument("--store", choices=("redis", "sqlite"), default="redis")
    parser.add_argument("--workers", type=int, default=2, help="loopstop serve's workers")
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--no-serve", action="store_true")
    parser.add_argument("--no-floor", action="store_true")
    args = parser.parse_args()
    start_load = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder, serve() as llm, _redis(folder) as redis_url:
        store_in = f"{redis_url}/1" if args.store == "redis" else f"sqlite:///{folder}/in.db"
        store_out = f"{redis_url}/2" if args.store == "redis" else f"sqlite:///{folder}/out.db"
        env = {"LOOPSTOP_SECRET": SECRET, "LOOPSTOP_TOKEN_BENCH": TOKEN}
        # ``PYTHONPATH=<another checkout>`` measures that build, served too
        passed = {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
        tokens = [{"name": "bench", "env": "LOOPSTOP_TOKEN_BENCH", "workflows": ["*"]}]
        gate_config = {"upstream_url": llm.base, "timeout_s": 30}
        app = create_app(
            {"store": store_in, "limits": LIMITS, "model_gate": gate_config, "tokens": tokens},
            environ=env,
            announce=False,
        )
        decisions = logging.getLogger("loopstop")
        decisions.setLevel(logging.INFO)
        decisions.addHandler(logging.StreamHandler(io.StringIO()))
        decisions.propagate = False

        def in_process(api: str, body: dict[str, Any]) -> int:
            return _wsgi_post(app, "/v1/openai" + PATHS[api], body)[0]

        def in_process_task() -> str:
            return str(json.loads(_wsgi_post(app, "/v1/tasks", {})[1])["task"]["task_id"])

        direct = requests.Session()

        def in_process_trips() -> float:  # the app's own counter (no scrape)
            registry = app.extensions["loopstop"].metrics.registry
            return float(registry.get_sample_value("loopstop_store_round_trips_total") or 0.0)

        targets = [Target("gate, in process", in_process, in_process_task, in_process_trips)]
        stack: list[Any] = []
        server = None
        if not args.no_serve:
            config = Path(folder) / "served.yaml"
            config.write_text(
                f"model_gate: {{upstream_url: '{llm.base}', timeout_s: 30}}\n"
                "limits: {max_model_calls: 1000000, max_tool_calls: 1000000, "
                "max_same_call: 1000000, max_cycle_repeats: 1000, max_tokens: 10000000000, "
                "deadline_s: 86400}\n"
                "tokens:\n  - {name: bench, env: LOOPSTOP_TOKEN_BENCH, workflows: ['*']}\n"
            )
            server = Sidecar(
                Path(folder),
                {**env, **passed, "LOOPSTOP_CONFIG": str(config), "LOOPSTOP_STORE": store_out},
                workers=args.workers,
            ).start()
            targets.append(
                _http_target(
                    "gate, loopstop serve", server.base + "/v1/openai", requests.Session(), True
                )
            )
        try:
            if not args.no_floor:
                floor_cm = _floor(folder, redis_url, llm.base, args.workers)
                floor_base = floor_cm.__enter__()
                stack.append(floor_cm)
                targets.append(_http_target("floor, served", floor_base, requests.Session(), False))
                forward_cm = _forward(llm.base, args.workers)
                forward_base = forward_cm.__enter__()
                stack.append(forward_cm)
                targets.append(
                    _http_target("forward, served", forward_base, requests.Session(), False)
                )
            litellm_cm = _litellm(folder, llm.base) if not args.no_litellm else None
            litellm_base = litellm_cm.__enter__() if litellm_cm is not None else None
            if litellm_cm is not None:
                stack.append(litellm_cm)
            if litellm_base is not None:
                targets.append(
                    _http_target("LiteLLM proxy", litellm_base, requests.Session(), False)
                )
            _run(args, llm, direct, targets, start_load)
        finally:
            for cm in stack:
                cm.__exit__(None, None, None)
            if server is not None:
                server.stop()


#: In-process turns of a case whose function calls are counted (:func:`_calls_per_turn`).
CALLS_TURNS = 40


def _calls_per_turn(target: Target, api: str, turns: int) -> float:
    """Function calls (Python and C, as :mod:`cProfile` counts them) per turn of
    ``target``, each of a task of its own: a figure the machine's load cannot move."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call" or event == "c_call":
            calls += 1

    task_id = target.new_task() if target.new_task is not None else target.task_id
    for _ in range(turns):
        body = _body(api, task_id)
        sys.setprofile(count)
        try:
            target.send(api, body)
        finally:
            sys.setprofile(None)
    return calls / turns


def _run(
    args: argparse.Namespace,
    llm: Any,
    direct: requests.Session,
    targets: list[Target],
    start_load: tuple[float, float, float],
) -> None:
    load = ", ".join(f"{x:.2f}" for x in start_load)
    print(
        f"non-streamed turns, {args.turns} per case, interleaved; store {args.store}; "
        f"loopstop serve --workers {args.workers}; {os.cpu_count()} CPUs; "
        f"load average at start {load}"
    )
    print(
        f"{'case':22} {'target':22} {'p50 ms':>7} {'added p50':>9} {'added p90':>9} "
        f"{'vs LiteLLM':>10} {'trips/turn':>10} {'calls/turn':>10}"
    )
    for api, mode in CASES:
        llm.mode = mode
        times: dict[str, list[float]] = {t.name: [] for t in targets}
        times["direct"] = []
        trips = dict.fromkeys((t.name for t in targets), 0.0)

        def straight(api: str, body: dict[str, Any]) -> int:
            return direct.post(llm.base + PATHS[api], json=body, timeout=30).status_code

        sends: list[tuple[str, Callable[[str, dict[str, Any]], int], Target | None]] = [
            ("direct", straight, None)
        ]
        sends += [(t.name, t.send, t) for t in targets]
        for i in range(args.turns + WARM_UP):
            if i % TURNS_PER_TASK == 0:
                for t in targets:
                    if t.new_task is not None:
                        t.task_id = t.new_task()
            shift = i % len(sends)
            for name, send, target in sends[shift:] + sends[:shift]:
                body = _body(api, target.task_id if target is not None else "t-direct")
                meter = target.trips if target is not None and i >= WARM_UP else None
                before = meter() if meter is not None else 0.0
                t0 = time.perf_counter()
                status = send(api, body)
                elapsed = (time.perf_counter() - t0) * 1000
                if meter is not None:
                    trips[name] += meter() - before
                if status != 200:
                    raise RuntimeError(f"{name} answered {status} ({api}, {mode})")
                if i >= WARM_UP:
                    times[name].append(elapsed)
        own = times["direct"]
        case = f"{api}, {'tool call' if mode == 'tool_call' else 'text answer'}"
        print(f"{case:22} {'stand-in, direct':22} {statistics.median(own):7.2f}")
        added = {t.name: [b - a for a, b in zip(own, times[t.name], strict=True)] for t in targets}
        ref = statistics.median(added["LiteLLM proxy"]) if "LiteLLM proxy" in added else None
        for t in targets:
            mid = statistics.median(added[t.name])
            ratio = f"{mid / ref:10.2f}" if ref else f"{'':10}"
            per_turn = ""
            if t.trips is not None:  # in process: its store round trips and Python calls
                calls = _calls_per_turn(t, api, CALLS_TURNS)
                per_turn = f" {trips[t.name] / args.turns:10.2f} {calls:10.0f}"
            print(
                f"{'':22} {t.name:22} {statistics.median(times[t.name]):7.2f} {mid:9.2f} "
                f"{_pct(added[t.name], 90):9.2f} {ratio}{per_turn}"
            )
    print("load average at end " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    if shutil.which("redis-server") is None:
        sys.exit("redis-server is needed (apt-get install redis-server)")
    main()

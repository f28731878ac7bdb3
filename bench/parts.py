"""CPU time per request, by part, measured in process (``bench/profile.py``'s default).

Each route's requests go through the app's WSGI callable (no HTTP server, no
socket on the client side), and the functions that make up each part are
wrapped with a timer of the process's CPU time (:func:`time.process_time`:
time waiting on the store is not counted). A part's time is exclusive: a
part called inside another (the store client inside the transaction, the
metrics inside the log call) is counted for the inner one only; what no part
claims (Flask's and werkzeug's dispatch, the request and response objects,
the hooks) is ``framework``.

The parts (:data:`PART_NAMES`):

- ``parse``: the body read and decoded as JSON (the sidecar's
  ``read_json_object``; the floor's ``request.get_json``);
- ``auth``: the token, origin and host checks (the ``_authenticate`` hook; on
  the hot path, ``HotRoutes._plain``);
- ``validate``: the body's pydantic validation (``parse_body``, ``parse_query``,
  a model's ``model_validate``);
- ``fingerprint``: canonical JSON and keyed fingerprints (``sidecar.canonical``);
- ``service``: the decision around the transaction (services and the rules);
- ``transaction``: the store layer (reads, plans, documents, the script's
  arguments), the floor's store work;
- ``store client``: redis-py or psycopg, the socket included;
- ``render``: the answer's model and its JSON;
- ``log``: the decision log line (built and written to a discarded stream);
- ``metrics``: every prometheus call (labels, counters, the histogram).
"""

from __future__ import annotations

import functools
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

PART_NAMES = (
    "parse",
    "auth",
    "validate",
    "fingerprint",
    "service",
    "transaction",
    "store client",
    "render",
    "log",
    "metrics",
    "framework",
)

clock = time.process_time


class Parts:
    """Exclusive CPU time per part, over the requests of one :meth:`request` each."""

    def __init__(self) -> None:
        self.totals: Counter[str] = Counter()
        self.requests = 0
        self._stack: list[str] = []
        self._mark = 0.0

    def _switch(self, now: float) -> None:
        self.totals[self._stack[-1]] += now - self._mark
        self._mark = now

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        if getattr(fn, "__bench_part__", None):
            return fn

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self._stack:
                return fn(*args, **kwargs)
            self._switch(clock())
            self._stack.append(part)
            try:
                return fn(*args, **kwargs)
            finally:
                self._switch(clock())
                self._stack.pop()

        timed.__bench_part__ = part  # type: ignore[attr-defined]
        return timed

    def request(self, app: Callable[..., Any], environ: dict[str, Any]) -> bytes:
        """One WSGI call, its time added to the parts (``framework`` for the rest)."""
        status: list[str] = []

        def start_response(s: str, headers: Any, exc_info: Any = None) -> None:
            status.append(s)

        self._stack = ["framework"]
        self._mark = clock()
        try:
            body = b"".join(app(environ, start_response))
        finally:
            self._switch(clock())
            self._stack = []
        self.requests += 1
        if not status[0].startswith("2"):
            raise RuntimeError(f"{environ['PATH_INFO']}: {status[0]}: {body[:300]!r}")
        return body

    def per_request_us(self) -> dict[str, float]:
        n = max(1, self.requests)
        return {k: v / n * 1e6 for k, v in self.totals.items()}


def patch_function(parts: Parts, part: str, module: ModuleType, name: str) -> None:
    """Wrap ``module.name`` and every ``from module import name`` binding of it."""
    original = getattr(module, name, None)
    if original is None:
        return
    timed = parts.wrap(part, original)
    for mod in list(sys.modules.values()):
        if mod is None or not getattr(mod, "__name__", "").startswith(("sidecar", "bench")):
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                setattr(mod, attr, timed)


def patch_method(parts: Parts, part: str, cls: type, name: str) -> None:
    original = cls.__dict__.get(name)
    if original is None:
        return
    if isinstance(original, classmethod):
        setattr(cls, name, classmethod(parts.wrap(part, original.__func__)))
    elif isinstance(original, staticmethod):
        setattr(cls, name, staticmethod(parts.wrap(part, original.__func__)))
    else:
        setattr(cls, name, parts.wrap(part, original))


def patch_object(parts: Parts, part: str, obj: Any, names: Iterable[str] | None = None) -> None:
    """Wrap the public methods of one object (its instance attributes shadow them)."""
    for name in names if names is not None else dir(obj):
        if name.startswith("_"):
            continue
        value = getattr(obj, name, None)
        if callable(value) and not isinstance(value, type):
            setattr(obj, name, parts.wrap(part, value))


def instrument_common(parts: Parts) -> None:
    """The parts both sides share: the store clients, the metrics, flask's JSON."""
    import flask.json.provider
    import pydantic
    import redis.client
    import werkzeug.wrappers.request

    patch_method(parts, "store client", redis.client.Redis, "execute_command")
    patch_method(parts, "store client", redis.client.Pipeline, "execute")
    patch_method(parts, "parse", werkzeug.wrappers.request.Request, "get_json")
    patch_method(parts, "render", flask.json.provider.DefaultJSONProvider, "response")
    for name in ("model_dump", "model_dump_json"):
        patch_method(parts, "render", pydantic.BaseModel, name)
    try:
        import prometheus_client.metrics as pm
    except ImportError:
        return
    patch_method(parts, "metrics", pm.MetricWrapperBase, "labels")
    patch_method(parts, "metrics", pm.Counter, "inc")
    patch_method(parts, "metrics", pm.Histogram, "observe")


def instrument_sidecar(parts: Parts, app: Any) -> None:
    """Wrap the sidecar's parts (call after ``create_app``)."""
    import pydantic

    from sidecar import canonical, metrics
    from sidecar.api import answer, body, decisions

    try:  # (a checkout before the hot path has none)
        from sidecar.api import hot
    except ImportError:
        hot = None  # type: ignore[assignment]

    instrument_common(parts)
    patch_function(parts, "parse", body, "read_json_object")
    patch_function(parts, "parse", body, "decode_json_object")
    for name in ("parse_body", "parse_query", "validate_body"):
        patch_function(parts, "validate", body, name)
    # The hot path (sidecar.api.hot) validates with the body's model itself.
    patch_method(parts, "validate", pydantic.BaseModel, "model_validate")
    if hot is not None:
        patch_method(parts, "auth", hot.HotRoutes, "_plain")
    patch_function(parts, "render", answer, "answer_text")
    for name in ("canonical_json", "_to_js_numbers"):
        patch_function(parts, "fingerprint", canonical, name)
    patch_method(parts, "fingerprint", canonical.Fingerprinter, "fingerprint")
    patch_method(parts, "fingerprint", canonical.Fingerprinter, "fingerprints")
    patch_method(parts, "fingerprint", canonical.Fingerprinter, "key_hash")
    patch_method(parts, "fingerprint", canonical.Fingerprinter, "mac")
    patch_function(parts, "log", decisions, "log_decision")
    patch_function(parts, "log", decisions, "record_decision")
    for name in ("label", "decided", "observe"):
        patch_method(parts, "metrics", metrics.Metrics, name)
    if hasattr(body, "json_response"):
        patch_function(parts, "render", body, "json_response")
    # The response models' constructors (``X.of(...)``) are part of rendering.
    for modname, mod in list(sys.modules.items()):
        if not modname.startswith("sidecar.api."):
            continue
        for value in list(vars(mod).values()):
            if (
                isinstance(value, type)
                and issubclass(value, pydantic.BaseModel)
                and "of" in value.__dict__
            ):
                patch_method(parts, "render", value, "of")
    rt = app.extensions["loopstop"]
    for service in (rt.operations, rt.chains, rt.tasks):
        patch_object(parts, "service", service)
    store = rt.store
    for name in ("transact", "get_many", "index_page", "index_count"):
        setattr(store, name, parts.wrap("transaction", getattr(store, name)))
    funcs = app.before_request_funcs.get(None, [])
    app.before_request_funcs[None] = [
        parts.wrap("auth", f) if f.__name__ == "_authenticate" else f for f in funcs
    ]


def instrument_floor(parts: Parts, work: dict[str, Callable[[str], None]]) -> None:
    """Wrap the floor's parts: its store work (the routes' ``work`` dict) and its
    answer's ``json.dumps``."""
    import json
    import types

    import floors

    instrument_common(parts)
    for name, fn in list(work.items()):
        work[name] = parts.wrap("transaction", fn)
    floors.json = types.SimpleNamespace(  # type: ignore[assignment]
        dumps=parts.wrap("render", json.dumps), loads=json.loads
    )


# -- the driver ---------------------------------------------------------------

ROUTES = ("begin", "begin+commit", "activation", "tool call+result")
HEADERS_JSON = {"Content-Type": "application/json"}


def _environ(path: str, body: dict[str, Any], token: str) -> dict[str, Any]:
    import json

    from werkzeug.test import EnvironBuilder

    builder = EnvironBuilder(
        path=path,
        method="POST",
        data=json.dumps(body),
        headers={**HEADERS_JSON, "Authorization": f"Bearer {token}", "Host": "127.0.0.1"},
        environ_base={"REMOTE_ADDR": "127.0.0.1"},
    )
    try:
        return builder.get_environ()
    finally:
        builder.close()


class Driver:
    """Sends one route's requests to one app (the floor's or the sidecar's)."""

    def __init__(self, parts: Parts, app: Any, token: str, tag: str) -> None:
        self.parts, self.app, self.token, self.tag = parts, app, token, tag
        self.n = 0
        self.tasks: list[str] = []
        self.pending: dict[str, str] = {}

    def post(self, path: str, body: dict[str, Any], timed: bool = True) -> dict[str, Any]:
        import json

        environ = _environ(path, body, self.token)
        if timed:
            raw = self.parts.request(self.app, environ)
        else:
            raw = b"".join(self.app(environ, lambda *a: None))
        return json.loads(raw) if raw else {}

    def begin(self) -> str:
        self.n += 1
        op = f"prof-{self.tag}-{self.n}"
        self.post(f"/v1/operations/{op}/begin", {"payload": {"n": self.n}, "workflow": "bench"})
        return op

    def commit(self, op: str) -> None:
        body = {"attempt": 1, "workflow": "bench", "receipt": {"op": op}}
        self.post(f"/v1/operations/{op}/commit", body)

    def activation(self) -> None:
        self.n += 1
        key = f"evt-{self.tag}-{self.n}"
        body = {
            "workflow": "bench",
            "event_key": key,
            "subject_key": key,
            "content": {"id": self.n, "status": "new"},
        }
        self.post("/v1/activations", body)

    def tool_round(self) -> None:
        """One task's tool call and its result (two requests)."""
        self.n += 1
        task = self.tasks[self.n % len(self.tasks)]
        body = {"tool": "search", "kind": "read", "args": {"q": self.n, "t": task}}
        answer = self.post(f"/v1/tasks/{task}/tool-calls", body)
        call = answer.get("call_id") or f"k{self.n:016x}"
        self.post(
            f"/v1/tasks/{task}/tool-calls/{call}/result",
            {"status": "ok", "result": {"n": self.n}},
        )

    def run(self, route: str, requests: int) -> None:
        if route == "begin":
            for _ in range(requests):
                self.begin()
        elif route == "begin+commit":
            for _ in range(requests // 2):
                self.commit(self.begin())
        elif route == "activation":
            for _ in range(requests):
                self.activation()
        else:
            for _ in range(requests // 2):
                self.tool_round()


def _sidecar(url: str, tmp: Any) -> tuple[Any, Callable[[int], list[str]]]:
    import logging
    import os

    from run import SECRET, TASK_LIMITS, TOKEN

    from sidecar.app import create_app

    config = {
        "store": url,
        "tokens": [{"name": "bench", "env": "BENCH_TOKEN", "workflows": ["*"], "admin": True}],
        "operations": {"retention_s": 3600, "max_open_per_workflow": 1_000_000},
        "chains": {
            "default": {
                "rate_limit": 1_000_000,
                "workflow_rate_limit": 1_000_000,
                "max_activations": 1_000_000,
            }
        },
    }
    env = {"LOOPSTOP_SECRET": SECRET, "BENCH_TOKEN": TOKEN, "LOOPSTOP_STORE": url}
    # As `loopstop serve` logs: one JSON line per decision (here to a discarded stream).
    decisions = logging.getLogger("loopstop.decisions")
    decisions.setLevel(logging.INFO)
    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115
    handler.setFormatter(logging.Formatter("%(message)s"))
    decisions.addHandler(handler)
    decisions.propagate = False
    app = create_app(config, environ=env)
    client = app.test_client()

    def make_tasks(n: int) -> list[str]:
        limits = TASK_LIMITS
        ids = []
        for _ in range(n):
            r = client.post(
                "/v1/tasks",
                json={"workflow": "bench", "limits": limits},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            ids.append(r.get_json()["task"]["task_id"])
        return ids

    return app, make_tasks


def _floor(url: str) -> tuple[Any, dict[str, Callable[[str], None]]]:
    """The floor's app on ``url`` and its store work (the dict its routes call)."""
    import os

    import floors

    os.environ["FLOOR_STORE"] = url
    make_work = floors.redis_work
    kept: dict[str, Callable[[str], None]] = {}

    def keep(u: str) -> Any:
        kept.update(make_work(u))
        return kept  # the routes look their work up in this dict at each request

    floors.redis_work = keep  # type: ignore[assignment]
    try:
        return floors.create_app(), kept
    finally:
        floors.redis_work = make_work  # type: ignore[assignment]


def metrics_cost() -> int:
    """Time prometheus' calls per decision in both modes (a subprocess each)."""
    import subprocess
    import tempfile

    code = r"""
import os, sys, time
from prometheus_client import Counter, Histogram, CollectorRegistry
r = CollectorRegistry()
c = Counter("d_total", "d", ["route", "decision", "reason"], registry=r)
h = Histogram("s", "s", ["route"], registry=r)
bound = c.labels("operations.begin", "execute", "new")
hb = h.labels("operations.begin")
N = 100000
def t(f):
    s = time.process_time()
    for _ in range(N): f()
    return (time.process_time() - s) / N * 1e9
inc = t(lambda: c.labels("operations.begin", "execute", "new").inc())
observe = t(lambda: h.labels("operations.begin").observe(0.002))
print(f"{sys.argv[1]:<13} labels+inc {inc:5.0f} ns, bound inc {t(bound.inc):5.0f} ns, "
      f"labels+observe {observe:5.0f} ns, bound observe {t(lambda: hb.observe(0.002)):5.0f} ns")
"""
    import os
    import sys

    for mode in ("single", "multiprocess"):
        env = dict(os.environ)
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        with tempfile.TemporaryDirectory() as folder:
            if mode == "multiprocess":
                env["PROMETHEUS_MULTIPROC_DIR"] = folder
            subprocess.run([sys.executable, "-c", code, mode], env=env, check=True)
    return 0


def main(args: Any) -> int:
    """The in-process table: CPU microseconds per request, by part, floor and sidecar."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    tmp = Path(tempfile.mkdtemp(prefix="loopstop-parts-"))
    # As under `loopstop serve`: prometheus in multiprocess mode (read at its import).
    (tmp / "prom").mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(tmp / "prom")
    import run

    if args.store != "redis":
        print("the in-process profile runs on redis only", file=sys.stderr)
        return 2
    redis_proc, port, _client = run.start_redis(tmp)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        parts = Parts()  # one: the shared libraries' wrappers report to it
        floor_app, floor_work = _floor(url)
        floor = Driver(parts, floor_app, run.TOKEN, "f")
        floor.tasks = [f"t{i:020x}" for i in range(16)]
        app, make_tasks = _sidecar(url, tmp)
        side = Driver(parts, app, run.TOKEN, "s")
        side.tasks = make_tasks(16)
        routes = [r for r in args.scenarios.split(",") if r in ROUTES]
        sides = (("floor", floor), ("sidecar", side))
        for _, driver in sides:  # warm up every route
            for route in routes:
                driver.run(route, 200)
        if "tool call+result" in routes:
            # Every task's history full (its last CALL_HISTORY calls), as a
            # long-running agent's and as bench/run.py's tasks reach in a run:
            # the floor's task document is that size too (floors.TASK_DOC_BYTES).
            from sidecar.core.tasks.state import CALL_HISTORY

            side.run("tool call+result", 2 * CALL_HISTORY * len(side.tasks))

        def measure(into: dict[str, dict[str, list[dict[str, float]]]]) -> None:
            # Rounds alternate the two sides, so both see the same moments of load.
            for _ in range(args.rounds):
                for route in routes:
                    for tag, driver in sides:
                        parts.totals.clear()
                        parts.requests = 0
                        driver.run(route, args.requests // args.rounds)
                        into.setdefault(route, {}).setdefault(tag, []).append(
                            parts.per_request_us()
                        )

        calls = {
            (route, tag): calls_per_request(driver, route, CALLS_REQUESTS)
            for route in routes
            for tag, driver in sides
        }
        # First with no part wrapped (the true total: a wrapper costs about a
        # microsecond), then with every part wrapped (the split).
        plain: dict[str, dict[str, list[dict[str, float]]]] = {}
        measure(plain)
        instrument_floor(parts, floor_work)
        instrument_sidecar(parts, app)
        split: dict[str, dict[str, list[dict[str, float]]]] = {}
        measure(split)
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)

    def best(rounds: list[dict[str, float]]) -> dict[str, float]:
        return min(rounds, key=lambda r: sum(r.values()))  # the least disturbed round

    print(
        f"\nCPU microseconds per request, in process on redis ({args.requests} requests a "
        f"route in {args.rounds} rounds, the least of the rounds; load average "
        f"{os.getloadavg()[0]:.1f}): floor / sidecar\n"
    )
    print(f"{'part':<14}" + "".join(f" {r:>22}" for r in routes))
    for part in PART_NAMES:
        cells = []
        for route in routes:
            f, sc = best(split[route]["floor"]), best(split[route]["sidecar"])
            cells.append(f" {f.get(part, 0.0):>10.0f} / {sc.get(part, 0.0):>9.0f}")
        print(f"{part:<14}" + "".join(cells))
    for label, table in (("total (split)", split), ("total (plain)", plain)):
        cells = []
        for route in routes:
            f, sc = best(table[route]["floor"]), best(table[route]["sidecar"])
            cells.append(f" {sum(f.values()):>10.0f} / {sum(sc.values()):>9.0f}")
        print(f"{label:<14}" + "".join(cells))
    ratios = []
    for route in routes:
        f, sc = best(plain[route]["floor"]), best(plain[route]["sidecar"])
        ratios.append(sum(f.values()) / sum(sc.values()))
    print(f"{'floor/sidecar':<14}" + "".join(f" {x:>22.2f}" for x in ratios))
    cells = [f" {calls[(r, 'floor')]:>10.0f} / {calls[(r, 'sidecar')]:>9.0f}" for r in routes]
    print(f"{'Python calls':<14}" + "".join(cells))
    return 0


#: Requests a route is sent with its Python calls counted (:func:`calls_per_request`).
CALLS_REQUESTS = 400


def calls_per_request(driver: Driver, route: str, requests: int) -> float:
    """Function calls per request of ``route``, Python and C functions alike
    (:func:`sys.setprofile`'s ``call`` and ``c_call`` events, as :mod:`cProfile`
    counts them): a figure the machine's load cannot move."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call" or event == "c_call":
            calls += 1

    app = driver.app

    def counted(environ: dict[str, Any], start_response: Any) -> Any:
        sys.setprofile(count)
        try:
            return list(app(environ, start_response))
        finally:
            sys.setprofile(None)

    driver.app = counted
    try:
        driver.run(route, requests)
    finally:
        driver.app = app
    return calls / requests

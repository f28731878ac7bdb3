"""Floors: per route and per store, the least store work a decision needs, and nothing else.

bench/run.py serves these apps under the same gunicorn worker class and
settings as ``loopstop serve`` (:class:`sidecar.serving.BoundedThreadWorker`,
8 threads, keep-alive 5 s), parses each body like the sidecar does and
answers a JSON body the size of a decision. What each route does on its
store, in one Redis script (one round trip) or one SQL transaction:

- begin: reserve the operation if absent, else answer what is there
  (Redis: ``GET``, ``SET PX``; SQL: ``INSERT ... ON CONFLICT DO NOTHING``,
  then a ``SELECT`` only when it was there).
- commit: read the operation and, if it is in progress, write it settled
  (Redis: ``GET``, ``SET PX``; SQL: one conditional ``UPDATE``).
- activation: reserve the event key, write the chain record, bump the
  workflow's rate counter (Redis: ``SET NX PX``, ``SET PX``, ``INCR``; SQL:
  one transaction of the three).
- tool call and result: read the task's document and write it back (the
  decision needs the task's counters and its recent calls; the document is
  :data:`TASK_DOC_BYTES` long, as a task's with its last 200 calls).
- a model turn: the task's transaction, then the body forwarded to the
  upstream ``FLOOR_UPSTREAM`` names with urllib3, as the gate sends it, and its
  answer relayed (the model gate
  admits the turn, forwards it, then counts its usage: a second transaction
  the floor leaves out, so the floor is the least any gate could do).

``FLOOR_STORE`` picks the store: ``redis://...``, ``sqlite:///path``
(WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE``, as the sidecar's) or
``postgresql://...``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

import urllib3
from bare import BODY
from flask import Flask, Response, request

#: The size of the task document the tool-call floor reads and writes (bytes):
#: a task's document after 200 calls, as the sidecar stores it.
TASK_DOC_BYTES = int(os.environ.get("FLOOR_TASK_DOC_BYTES", "36000"))
TTL_MS = 3_600_000
JSON = {"Content-Type": "application/json"}

OP_DOC = json.dumps(BODY["operation"], separators=(",", ":"))
SETTLED = OP_DOC.replace('"in_progress"', '"committed"')
TASK_DOC = json.dumps({"task_id": "t", "pad": "x" * max(0, TASK_DOC_BYTES - 32)})
CHAIN_DOC = json.dumps({"chain_id": "c", "activations": 1, "pad": "x" * 300})

BEGIN_LUA = """
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""
COMMIT_LUA = """
local v = redis.call('GET', KEYS[1])
if not v or not string.find(v, '"in_progress"', 1, true) then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
ACTIVATION_LUA = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('INCR', KEYS[3])
return 1
"""
TASK_LUA = """
local v = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return v and 1 or 0
"""

Work = dict[str, Callable[[str], None]]


def redis_work(url: str) -> Work:
    import redis

    client = redis.Redis.from_url(url, decode_responses=True)
    begin, commit, activation, task = (
        client.register_script(s) for s in (BEGIN_LUA, COMMIT_LUA, ACTIVATION_LUA, TASK_LUA)
    )
    return {
        "begin": lambda key: begin(keys=["floor:op:" + key], args=[OP_DOC, TTL_MS]),
        "commit": lambda key: commit(keys=["floor:op:" + key], args=[SETTLED, TTL_MS]),
        "activation": lambda key: activation(
            keys=["floor:evt:" + key, "floor:chain:" + key, "floor:rate:bench"],
            args=[CHAIN_DOC, TTL_MS],
        ),
        "task": lambda key: task(keys=["floor:task:" + key], args=[TASK_DOC, TTL_MS]),
    }


SQL_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS floor_kv (key TEXT PRIMARY KEY, doc TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS floor_counter (key TEXT PRIMARY KEY, n BIGINT NOT NULL)",
)


def sql_work(connect: Callable[[], Any], mark: str, begin_sql: str) -> Work:
    """The routes' transactions on a DB-API connection per thread.

    :param mark: the driver's placeholder (``?`` or ``%s``).
    :param begin_sql: how a write transaction starts.
    """
    local = threading.local()

    def conn() -> Any:
        if not hasattr(local, "conn"):
            local.conn = connect()
        return local.conn

    def q(sql: str) -> str:
        return sql.replace("?", mark)

    def transaction(steps: Callable[[Any], None]) -> None:
        c = conn()
        c.execute(begin_sql)
        try:
            steps(c)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def begin(key: str) -> None:
        def steps(c: Any) -> None:
            cur = c.execute(
                q("INSERT INTO floor_kv (key, doc) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"),
                ("op:" + key, OP_DOC),
            )
            if cur.rowcount == 0:
                c.execute(q("SELECT doc FROM floor_kv WHERE key = ?"), ("op:" + key,)).fetchone()

        transaction(steps)

    def commit(key: str) -> None:
        transaction(
            lambda c: c.execute(
                q("UPDATE floor_kv SET doc = ? WHERE key = ? AND doc LIKE ?"),
                (SETTLED, "op:" + key, '%"in_progress"%'),
            )
        )

    def activation(key: str) -> None:
        def steps(c: Any) -> None:
            cur = c.execute(
                q("INSERT INTO floor_kv (key, doc) VALUES (?, '1') ON CONFLICT (key) DO NOTHING"),
                ("evt:" + key,),
            )
            if cur.rowcount:
                c.execute(
                    q("INSERT INTO floor_kv (key, doc) VALUES (?, ?)"),
                    ("chain:" + key, CHAIN_DOC),
                )
                c.execute(
                    q(
                        "INSERT INTO floor_counter (key, n) VALUES ('bench', 1) "
                        "ON CONFLICT (key) DO UPDATE SET n = floor_counter.n + 1"
                    )
                )

        transaction(steps)

    def task(key: str) -> None:
        def steps(c: Any) -> None:
            c.execute(q("SELECT doc FROM floor_kv WHERE key = ?"), ("task:" + key,)).fetchone()
            c.execute(
                q(
                    "INSERT INTO floor_kv (key, doc) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET doc = excluded.doc"
                ),
                ("task:" + key, TASK_DOC),
            )

        transaction(steps)

    return {"begin": begin, "commit": commit, "activation": activation, "task": task}


def sqlite_work(path: str) -> Work:
    def connect() -> sqlite3.Connection:
        c = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        c.execute("PRAGMA journal_mode=WAL")
        c.execute("PRAGMA synchronous=FULL")
        return c

    with connect() as c:
        for ddl in SQL_SCHEMA:
            c.execute(ddl)
    return sql_work(connect, "?", "BEGIN IMMEDIATE")


def postgres_work(url: str) -> Work:
    import psycopg

    def connect() -> Any:
        return psycopg.connect(url, autocommit=True)

    with connect() as c:
        for ddl in SQL_SCHEMA:
            c.execute(ddl)
    return sql_work(connect, "%s", "BEGIN")


def create_app() -> Flask:
    """The floor app of the store ``FLOOR_STORE`` names."""
    url = os.environ["FLOOR_STORE"]
    if url.startswith("redis"):
        work = redis_work(url)
    elif url.startswith("sqlite:///"):
        work = sqlite_work(url.removeprefix("sqlite:///"))
    else:
        work = postgres_work(url)
    app = Flask("floor")

    def answer(op: str | None = None, body: dict[str, Any] | None = None) -> Response:
        out = dict(BODY)
        if op is not None:
            out["operation"] = {**BODY["operation"], "operation_id": op}
        if body:
            out.update(body)
        return Response(json.dumps(out, separators=(",", ":")), mimetype="application/json")

    @app.post("/v1/operations/<op>/begin")
    def begin(op: str) -> Response:
        request.get_json(silent=True)
        work["begin"](op)
        return answer(op)

    @app.post("/v1/operations/<op>/commit")
    def commit(op: str) -> Response:
        request.get_json(silent=True)
        work["commit"](op)
        return answer(op, {"decision": "committed"})

    @app.post("/v1/activations")
    def activation() -> Response:
        body = request.get_json(silent=True) or {}
        work["activation"](str(body.get("event_key")))
        return answer()

    @app.post("/v1/tasks/<task>/tool-calls")
    def tool_call(task: str) -> Response:
        request.get_json(silent=True)
        work["task"](task)
        return answer(None, {"task_id": task, "call_id": "k" + os.urandom(8).hex()})

    upstream = os.environ.get("FLOOR_UPSTREAM", "")
    pool = urllib3.PoolManager(maxsize=16, retries=False)

    @app.post("/v1/openai/chat/completions")
    @app.post("/v1/openai/responses", endpoint="model_turn_responses")
    def model_turn() -> Response:
        body = request.get_json(silent=True) or {}
        first = (body.get("messages") or body.get("input") or [{}])[0]
        system = str(first.get("content", "")) if isinstance(first, dict) else ""
        work["task"](system.rpartition("loopstop-task: ")[2].strip() or "turn")
        path = request.path.removeprefix("/v1/openai")
        r = pool.request(  # n8n's bytes, as the gate forwards an unchanged body
            "POST", f"{upstream}{path}", body=request.get_data(), headers=JSON, timeout=10
        )
        return Response(r.data, r.status, mimetype="application/json")

    @app.post("/v1/tasks/<task>/tool-calls/<call>/result")
    def tool_result(task: str, call: str) -> Response:
        request.get_json(silent=True)
        work["task"](task)
        return answer(None, {"task_id": task, "decision": "recorded"})

    return app

"""Baselines bench/run.py compares the sidecar with, under the same gunicorn
settings:

- ``create_app()``: a bare Flask route answering a JSON body the size of a
  sidecar decision.
- ``create_redis_app()``: the same route plus the two Redis commands a
  sidecar decision makes (``MGET`` of the record, then the compare-and-set
  script ``cas.lua`` writing it), through the same client library, and
  nothing else: the ceiling any read-then-conditional-write design reaches
  on the machine. ``BARE_REDIS_URL`` names the Redis.
- ``create_postgres_app()``: the same route plus the least a PostgreSQL
  decision needs, one transaction in the sidecar's two round trips (a
  ``SELECT`` of the record, then ``BEGIN``, an upsert and ``COMMIT`` in one
  pipeline) through psycopg. ``BARE_PG_URL`` names the database.
"""

from __future__ import annotations

import json
import os
import uuid
from importlib import resources

import psycopg
import redis
from flask import Flask, Response, jsonify, request

BODY = {
    "decision": "execute",
    "reason": "new",
    "operation": {
        "operation_id": "bench-000000",
        "state": "in_progress",
        "attempt": 1,
        "receipt": None,
        "result": None,
        "workflow": "bench",
        "task_id": None,
        "chain_id": None,
        "execution_mode": "production",
        "created_at": "2026-11-30T00:00:00.000Z",
        "updated_at": "2026-11-30T00:00:00.000Z",
        "lease_expires_at": "2026-11-30T00:01:00.000Z",
        "last_failure": None,
        "reconciliation": None,
    },
}
ROUTES = (
    "/v1/operations/<op>/<verb>",
    "/v1/activations",
    "/v1/tasks/<task>/tool-calls",
    "/v1/tasks/<task>/tool-calls/<call>/result",
)


def create_app() -> Flask:
    app = Flask("bare")

    def answer(**_: str) -> Response:
        request.get_json(silent=True)  # parse the body as the sidecar does
        return jsonify(BODY)

    for path in ROUTES:
        app.add_url_rule(path, "answer", answer, methods=["POST"])
    return app


def create_redis_app() -> Flask:
    client = redis.Redis.from_url(os.environ["BARE_REDIS_URL"], decode_responses=True)
    cas = client.register_script(
        resources.files("sidecar.store").joinpath("lua/cas.lua").read_text()
    )
    app = Flask("bare-redis")

    def answer(**_: str) -> Response:
        request.get_json(silent=True)
        key = "bare:" + uuid.uuid4().hex
        (raw,) = client.mget([key])
        doc = json.dumps(BODY["operation"], separators=(",", ":"))
        plan = json.dumps({"w": [[1, 4, "3600000"]], "x": [], "t": [], "i": []})
        cas(keys=[key], args=[1, raw or "", plan, doc])
        return jsonify(BODY)

    for path in ROUTES:
        app.add_url_rule(path, "answer", answer, methods=["POST"])
    return app


def create_postgres_app() -> Flask:
    conn = psycopg.connect(os.environ["BARE_PG_URL"], autocommit=True, prepare_threshold=None)
    conn.execute("CREATE TABLE IF NOT EXISTS bare_kv (key TEXT PRIMARY KEY, doc TEXT NOT NULL)")
    app = Flask("bare-postgres")
    doc = json.dumps(BODY["operation"], separators=(",", ":"))

    def answer(**_: str) -> Response:
        request.get_json(silent=True)
        key = "bare:" + uuid.uuid4().hex
        conn.execute("SELECT doc FROM bare_kv WHERE key = %s", (key,)).fetchone()
        with conn.pipeline():
            conn.execute("BEGIN")
            conn.execute(
                "INSERT INTO bare_kv (key, doc) VALUES (%s, %s) "
                "ON CONFLICT (key) DO UPDATE SET doc = EXCLUDED.doc",
                (key, doc),
            )
            conn.execute("COMMIT")
        return jsonify(BODY)

    for path in ROUTES:
        app.add_url_rule(path, "answer", answer, methods=["POST"])
    return app

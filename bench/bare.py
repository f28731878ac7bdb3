"""The bare baseline bench/run.py compares the sidecar with, under the same
gunicorn settings: ``create_app()``, a Flask route answering a JSON body the
size of a sidecar decision. The floors per store (that route plus the least
store work of each decision) are bench/floors.py's.
"""

from __future__ import annotations

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
    "/v1/openai/chat/completions",
)


def create_app() -> Flask:
    app = Flask("bare")

    def answer(**_: str) -> Response:
        request.get_json(silent=True)  # parse the body as the sidecar does
        return jsonify(BODY)

    for path in ROUTES:
        app.add_url_rule(path, "answer", answer, methods=["POST"])
    return app

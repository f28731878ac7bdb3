"""The hot path (sidecar.api.hot): the decision routes n8n calls on every item
are served without Flask's per-request machinery, answer exactly as the Flask
path answers, and leave every request that is not plain to Flask."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask, request_started
from werkzeug.test import TestResponse

from conftest import N8N_TOKEN, SCOPED_TOKEN, AppFactory, flask_only, served_by_flask

BEARER = {"Authorization": f"Bearer {N8N_TOKEN}"}


@pytest.fixture
def app(make_app: AppFactory) -> Flask:
    return make_app()


@pytest.fixture
def flask_served(app: Flask) -> Iterator[list[str]]:
    with served_by_flask(app) as seen:
        yield seen


def _post(client: Any, path: str, body: Any, **headers: str) -> TestResponse:
    return client.post(path, json=body, headers={**BEARER, **headers})  # type: ignore[no-any-return]


def _task(app: Flask) -> str:
    r = _post(app.test_client(), "/v1/tasks", {"workflow": "wf"})
    assert r.status_code == 201, r.json
    return str(r.json["task"]["task_id"])  # type: ignore[index]


def _same(hot: TestResponse, flask: TestResponse, *ids: tuple[str, str]) -> None:
    """The two answers are one: status, header names in order, headers but the
    request id, and the body once the hot request's ids read as the Flask one's."""
    assert hot.status == flask.status
    assert [k for k, _ in hot.headers] == [k for k, _ in flask.headers]
    hot_headers = {k: v for k, v in hot.headers if k not in ("X-Request-Id", "Content-Length")}
    flask_headers = {k: v for k, v in flask.headers if k not in ("X-Request-Id", "Content-Length")}
    assert hot_headers == flask_headers
    text = hot.get_data(as_text=True)
    for mine, theirs in ids:
        text = text.replace(mine, theirs)
    assert json.loads(text) == flask.json


def test_plain_decision_requests_are_served_without_flask(
    app: Flask, flask_served: list[str]
) -> None:
    client = app.test_client()
    task = _task(app)
    flask_served.clear()
    answers = [
        _post(client, "/v1/operations/op-1/begin", {"payload": {"n": 1}, "workflow": "wf"}),
        _post(
            client,
            "/v1/operations/op-1/commit",
            {"attempt": 1, "receipt": {"id": 7}, "workflow": "wf"},
        ),
        _post(client, "/v1/activations", {"workflow": "wf", "event_key": "e-1"}),
        _post(client, f"/v1/tasks/{task}/tool-calls", {"tool": "search", "kind": "read"}),
    ]
    call_id = answers[-1].json["call_id"]  # type: ignore[index]
    answers.append(_post(client, f"/v1/tasks/{task}/tool-calls/{call_id}/result", {"status": "ok"}))
    assert [r.status_code for r in answers] == [200] * 5, [r.json for r in answers]
    assert flask_served == []
    for r in answers:
        assert r.headers["Content-Type"] == "application/json"
        assert r.headers["Cache-Control"] == "no-store"
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert len(r.headers["X-Request-Id"]) == 32
        assert int(r.headers["Content-Length"]) == len(r.get_data())


def test_open_mode_serves_loopback_callers_hot(make_app: AppFactory) -> None:
    app = make_app(tokens=False)
    seen: list[str] = []
    request_started.connect(lambda sender, **_: seen.append("flask"), app, weak=False)
    client = app.test_client()
    body = {"payload": {"n": 1}}
    ok = client.post("/v1/operations/o/begin", json=body, headers={"Host": "127.0.0.1"})
    assert ok.status_code == 200 and seen == []
    # A foreign Host (DNS rebinding) is Flask's to refuse.
    refused = client.post("/v1/operations/p/begin", json=body, headers={"Host": "evil.example"})
    assert refused.status_code == 421 and seen == ["flask"]


def test_hot_answers_are_the_flask_answers(app: Flask) -> None:
    hot, flask = app.test_client(), flask_only(app)
    body = {"payload": {"n": 1}, "workflow": "wf", "execution_id": "77"}
    _same(
        _post(hot, "/v1/operations/a/begin", body),
        _post(flask, "/v1/operations/b/begin", body),
        ('"a"', '"b"'),
    )
    commit = {"attempt": 1, "receipt": {"id": 7}, "result": {"url": "u"}, "workflow": "wf"}
    _same(
        _post(hot, "/v1/operations/a/commit", commit),
        _post(flask, "/v1/operations/b/commit", commit),
        ('"a"', '"b"'),
    )
    # A replay answers the stored receipt.
    _same(
        _post(hot, "/v1/operations/a/begin", body),
        _post(flask, "/v1/operations/b/begin", body),
        ('"a"', '"b"'),
    )


def _masked(value: Any, keys: frozenset[str]) -> Any:
    """``value`` with the values under ``keys`` (at any depth) replaced by ``*``."""
    if isinstance(value, dict):
        return {k: "*" if k in keys else _masked(v, keys) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, keys) for v in value]
    return value


def _same_but(hot: TestResponse, flask: TestResponse, *keys: str) -> None:
    """:func:`_same`, the values under ``keys`` (random ids) left out."""
    assert hot.status == flask.status
    assert [k for k, _ in hot.headers] == [k for k, _ in flask.headers]
    varying = frozenset(keys)
    assert _masked(hot.json, varying) == _masked(flask.json, varying)


def test_hot_activation_and_tool_answers_are_the_flask_answers(
    app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    """Each request is sent twice, through the hot path and through Flask alone,
    on records of its own: the answers and the decision lines are one but for
    their random ids."""
    hot, flask = app.test_client(), flask_only(app)
    ids = ("chain_id", "activation_id", "marker", "task_id", "call_id")

    def both(
        paths: tuple[str, str], body: dict[str, Any], other: dict[str, Any] | None = None
    ) -> tuple[TestResponse, ...]:
        answers = (_post(hot, paths[0], body), _post(flask, paths[1], other or body))
        _same_but(*answers, *ids)
        return answers

    activation = {"workflow": "wf", "content": {"id": 1, "status": "new"}, "trigger": "sheet"}
    with caplog.at_level(logging.INFO, logger="loopstop.decisions"):
        for _ in range(2):  # the second delivery is a duplicate on both paths
            both(
                ("/v1/activations",) * 2,
                {**activation, "event_key": "e-hot"},
                {**activation, "event_key": "e-flask"},
            )
        a, b = (f"/v1/tasks/{_task(app)}" for _ in range(2))
        call = {"tool": "search", "kind": "read", "args": {"q": 1}}
        answers = both((f"{a}/tool-calls", f"{b}/tool-calls"), call)
        hot_call, flask_call = (r.json["call_id"] for r in answers)  # type: ignore[index]
        result = {"status": "ok", "result": {"n": 1}}
        both((f"{a}/tool-calls/{hot_call}/result", f"{b}/tool-calls/{flask_call}/result"), result)
        for _ in range(3):  # the same call again, until the repetition rule denies it
            answers = both((f"{a}/tool-calls", f"{b}/tool-calls"), call)
    assert answers[0].json["decision"] == "deny"  # type: ignore[index]
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "loopstop.decisions"]
    lines = [line for line in lines if line["route"] != "tasks.create"]
    assert len(lines) == 14
    varying = frozenset({*ids, "ts", "request_id", "latency_ms"})
    for hot_line, flask_line in zip(lines[::2], lines[1::2], strict=True):
        assert _masked(hot_line, varying) == _masked(flask_line, varying)


def test_hot_decisions_log_the_flask_lines(app: Flask, caplog: pytest.LogCaptureFixture) -> None:
    hot, flask = app.test_client(), flask_only(app)
    body = {"payload": {"n": 1}, "workflow": "wf", "execution_id": "77"}
    with caplog.at_level(logging.INFO, logger="loopstop.decisions"):
        _post(hot, "/v1/operations/a/begin", body, **{"X-Request-Id": "req-hot"})
        _post(flask, "/v1/operations/b/begin", body, **{"X-Request-Id": "req-flask"})
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "loopstop.decisions"]
    assert len(lines) == 2
    hot_line, flask_line = lines
    assert hot_line["request_id"] == "req-hot" and hot_line["method"] == "POST"
    assert hot_line["token"] == "n8n" and hot_line["latency_ms"] >= 0
    for line in lines:
        for varying in ("ts", "request_id", "latency_ms", "operation_id"):
            line.pop(varying)
    assert hot_line == flask_line


def test_the_request_id_sent_is_echoed(app: Flask) -> None:
    r = _post(
        app.test_client(),
        "/v1/activations",
        {"workflow": "wf", "event_key": "e"},
        **{"X-Request-Id": "n8n-exec-9"},
    )
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "n8n-exec-9"


def test_the_body_read_deadline_is_released(app: Flask) -> None:
    released: list[int] = []
    r = app.test_client().post(
        "/v1/operations/o/begin",
        json={"payload": {}},
        headers=BEARER,
        environ_overrides={"loopstop.request_read": lambda: released.append(1)},
    )
    assert r.status_code == 200 and released == [1]


LEFT_TO_FLASK = {
    "an Origin": ({"Origin": "https://evil.example"}, b'{"payload": {}}', 403),
    "a form's content type": ({"Content-Type": "text/plain"}, b'{"payload": {}}', 415),
    "no token": ({"Authorization": ""}, b'{"payload": {}}', 401),
    "a wrong token": ({"Authorization": "Bearer nope-0123456789"}, b'{"payload": {}}', 401),
    "malformed JSON": ({}, b'{"payload": ', 400),
    "a key named twice": ({}, b'{"payload": {}, "payload": {}}', 400),
    "an invalid field": ({}, b'{"payload": {}, "lease_s": -1}', 422),
    "a blank body (read as {})": ({}, b"   ", 422),
}


@pytest.mark.parametrize("case", list(LEFT_TO_FLASK))
def test_requests_that_are_not_plain_go_to_flask(
    app: Flask, flask_served: list[str], case: str
) -> None:
    extra, data, status = LEFT_TO_FLASK[case]
    headers = {"Content-Type": "application/json", **BEARER, **extra}
    headers = {k: v for k, v in headers.items() if v}
    r = app.test_client().post("/v1/operations/o/begin", data=data, headers=headers)
    assert r.status_code == status, r.json
    assert flask_served == ["/v1/operations/o/begin"]
    if status >= 400:
        assert r.headers["Content-Type"] == "application/problem+json"
        assert r.headers["X-Request-Id"]


def test_a_chunked_body_goes_to_flask(app: Flask, flask_served: list[str]) -> None:
    """gunicorn hands a chunked body over de-chunked, its length unknown
    (``wsgi.input_terminated``): Flask's reader bounds it."""
    r = app.test_client().post(
        "/v1/operations/o/begin",
        data=b'{"payload": {"n": 1}}',
        headers={**BEARER, "Content-Type": "application/json"},
        environ_overrides={"HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input_terminated": True},
    )
    assert r.status_code == 200, r.json
    assert flask_served == ["/v1/operations/o/begin"]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/operations/../begin",
        "/v1/operations/has space/begin",
        "/v1/tasks/not-a-task/tool-calls",
        "/v1/tasks/t0123456789abcdef0123/tool-calls/bad id/result",
    ],
)
def test_a_path_value_off_its_pattern_goes_to_flask(
    app: Flask, flask_served: list[str], path: str
) -> None:
    r = _post(app.test_client(), path, {"payload": {}, "tool": "t", "kind": "read"})
    assert r.status_code in (404, 422), r.json
    assert flask_served == [path]


def test_an_error_a_decision_raises_is_the_flask_error(app: Flask) -> None:
    """A scope refusal and a conflict carrying the record are raised by the
    decision itself: the hot path answers them with the app's error handlers."""
    hot, flask = app.test_client(), flask_only(app)
    scoped = {"Authorization": f"Bearer {SCOPED_TOKEN}"}
    body = {"payload": {"n": 1}, "workflow": "wf-crm"}
    _same(
        _post(hot, "/v1/operations/a/begin", body, **scoped),
        _post(flask, "/v1/operations/b/begin", body, **scoped),
        ('"a"', '"b"'),
    )
    for client, op in ((hot, "c"), (flask, "d")):
        assert _post(client, f"/v1/operations/{op}/begin", {"payload": {}}).status_code == 200
    stale = {"attempt": 9, "receipt": {"id": 1}}
    hot_answer = _post(hot, "/v1/operations/c/commit", stale)
    flask_answer = _post(flask, "/v1/operations/d/commit", stale)
    assert hot_answer.status_code == 409 and hot_answer.json["operation"]["attempt"] == 1  # type: ignore[index]
    _same(hot_answer, flask_answer, ('"c"', '"d"'), ("/c", "/d"), ("'c'", "'d'"))


def test_a_body_cut_short_is_flasks_to_refuse(app: Flask, flask_served: list[str]) -> None:
    """A client that sends fewer bytes than its Content-Length and goes away is
    answered as Flask answers it (werkzeug's reader finds the body cut)."""
    data = b'{"payload": {"n": 1}}'
    answers = []
    for client in (app.test_client(), flask_only(app)):
        answers.append(
            client.post(
                "/v1/operations/o/begin",
                input_stream=io.BytesIO(data[:-5]),
                headers={**BEARER, "Content-Type": "application/json"},
                environ_overrides={"CONTENT_LENGTH": str(len(data))},
            )
        )
    hot, flask = answers
    assert hot.status_code == flask.status_code == 400, hot.json
    assert hot.json == flask.json
    assert flask_served == ["/v1/operations/o/begin"] * 2  # the hot client's went to Flask


class _ResetMidBody(io.RawIOBase):
    """A body whose connection is reset after its first bytes, read as gunicorn's
    reader reads it: the read that meets the reset raises, and the bytes that
    came before it stay buffered for a next read (which then ends)."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data = data
        self.reset = False

    def readable(self) -> bool:
        return True

    def tell(self) -> int:  # werkzeug's test client measures the stream
        return 0

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0

    def readinto(self, buffer: Any) -> int:
        if not self.reset:
            self.reset = True
            raise ConnectionResetError(104, "Connection reset by peer")
        n = min(len(buffer), len(self.data))
        buffer[:n] = self.data[:n]
        self.data = self.data[n:]
        return n


def test_a_connection_reset_mid_body_decides_nothing(app: Flask) -> None:
    """The bytes that came before the reset are a whole JSON body; the rest never
    came. Nothing is decided on them: the answer is Flask's own for a read that
    failed, and a later begin of the id executes."""
    data = b'{"payload": {"to": "x"}, "workflow": "wf"}'
    answers = [
        client.post(
            f"/v1/operations/{op}/begin",
            input_stream=_ResetMidBody(data),
            headers={**BEARER, "Content-Type": "application/json"},
            environ_overrides={"CONTENT_LENGTH": str(len(data) + 5000)},
        )
        for client, op in ((app.test_client(), "o"), (flask_only(app), "p"))
    ]
    hot, flask = answers
    assert hot.status_code == flask.status_code >= 400, hot.json
    assert hot.json == flask.json
    body = {"payload": {"to": "x"}, "workflow": "wf"}
    again = _post(app.test_client(), "/v1/operations/o/begin", body)
    assert again.json["decision"] == "execute"  # type: ignore[index]


@pytest.mark.parametrize(
    "ctype", ["\xa0application/json", "application/json\x85", " application/json"]
)
def test_a_padded_content_type_is_flasks_to_judge(
    app: Flask, flask_served: list[str], ctype: str
) -> None:
    """werkzeug trims only spaces and tabs around a media type: anything else
    around it is Flask's to refuse (415), never read as JSON by the hot path."""
    data = b'{"workflow": "wf", "event_key": "x"}'
    hot = app.test_client().post(
        "/v1/activations", data=data, headers={**BEARER, "Content-Type": ctype}
    )
    flask = flask_only(app).post(
        "/v1/activations", data=data, headers={**BEARER, "Content-Type": ctype}
    )
    assert hot.status_code == flask.status_code
    assert flask_served[0] == "/v1/activations"

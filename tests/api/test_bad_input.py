"""Bad input: the right status, a problem+json body naming the field, and the
ledger unchanged afterwards (every store)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from conftest import N8N_TOKEN, SCOPED_TOKEN, Api, AppFactory, sql_rows

AUTH = {"Authorization": f"Bearer {N8N_TOKEN}"}
BEGIN = "/v1/operations/order-1/begin"


def dump(store_url: str) -> Any:
    """Every stored byte, to prove a rejected request changed nothing."""
    if not store_url.startswith("redis"):
        return sql_rows(store_url, "kv"), sql_rows(store_url, "idx")
    client = redis.Redis.from_url(store_url, decode_responses=True)
    out = {}
    for key in sorted(client.keys("*")):
        kind = client.type(key)
        out[key] = (
            client.get(key) if kind == "string" else client.zrange(key, 0, -1, withscores=True)
        )
    return out


@pytest.fixture
def seeded(make_app: AppFactory, store_url: str) -> tuple[Api, Any]:
    api = Api(make_app(http={"max_body_bytes": 4096}).test_client())
    api.begin("order-1", {"order": 1}, workflow="wf-crm")
    return api, dump(store_url)


CASES: list[tuple[str, dict[str, Any], int, str, list[Any] | None]] = [
    (
        "malformed json",
        {"data": b'{"payload": ', "content_type": "application/json"},
        400,
        "malformed-request",
        None,
    ),
    (
        "not utf-8",
        {"data": b'{"payload": "\xff"}', "content_type": "application/json"},
        400,
        "malformed-request",
        None,
    ),
    (
        "wrong content type",
        {"data": b"payload=1", "content_type": "application/x-www-form-urlencoded"},
        415,
        "unsupported-media-type",
        None,
    ),
    (
        "text/plain json",
        {"data": b'{"payload": 1}', "content_type": "text/plain"},
        415,
        "unsupported-media-type",
        None,
    ),
    ("oversize body", {"json": {"payload": "x" * 5000}}, 413, "payload-too-large", None),
    (
        "unknown field",
        {"json": {"payload": 1, "paylod": 2}},
        422,
        "validation-failed",
        ["body", "paylod"],
    ),
    (
        "missing payload",
        {"json": {"workflow": "wf-crm"}},
        422,
        "validation-failed",
        ["body", "payload"],
    ),
    (
        "NaN in payload",
        {"data": b'{"payload": {"a": [1, NaN]}}', "content_type": "application/json"},
        422,
        "validation-failed",
        ["body", "payload", "a", 1],
    ),
    (
        "Infinity",
        {"data": b'{"payload": -Infinity}', "content_type": "application/json"},
        422,
        "validation-failed",
        ["body", "payload"],
    ),
    (
        "1e400 overflows",
        {"data": b'{"payload": 1e400}', "content_type": "application/json"},
        422,
        "validation-failed",
        ["body", "payload"],
    ),
    ("body not an object", {"json": [1, 2]}, 422, "validation-failed", ["body"]),
    (
        "lease_s not a number",
        {"json": {"payload": 1, "lease_s": "soon"}},
        422,
        "validation-failed",
        ["body", "lease_s"],
    ),
    (
        "negative lease",
        {"json": {"payload": 1, "lease_s": -5}},
        422,
        "validation-failed",
        ["body", "lease_s"],
    ),
    (
        "bad execution mode",
        {"json": {"payload": 1, "execution_mode": "manual"}},
        422,
        "validation-failed",
        ["body", "execution_mode"],
    ),
    (
        # the pattern's $ (Python's re) also matches before a final newline
        "execution id with a final newline",
        {"json": {"payload": 1, "execution_id": "4711\n"}},
        422,
        "validation-failed",
        ["body", "execution_id"],
    ),
    (
        "deep nesting",
        {
            "data": b'{"payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "content_type": "application/json",
        },
        413,
        "payload-too-large",
        None,
    ),
]


@pytest.mark.parametrize(
    ("name", "send", "status", "slug", "loc"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_body_is_rejected_and_changes_nothing(
    seeded: tuple[Api, Any],
    store_url: str,
    name: str,
    send: dict[str, Any],
    status: int,
    slug: str,
    loc: list[Any] | None,
) -> None:
    api, before = seeded
    r = api.client.post(BEGIN, headers=AUTH, **send)
    assert r.status_code == status, r.get_data(as_text=True)
    assert r.mimetype == "application/problem+json"
    body = r.get_json()
    assert body["type"].endswith(slug) and body["status"] == status
    assert body["title"] and body["detail"]
    if loc is not None:
        assert loc in [e["loc"] for e in body["errors"]]
    assert dump(store_url) == before


def test_deep_nesting_within_limit_is_a_clean_error(make_app: AppFactory) -> None:
    api = Api(make_app().test_client())
    deep = b'{"payload": ' + b"[" * 60_000 + b"]" * 60_000 + b"}"
    r = api.client.post(BEGIN, headers=AUTH, data=deep, content_type="application/json")
    assert r.status_code in (400, 422) and r.mimetype == "application/problem+json"


@pytest.mark.parametrize("op_id", ["has space", "x" * 201, "semi;colon", "slash%2Fx", "ünï"])
def test_bad_operation_id(seeded: tuple[Api, Any], store_url: str, op_id: str) -> None:
    api, before = seeded
    status, body = api.post(f"/v1/operations/{op_id}/begin", {"payload": 1})
    assert status in (404, 422), body
    if status == 422:
        assert body["errors"][0]["loc"] == ["path", "operation_id"]
    assert dump(store_url) == before


@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_missing_or_unknown_token_is_401(
    seeded: tuple[Api, Any], store_url: str, token: str | None
) -> None:
    api, before = seeded
    status, body = api.post(BEGIN, {"payload": 1}, token=token)
    assert status == 401 and body["type"].endswith("unauthenticated")
    assert dump(store_url) == before


def test_out_of_scope_workflow_is_403(seeded: tuple[Api, Any], store_url: str) -> None:
    api, before = seeded
    status, body = api.post(
        "/v1/operations/x/begin", {"payload": 1, "workflow": "wf-crm"}, token=SCOPED_TOKEN
    )
    assert status == 403 and body["type"].endswith("forbidden")
    assert dump(store_url) == before


def test_commit_and_fail_field_errors(seeded: tuple[Api, Any], store_url: str) -> None:
    api, before = seeded
    for path, body, loc in (
        ("commit", {"attempt": 0, "receipt": "r"}, ["body", "attempt"]),
        ("commit", {"attempt": 1}, ["body", "receipt"]),
        ("fail", {"attempt": 1, "outcome": "failed"}, ["body", "outcome"]),
        ("reconcile", {"outcome": "maybe", "evidence": 1}, ["body", "outcome"]),
    ):
        status, got = api.post(f"/v1/operations/order-1/{path}", body)
        assert status == 422 and loc in [e["loc"] for e in got["errors"]], got
    assert dump(store_url) == before


def test_unknown_route_and_method_are_problems(seeded: tuple[Api, Any]) -> None:
    api, _ = seeded
    r = api.client.get("/v1/nothing-here", headers=AUTH)
    assert r.status_code == 404 and r.mimetype == "application/problem+json"
    r = api.client.delete(BEGIN, headers=AUTH)
    assert r.status_code == 405 and r.mimetype == "application/problem+json"


def test_empty_body_is_an_empty_object(seeded: tuple[Api, Any]) -> None:
    api, _ = seeded
    r = api.client.post(BEGIN, headers=AUTH, content_type="application/json")
    assert r.status_code == 422
    assert ["body", "payload"] in [e["loc"] for e in r.get_json()["errors"]]
    # Without a JSON content type even an empty state-changing request is refused:
    # a web page's form or simple fetch sends exactly that.
    r = api.client.post(BEGIN, headers=AUTH)
    assert r.status_code == 415 and r.mimetype == "application/problem+json"


def test_big_integers_fingerprint_like_javascript(seeded: tuple[Api, Any]) -> None:
    """n8n parses 2**60 as a double; so must the fingerprint, or a retry would conflict."""
    api, _ = seeded
    api.begin("big", {"id": 2**60})
    r = api.client.post(
        "/v1/operations/big/begin",
        headers=AUTH,
        data=b'{"payload": {"id": 1152921504606846976.0}}',
        content_type="application/json",
    )
    assert r.get_json()["decision"] == "in_progress"


@pytest.mark.parametrize(
    ("raw", "status", "loc"),
    [
        (b'{"payload": 1' + b"0" * 400 + b"}", 422, ["body", "payload"]),
        (b'{"payload": {"k": "\\ud800"}}', 422, ["body", "payload", "k"]),
        (b'{"payload": {"\\udc00": 1}}', 422, ["body", "payload"]),
        (b'{"payload": 1, "workflow": "wf\\u0000x"}', 422, ["body", "workflow"]),
    ],
)
def test_values_no_json_peer_could_read_are_refused(
    seeded: tuple[Api, Any], store_url: str, raw: bytes, status: int, loc: list[Any] | None
) -> None:
    api, before = seeded
    r = api.client.post(
        "/v1/operations/fresh/begin", headers=AUTH, data=raw, content_type="application/json"
    )
    assert r.status_code == status, r.get_json()
    assert r.mimetype == "application/problem+json"
    if loc is not None:
        assert loc in [e["loc"] for e in r.get_json()["errors"]]
    assert dump(store_url) == before


def test_unreadable_receipt_is_refused_so_a_repeated_commit_still_works(
    seeded: tuple[Api, Any],
) -> None:
    api, _ = seeded
    for receipt in (b'"\\ud800"', b"1" + b"0" * 400):
        r = api.client.post(
            "/v1/operations/order-1/commit",
            headers=AUTH,
            data=b'{"workflow": "wf-crm", "attempt": 1, "receipt": ' + receipt + b"}",
            content_type="application/json",
        )
        assert r.status_code == 422
    for _ in range(2):
        status, body = api.post(
            "/v1/operations/order-1/commit", {"workflow": "wf-crm", "attempt": 1, "receipt": "ok"}
        )
        assert status == 200 and body["operation"]["receipt"] == "ok"


@pytest.mark.parametrize(
    "cursor", ["[1" + "0" * 400 + ', "x"]', '[NaN, "x"]', '[1, "\\ud800"]', "[1, 2]", '"x"']
)
def test_forged_cursors_are_422(seeded: tuple[Api, Any], cursor: str) -> None:
    import base64

    api, _ = seeded
    token = base64.urlsafe_b64encode(cursor.encode()).decode().rstrip("=")
    status, body = api.get("/v1/operations", cursor=token)
    assert status == 422 and body["errors"][0]["loc"] == ["query", "cursor"]


@pytest.mark.parametrize("op_id", [".", ".."])
def test_dot_ids_are_refused(seeded: tuple[Api, Any], op_id: str) -> None:
    api, _ = seeded
    r = api.client.post(f"/v1/operations/{op_id}/begin", headers=AUTH, json={"payload": 1})
    assert r.status_code in (404, 422)


def test_integer_past_the_parsers_digit_limit_is_400(make_app: AppFactory) -> None:
    api = Api(make_app().test_client())
    r = api.client.post(
        "/v1/operations/o/commit",
        headers=AUTH,
        data=b'{"attempt": 1' + b"0" * 5000 + b', "receipt": 1}',
        content_type="application/json",
    )
    assert r.status_code == 400 and r.mimetype == "application/problem+json"


@pytest.mark.parametrize("lease", ["5", True, 0, -1])
def test_a_lease_is_a_strict_positive_number(api: Api, lease: Any) -> None:
    """`"5"` and `true` are not seconds: the begin is refused, nothing is reserved."""
    status, out = api.post(
        "/v1/operations/lease-probe/begin",
        {"payload": {}, "workflow": "wf-sheets", "lease_s": lease},
    )
    assert status == 422 and out["errors"][0]["loc"] == ["body", "lease_s"]
    assert api.get("/v1/operations/lease-probe", workflow="wf-sheets")[0] == 404

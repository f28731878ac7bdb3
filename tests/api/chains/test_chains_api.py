"""Activations, effects, chains and stops through the HTTP API, on every store."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import ADMIN_TOKEN, SCOPED_TOKEN, SECRET, TOKENS_CONFIG, TOKENS_ENV, Api, Clock
from sidecar.app import create_app

ACT = "/v1/activations"


def activate(api: Api, token: str = "default", **body: Any) -> dict[str, Any]:
    status, out = api.post(ACT, {"workflow": "wf-sheets", **body}, token=token)
    assert status == 200, out
    return dict(out)


def test_proceed_gives_a_marker_that_continues_the_chain(api: Api) -> None:
    first = activate(api, event_key="row:1", content={"a": 1})
    assert first["marker"].startswith(f"ls1.{first['chain_id']}.0.")
    hop = activate(api, event_key="row:2", event={"cell": f"  {first['marker']}  "})
    assert (hop["reason"], hop["depth"], hop["chain_id"]) == ("reentry", 1, first["chain_id"])
    assert hop["marker"].startswith(f"ls1.{first['chain_id']}.1.")


def test_marker_found_in_header_lines_any_case(api: Api) -> None:
    first = activate(api, event_key="m1", content={"a": 1})
    line = "X-Loopstop-Chain: " + first["marker"].upper()
    hop = activate(api, event_key="m2", event={"headers": {"x-loopstop-chain": line}})
    assert hop["reason"] == "reentry" and hop["invalid_markers"] == 0


def test_forged_and_truncated_markers_are_ignored_and_counted(api: Api) -> None:
    real = activate(api, event_key="r1", content={"a": 1})["marker"]
    chain_id = real.split(".")[1]
    forged = f"ls1.{chain_id}.0.{'0' * 32}"
    truncated = real[:-5]
    out = activate(api, event_key="r2", event={"x": forged, "y": f"see {truncated}"})
    assert out["reason"] == "new_chain" and out["depth"] == 0
    assert out["invalid_markers"] == 2
    out = activate(api, event_key="r3", content={"b": 1}, marker="ls1.bogus")
    assert out["reason"] == "new_chain" and out["invalid_markers"] == 1
    out = activate(api, event_key="r4", content={"b": 1}, marker="hello")
    assert out["invalid_markers"] == 1


def test_ordinary_text_is_no_marker_candidate(api: Api) -> None:
    out = activate(
        api, event_key="t1", event={"from": "Nils1.Berg@example.com", "host": "tools1.example.org"}
    )
    assert out["invalid_markers"] == 0


def test_empty_marker_field_means_none_and_the_event_is_searched(api: Api) -> None:
    first = activate(api, event_key="x1", content={"a": 1})
    hop = activate(
        api, event_key="x2", marker="  ", event={"headers": {"x-loopstop-chain": first["marker"]}}
    )
    assert hop["reason"] == "reentry"


def test_marker_of_an_expired_chain_counts_as_none(api: Api, clock: Clock) -> None:
    first = activate(api, event_key="e1", content={"a": 1})
    clock.advance(86_400)
    out = activate(api, event_key="e2", content={"a": 2}, marker=first["marker"])
    assert out["reason"] == "new_chain" and out["chain_id"] != first["chain_id"]


def test_marker_signed_with_another_secret_is_not_trusted(make_app: Any) -> None:
    a = Api(make_app().test_client())
    b = Api(make_app(environ={"LOOPSTOP_SECRET": "a-completely-different-secret"}).test_client())
    marker = activate(a, event_key="x", content={"a": 1})["marker"]
    out = activate(b, event_key="y", content={"a": 2}, marker=marker)
    assert out["reason"] == "new_chain" and out["invalid_markers"] == 1


def test_webhook_item_counts_by_its_body(api: Api) -> None:
    item = {
        "headers": {"x-shop-delivery-id": "d1"},
        "params": {},
        "query": {},
        "body": {"id": "evt-1", "v": 1},
    }
    assert activate(api, event_key="evt-1", event=item)["decision"] == "proceed"
    again = {**item, "headers": {"x-shop-delivery-id": "d2", "x-shop-delivery-attempt": "2"}}
    assert activate(api, event_key="evt-1", event=again)["reason"] == "duplicate_event"


def test_effect_echo_and_replacement(api: Api) -> None:
    first = activate(api, event_key="row:5", content={"status": ""})
    status, eff = api.post(
        "/v1/effects",
        {
            "chain_id": first["chain_id"],
            "target_key": "row:5",
            "content": {"status": "done", "score": 0},
        },
    )
    assert status == 200 and eff["workflow"] == "wf-sheets" and eff["depth"] == 0
    assert (
        activate(api, event_key="row:5", content={"status": "done", "score": ""})["reason"]
        == "echo"
    )
    api.post(
        "/v1/effects",
        {"workflow": "wf-sheets", "target_keys": ["row:5"], "content": {"status": "archived"}},
    )
    assert activate(api, event_key="row:5", content={"status": "archived"})["reason"] == "echo"
    out = activate(api, event_key="row:5", content={"status": "done", "score": ""})
    assert out["reason"] == "external_change"


def test_effect_bad_input(api: Api) -> None:
    for body, loc in (
        ({"workflow": "wf", "content": {}}, ["body"]),
        ({"target_key": "k", "content": {}}, ["body", "workflow"]),
        ({"workflow": "wf", "target_key": "k", "content": [1]}, ["body", "content"]),
        (
            {"workflow": "wf", "target_key": "k", "content": {}, "chain_id": "nope"},
            ["body", "chain_id"],
        ),
        (
            {"workflow": "wf", "target_keys": [f"k{i}" for i in range(21)], "content": {}},
            ["body", "target_keys"],
        ),
    ):
        status, out = api.post("/v1/effects", body)
        assert status == 422, out
        assert loc in [e["loc"] for e in out["errors"]], out


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"marker": "ls1." + "a" * 10_000}, ["body", "marker"]),
        ({"content": [1, 2]}, ["body", "content"]),
        ({"content": "text"}, ["body", "content"]),
        ({"event": [1]}, ["body", "event"]),
        ({"related_keys": [f"<m{i}>" for i in range(101)]}, ["body", "related_keys"]),
        ({"event_key": "x" * 1001}, ["body", "event_key"]),
        ({"workflow": None}, ["body", "workflow"]),
        ({"subject": "typo"}, ["body", "subject"]),
    ],
)
def test_activation_bad_input(api: Api, body: dict[str, Any], loc: list[Any]) -> None:
    status, out = api.post(ACT, {"workflow": "wf-sheets", **body})
    assert status == 422 and out["type"].endswith("validation-failed")
    assert loc in [e["loc"] for e in out["errors"]], out


def test_event_nested_200_levels_is_422_and_changes_nothing(api: Api) -> None:
    deep: Any = "leaf"
    for _ in range(200):
        deep = {"n": deep}
    status, out = api.post(ACT, {"workflow": "wf-sheets", "event_key": "deep", "event": deep})
    assert status == 422 and out["errors"][0]["loc"][:3] == ["body", "event", "n"]
    assert "nested deeper" in out["errors"][0]["msg"]
    assert activate(api, event_key="deep", content={})["reason"] == "new_chain"


def test_related_keys_accept_one_string(api: Api) -> None:
    first = activate(api, event_key="<in@x>", content={})
    api.post(
        "/v1/effects",
        {"chain_id": first["chain_id"], "target_key": "<ours@example.com>", "content": {}},
    )
    out = activate(api, event_key="<reply@x>", related_keys="<ours@example.com>", content={})
    assert (out["reason"], out["depth"]) == ("reentry", 1)


def test_scopes_and_admin_only_stops(api: Api) -> None:
    mine = activate(api, token=SCOPED_TOKEN, event_key="s1", content={})
    other = activate(api, workflow="wf-crm", event_key="c1", content={})
    scoped = Api(api.client, SCOPED_TOKEN)
    assert scoped.get(f"/v1/chains/{mine['chain_id']}")[0] == 200
    assert scoped.get(f"/v1/chains/{other['chain_id']}")[0] == 403
    assert scoped.post(ACT, {"workflow": "wf-crm", "content": {}})[0] == 403
    assert (
        scoped.post(
            "/v1/effects", {"chain_id": other["chain_id"], "target_key": "k", "content": {}}
        )[0]
        == 403
    )
    for path in (f"/v1/chains/{mine['chain_id']}/stop", "/v1/workflows/wf-sheets/stop"):
        status, out = scoped.post(path, {"reason": "x"})
        assert status == 403 and out["type"].endswith("forbidden")
        assert api.post(path, {"reason": "x"})[0] == 403  # the n8n token is not admin
        assert api.post(path, {"reason": "x"}, token=ADMIN_TOKEN)[0] == 200
    assert scoped.get("/v1/workflows/wf-crm")[0] == 403
    assert scoped.get("/v1/workflows/wf-sheets")[1]["stopped"]["actor"] == "operator"


def test_chain_view_and_errors(api: Api) -> None:
    first = activate(api, event_key="v1", content={"a": 1})
    activate(api, event_key="v1", content={"a": 1})  # duplicate, not in a chain
    status, out = api.get(f"/v1/chains/{first['chain_id']}")
    chain = out["chain"]
    assert status == 200 and chain["activations"] == 1 and chain["alive"] is True
    assert chain["recent"][0]["reason"] == "new_chain" and chain["stopped"] is None
    assert api.get("/v1/chains/c00000000000000000000")[0] == 404
    assert api.get("/v1/chains/not-a-chain")[0] == 422
    assert (
        api.post("/v1/chains/c00000000000000000000/stop", {"reason": "x"}, token=ADMIN_TOKEN)[0]
        == 404
    )
    assert api.post("/v1/workflows/wf/stop", {}, token=ADMIN_TOKEN)[0] == 422


def test_stop_is_sticky_and_idempotent(api: Api, clock: Clock) -> None:
    status, first = api.post("/v1/workflows/wf-sheets/stop", {"reason": "loop"}, token=ADMIN_TOKEN)
    clock.advance(10)
    status, again = api.post("/v1/workflows/wf-sheets/stop", {"reason": "again"}, token=ADMIN_TOKEN)
    assert status == 200 and again["stopped"] == first["stopped"]
    clock.advance(30 * 86_400)
    assert activate(api, event_key="z", content={})["reason"] == "stopped"
    api.post("/v1/workflows/wf-sheets/resume", {}, token=ADMIN_TOKEN)
    assert activate(api, event_key="z", content={})["reason"] == "new_chain"


def test_test_mode_activations_are_separate(api: Api) -> None:
    activate(api, event_key="t1", content={"a": 1}, execution_mode="test")
    assert (
        activate(api, event_key="t1", content={"a": 1}, execution_mode="test")["reason"]
        == "duplicate_event"
    )
    assert activate(api, event_key="t1", content={"a": 1})["reason"] == "new_chain"


@pytest.mark.all_stores  # each store's own expiry
def test_every_gate_key_expires(api: Api, store_url: str) -> None:
    """Activations, effects, windows and chains all carry a TTL (Redis shows it directly)."""
    if not store_url.startswith("redis"):
        from conftest import sql_rows

        first = activate(api, event_key="k1", subject_key="s1", content={"a": 1})
        api.post(
            "/v1/effects", {"chain_id": first["chain_id"], "target_key": "t1", "content": {"a": 1}}
        )
        assert [key for key, _, expires in sql_rows(store_url, "kv") if expires is None] == []
        return
    import redis

    first = activate(api, event_key="k1", subject_key="s1", content={"a": 1})
    api.post(
        "/v1/effects", {"chain_id": first["chain_id"], "target_key": "t1", "content": {"a": 1}}
    )
    client = redis.Redis.from_url(store_url, decode_responses=True)
    keys = [k for k in client.keys("loopstop:p:*")]
    kinds = {k.split(":")[2] for k in keys}
    assert kinds == {"seen", "rate", "chain", "effect", "link", "ix"}
    documents = [k for k in keys if k.split(":")[2] != "ix"]
    assert all(client.pttl(k) > 0 for k in documents), {k: client.pttl(k) for k in documents}
    # The index of live chains has no TTL: every write trims what expired from it.
    client.close()


def test_effects_without_chain_cannot_loop_forever(api: Api) -> None:
    """Each side registers its sent message with only a workflow: every reply
    re-enters at depth 1 of a fresh chain; the subject rate still ends it."""
    reasons = []
    last = "<start@peer>"
    for hop in range(14):
        ours = f"<ours-{hop}@example.com>"
        out = activate(
            api,
            event_key=f"<peer-{hop}@bots>",
            related_keys=[last],
            subject_key="otherbot@example.com",
            content={"n": hop},
        )
        reasons.append(out["reason"])
        api.post("/v1/effects", {"workflow": "wf-sheets", "target_key": ours, "content": {}})
        last = ours
    assert reasons.count("activation_rate") == 4 and "activation_rate" not in reasons[:10]


def test_test_mode_marker_is_not_a_production_marker(api: Api) -> None:
    test_marker = activate(api, event_key="m", content={"a": 1}, execution_mode="test")["marker"]
    out = activate(api, event_key="m2", content={"a": 2}, marker=test_marker)
    assert out["reason"] == "new_chain" and out["invalid_markers"] == 1


def test_quoted_dead_marker_never_hides_the_live_one(api: Api, clock: Clock) -> None:
    old = activate(api, event_key="old", content={"a": 1})
    for _ in range(3):
        old = activate(api, event_key=f"old-{_}", content={"a": 1}, marker=old["marker"])
    clock.advance(86_400)  # yesterday's chain (depth 3) has expired
    live = activate(api, event_key="new", content={"b": 1})
    out = activate(
        api,
        event_key="reply",
        event={
            "text": f"> quoted: {old['marker']}",
            "headers": {"x-loopstop-chain": live["marker"]},
        },
    )
    assert (out["reason"], out["chain_id"], out["depth"]) == ("reentry", live["chain_id"], 1)


def test_scoped_token_cannot_probe_or_spend_other_workflows_chains(api: Api) -> None:
    other = activate(api, workflow="wf-crm", event_key="crm:1", content={"a": 1})
    api.post(
        "/v1/effects",
        {"chain_id": other["chain_id"], "target_key": "crm-row-9", "content": {"status": "done"}},
    )
    scoped = Api(api.client, SCOPED_TOKEN)
    probe = activate(
        scoped, token=SCOPED_TOKEN, event_key="s-1", related_keys=["crm-row-9"], content={"x": 1}
    )
    assert probe["reason"] == "new_chain" and probe["chain_id"] != other["chain_id"]
    spend = activate(
        scoped, token=SCOPED_TOKEN, event_key="s-2", content={"x": 2}, marker=other["marker"]
    )
    assert spend["reason"] == "new_chain"
    status, body = scoped.post(
        "/v1/effects", {"chain_id": other["chain_id"], "target_key": "k", "content": {}}
    )
    assert status == 403 and "wf-crm" not in body["detail"]
    # Its own effect on the same target neither hides the CRM flow's echo nor takes its link.
    scoped.post(
        "/v1/effects",
        {"workflow": "wf-sheets", "target_key": "crm-row-9", "content": {"status": "hijacked"}},
    )
    echo = activate(api, workflow="wf-crm", event_key="crm-row-9", content={"status": "done"})
    assert echo["reason"] == "echo" and echo["chain_id"] == other["chain_id"]
    hop = activate(
        api, workflow="wf-other", event_key="o-1", related_keys=["crm-row-9"], content={}
    )
    assert hop["reason"] == "reentry" and hop["chain_id"] == other["chain_id"]


def test_effect_naming_only_an_unknown_chain_is_422(api: Api) -> None:
    status, body = api.post(
        "/v1/effects",
        {"chain_id": "c00000000000000000000", "target_key": "x", "content": {}},
        token=ADMIN_TOKEN,
    )
    assert status == 422 and body["errors"][0]["loc"] == ["body", "chain_id"]


def test_webhook_gets_with_different_queries_are_different_events(api: Api) -> None:
    def get(order: str) -> dict[str, Any]:
        item = {"headers": {"x-req": order}, "params": {}, "query": {"order": order}, "body": {}}
        return activate(api, event=item)

    assert get("1")["reason"] == "new_chain"
    assert get("2")["reason"] == "new_chain"
    assert get("2")["reason"] == "duplicate_event"


def test_workflow_stop_holds_for_test_executions_too(api: Api) -> None:
    api.post("/v1/workflows/wf-sheets/stop", {"reason": "x"}, token=ADMIN_TOKEN)
    out = activate(api, event_key="t", content={}, execution_mode="test")
    assert out["reason"] == "stopped"


def test_odd_workflow_paths_and_ttls_are_refused(api: Api) -> None:
    r = api.client.post(
        "/v1/workflows/a%01b/stop",
        json={"reason": "x"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert r.status_code == 422
    status, _ = api.post(
        "/v1/effects", {"workflow": "wf-sheets", "target_key": "k", "content": {}, "ttl_s": 1e-300}
    )
    assert status == 422


@pytest.mark.all_stores  # concurrent increments, per store
def test_workflow_rate_breaker_counts_across_windows_and_concurrent_activations(
    make_app: Any, clock: Clock
) -> None:
    """The breaker's counter is bumped by a commit-time increment: concurrent
    activations of one workflow never conflict on it and none is lost; the
    estimate slides across fixed windows; it may overshoot by what is in flight."""
    from concurrent.futures import ThreadPoolExecutor

    limits = {"workflow_rate_limit": 10, "workflow_rate_window_s": 60}
    app = make_app(chains={"default": {**limits, "rate_limit": 1000}})
    api = Api(app.test_client())
    clock.now = 1_790_000_040.0  # the start of a window (windows are multiples of 60 s)

    def one(i: int) -> str:
        return str(activate(Api(app.test_client()), event_key=f"e{i}")["reason"])

    with ThreadPoolExecutor(8) as pool:
        reasons = list(pool.map(one, range(30)))
    proceeded = reasons.count("new_chain")
    assert 10 <= proceeded <= 10 + 8, reasons
    assert reasons.count("workflow_rate") == 30 - proceeded
    assert activate(api, event_key="late")["reason"] == "workflow_rate"

    # At the start of the next window the previous one still counts in full;
    # half-way through it counts half (at most 18 / 2 < 10): room again.
    clock.now += 60
    assert activate(api, event_key="next")["reason"] == "workflow_rate"
    clock.now += 30
    assert activate(api, event_key="later")["reason"] == "new_chain"


def test_workflow_rate_breaker_counts_what_a_worker_ahead_already_counted(
    make_app: Any, clock: Clock
) -> None:
    """Clock skew between workers at a window boundary: a worker still in
    window n counts what a worker whose clock is ahead counted in window n+1."""
    app = make_app(
        chains={
            "default": {"workflow_rate_limit": 5, "workflow_rate_window_s": 60, "rate_limit": 100}
        }
    )
    api = Api(app.test_client())
    clock.now = 1_790_000_040.0 + 61  # just into window n+1 (the worker ahead)
    reasons = [activate(api, event_key=f"ahead{i}")["reason"] for i in range(6)]
    assert reasons == ["new_chain"] * 5 + ["workflow_rate"]
    clock.now -= 3  # the worker behind, still in window n
    assert activate(api, event_key="behind")["reason"] == "workflow_rate"


def test_a_scoped_admin_stops_only_the_chains_of_its_workflows(
    store_url: str, clock: Clock
) -> None:
    """An admin token scoped to wf-crm may stop wf-crm's chains, never wf-sheets'."""
    ops = {"name": "ops-crm", "env": "T_OPS_CRM", "workflows": ["wf-crm"], "admin": True}
    app = create_app(
        {"store": store_url, "tokens": [*TOKENS_CONFIG, ops]},
        environ={"LOOPSTOP_SECRET": SECRET, **TOKENS_ENV, "T_OPS_CRM": "tok-ops-crm-0123456789"},
        clock=clock,
    )
    api = Api(app.test_client())
    sheets = activate(api, event_key="s1", content={})
    crm = activate(api, workflow="wf-crm", event_key="c1", content={})
    ops_api = Api(api.client, "tok-ops-crm-0123456789")
    status, out = ops_api.post(f"/v1/chains/{sheets['chain_id']}/stop", {"reason": "x"})
    assert status == 403 and out["type"].endswith("forbidden")
    assert api.get(f"/v1/chains/{sheets['chain_id']}")[1]["chain"]["stopped"] is None
    status, out = ops_api.post(f"/v1/chains/{crm['chain_id']}/stop", {"reason": "x"})
    assert status == 200 and out["chain"]["stopped"]["actor"] == "ops-crm"

"""Names, scopes and cursor lineages across routes.

One workflow whatever its Unicode form, no request tied to another workflow's
chain, and a page a check refused is not remembered.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ui_session import login

from conftest import ADMIN_TOKEN, SCOPED_TOKEN, Api, AppFactory
from sidecar.config import load_settings

NFC = "caf\u00e9"
NFD = "cafe\u0301"


def _activate(api: Api, workflow: str, key: str) -> dict[str, Any]:
    status, out = api.post("/v1/activations", {"workflow": workflow, "event_key": key})
    assert status == 200, out
    return dict(out)


def test_a_workflow_stop_named_in_nfd_stops_the_workflow_its_activations_name(
    api: Api,
) -> None:
    """Bodies normalize workflow names to NFC ("Café" and "Cafe\u0301" are one
    workflow); the stop's path must name the same workflow, or the stop covers
    nothing while GET /v1/workflows/<name> reports it stopped."""
    status, out = api.post(f"/v1/workflows/{NFD}/stop", {"reason": "loop"}, token=ADMIN_TOKEN)
    assert status in (200, 422), out
    if status == 422:
        return  # refused outright: nothing recorded, nothing misleading
    out = _activate(api, NFC, "after-stop-1")
    assert (out["decision"], out["reason"]) == ("drop", "stopped"), out
    out = _activate(api, NFD, "after-stop-2")
    assert (out["decision"], out["reason"]) == ("drop", "stopped"), out


def test_a_scoped_token_cannot_tie_a_task_to_another_workflows_chain(api: Api) -> None:
    """A task's chain is a record of another workflow: a token scoped to
    wf-sheets must not link its task to it (and so learn that chain's stop
    state, or be stopped by a stop scoped to that other workflow)."""
    chain_id = _activate(api, "wf-other", "other-1")["chain_id"]
    status, out = api.post(
        "/v1/tasks", {"workflow": "wf-sheets", "chain_id": chain_id}, token=SCOPED_TOKEN
    )
    assert status in (403, 404), out


def test_a_scoped_begin_cannot_read_another_workflows_chain_stop(api: Api) -> None:
    chain_id = _activate(api, "wf-other", "other-2")["chain_id"]
    status, out = api.post(f"/v1/chains/{chain_id}/stop", {"reason": "x"}, token=ADMIN_TOKEN)
    assert status == 200, out
    status, out = api.post(
        "/v1/operations/scoped-begin/begin",
        {"workflow": "wf-sheets", "payload": 1, "chain_id": chain_id},
        token=SCOPED_TOKEN,
    )
    # Either refused, or decided without the other workflow's chain stop.
    assert status in (403, 404) or out.get("reason") != "chain_stopped", out


def test_ui_workflow_form_refuses_names_the_api_refuses_and_never_truncates(
    make_app: AppFactory,
) -> None:
    """Bad input changes nothing: the form's workflow must be checked like the
    API's, not cut to 200 characters (which stops another workflow)."""
    app = make_app()
    client = app.test_client()
    csrf = login(client, ADMIN_TOKEN)
    api = Api(app.test_client(), token=ADMIN_TOKEN)
    long_name = "w" * 250
    for bad in ["wf\x00x", long_name]:
        r = client.post("/ui/workflows", data={"csrf": csrf, "workflow": bad, "reason": "x"})
        assert 400 <= r.status_code < 500, (bad[:20], r.status_code)
    status, out = api.get(f"/v1/workflows/{'w' * 200}")
    assert status == 200 and out["stopped"] is None, out


CURSOR_CHECKS = {
    "pages": {"kind": "cursor", "cursor": "next", "records": "items[*].id", "workflows": ["*"]},
    "has_ok": {
        "kind": "json_schema",
        "schema": {"type": "object", "required": ["ok"]},
        "workflows": ["*"],
    },
    "pages_and_ok": {"kind": "all", "of": ["pages", "has_ok"], "workflows": ["*"]},
}


def test_a_page_refused_by_a_combined_check_does_not_make_it_look_old(
    make_app: AppFactory,
) -> None:
    """An ``all`` check whose other part failed refused the page; the cursor
    part must not remember it, or the same honest page, sent again valid,
    fails ``cycle``."""
    api = Api(make_app(checks=CURSOR_CHECKS).test_client())
    status, task = api.post("/v1/tasks", {"workflow": "wf-a"})
    assert status == 201, task
    task_id = task["task"]["task_id"]
    page = {"next": "c1", "items": [{"id": 1}, {"id": 2}]}
    status, first = api.post("/v1/checks/pages_and_ok", {"input": page, "task_id": task_id})
    assert status == 200 and first["passed"] is False, first
    status, again = api.post(
        "/v1/checks/pages_and_ok", {"input": {**page, "ok": True}, "task_id": task_id}
    )
    assert status == 200 and again["passed"] is True, again


def test_a_path_workflow_that_nfc_lengthens_past_the_limit_is_422(api: Api) -> None:
    """U+0958 becomes two code points in NFC: 200 of them pass the path's length
    check and are 400 after it. The name is refused as a body's would be (422
    naming path.workflow), never a 500, and nothing is stopped."""
    name = quote("\u0958" * 200)
    status, out = api.get(f"/v1/workflows/{name}", token=ADMIN_TOKEN)
    assert status == 422, out
    assert out["errors"][0]["loc"] == ["path", "workflow"], out
    status, out = api.post(f"/v1/workflows/{name}/stop", {"reason": "x"}, token=ADMIN_TOKEN)
    assert status == 422, out
    status, out = api.get(f"/v1/workflows/{quote(chr(0x915) + chr(0x93C))}", token=ADMIN_TOKEN)
    assert status == 200 and out["stopped"] is None, out


def test_workflow_names_in_the_configuration_are_compared_in_nfc() -> None:
    """A check opened to a workflow and a chain override keyed by one are read in
    NFC, as tokens' scopes and requests are: written in NFD they still apply."""
    settings = load_settings(
        {
            "checks": {
                "c": {"kind": "json_schema", "schema": {"type": "object"}, "workflows": [NFD]}
            },
            "chains": {"workflows": {NFD: {"max_depth": 2}}},
        },
        {"LOOPSTOP_SECRET": "s" * 24},
    )
    assert settings.checks["c"].workflows == [NFC]
    assert settings.chains.for_workflow(NFC).max_depth == 2

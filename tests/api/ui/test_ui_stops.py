"""The operator page and stops that reach n8n (DESIGN §6): a /ui stop asks n8n too,
the chain page lists what n8n confirmed, runaway and long-running tasks are marked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_n8n import FakeExecution, FakeN8n, FakeN8nServer
from ui_session import login

from conftest import ADMIN_TOKEN, N8N_TOKEN, Api, AppFactory, Clock

KEY = "n8n-api-key-0123456789"


@pytest.fixture
def n8n() -> Iterator[FakeN8nServer]:
    server = FakeN8nServer(FakeN8n(key=KEY)).start()
    yield server
    server.stop()


def test_a_ui_chain_stop_cancels_in_n8n_and_the_chain_page_lists_it(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    n8n.state.add(FakeExecution("41", "wf-a"), FakeExecution("42", "wf-a", on_stop="ignore"))
    app = make_app(
        environ={"N8N_API_KEY": KEY},
        n8n={"api_url": n8n.api_url, "timeout_s": 2, "confirm_s": 0.5},
    )
    api = Api(app.test_client())
    chain = api.post(
        "/v1/activations", {"workflow": "wf-a", "event_key": "e1", "execution_id": "41"}
    )[1]["chain_id"]
    api.post(
        "/v1/effects", {"chain_id": chain, "target_key": "t", "content": {}, "execution_id": "42"}
    )
    client = app.test_client()
    csrf = login(client, ADMIN_TOKEN)
    r = client.post(f"/ui/chains/{chain}/stop", data={"csrf": csrf, "reason": "loop"})
    assert r.status_code == 303
    assert "done=chain_stopped&n8n=partial&confirmed=1&of=2" in r.headers["Location"]
    shown = client.get(r.headers["Location"]).get_data(as_text=True)
    assert "Chain stopped; n8n: partial, 1/2 executions confirmed" in shown
    page = client.get(f"/ui/chains/{chain}").get_data(as_text=True)
    assert "Stop in n8n: partial" in page
    assert "<td>41</td><td>waiting</td><td>canceled</td>" in page
    assert "<td>42</td><td>waiting</td><td>waiting</td>" in page and "unconfirmed" in page
    r = client.post(
        "/ui/workflows", data={"csrf": csrf, "workflow": "wf-b", "reason": "x", "action": "stop"}
    )
    assert "done=workflow_stopped&n8n=nothing_to_stop" in r.headers["Location"]
    metrics = app.test_client().get("/metrics").get_data(as_text=True)
    assert '{decision="stopped",reason="other",route="ui.workflows.stop"}' in metrics


def test_runaway_and_long_running_tasks_are_marked(make_app: AppFactory, clock: Clock) -> None:
    app = make_app(outliers={"min_tasks": 1, "running_s": 60})
    api = Api(app.test_client())
    normal = api.post("/v1/tasks", {"workflow": "wf-agent"})[1]["task"]["task_id"]
    api.post(f"/v1/tasks/{normal}/model-calls", {"tokens_used": 100})
    api.post(f"/v1/tasks/{normal}/complete", {"evidence": {"done": True}})
    runaway = api.post("/v1/tasks", {"workflow": "wf-agent"})[1]["task"]["task_id"]
    api.post(f"/v1/tasks/{runaway}/model-calls", {"tokens_used": 900})
    client = app.test_client()
    login(client, ADMIN_TOKEN)
    page = client.get("/ui").get_data(as_text=True)
    assert 'class="stopped outlier"' in page and "tokens 900 &gt; 500.0" in page
    assert page.count('class="stopped outlier"') == 1
    long_table = page.split('id="running-long"')[1].split("</table>")[0]
    assert runaway not in long_table
    clock.advance(61)
    page = client.get("/ui").get_data(as_text=True)
    long_table = page.split('id="running-long"')[1].split("</table>")[0]
    assert runaway in long_table and normal not in long_table and "61 s" in long_table


def test_executions_n8n_cannot_account_for_are_listed_until_a_stop_confirms_them(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    """An execution n8n still reports ``running`` after ``confirm_s`` (its queue-mode worker
    died) is ``unconfirmed`` with n8n's last status, and ``/ui`` lists it to admins; once n8n
    reports it ended, the repeated stop finds nothing left going and the list drops it."""
    n8n.state.add(
        FakeExecution("77", "wf-q", status="running", on_stop="ignore"),
        FakeExecution("78", "wf-q", status="running"),
    )
    app = make_app(
        environ={"N8N_API_KEY": KEY},
        n8n={"api_url": n8n.api_url, "timeout_s": 2, "confirm_s": 0.5},
    )
    api = Api(app.test_client(), token=ADMIN_TOKEN)
    status, out = api.post("/v1/workflows/wf-q/stop", {"reason": "worker gone"})
    assert status == 200 and out["cancellation"]["state"] == "partial", out
    got = {e["execution_id"]: e for e in out["cancellation"]["executions"]}
    assert (got["77"]["result"], got["77"]["status_after"]) == ("unconfirmed", "running")
    assert got["78"]["result"] == "stopped"
    admin = app.test_client()
    login(admin, ADMIN_TOKEN)
    page = admin.get("/ui").get_data(as_text=True)
    listed = page[page.index('id="unconfirmed"') :]
    listed = listed[: listed.index("</table>")]
    assert '<td>77</td><td class="stopped">running</td>' in listed
    assert "workflow wf-q" in listed and "<td>78</td>" not in listed
    viewer = app.test_client()
    login(viewer, N8N_TOKEN)
    assert 'id="unconfirmed"' not in viewer.get("/ui").get_data(as_text=True)

    n8n.state.executions["77"].status = "crashed"  # n8n gives up on the dead worker's run
    status, again = api.post("/v1/workflows/wf-q/stop", {"reason": "look again"})
    assert again["cancellation"]["state"] == "nothing_to_stop", again
    page = admin.get("/ui").get_data(as_text=True)
    listed = page[page.index('id="unconfirmed"') :]
    assert "<td>77</td>" not in listed[: listed.index("</table>")]

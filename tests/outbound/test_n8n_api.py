"""n8n's public-API client (STYLE 19, DESIGN §6) against real local servers:
every answer is read within the call's one deadline, and every way a body
can fail is an :class:`N8nError` the stop service turns into a failed
cancellation (the loopstop stop holds), never an error that escapes it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
import requests
from fake_n8n import FakeExecution, FakeN8n, FakeN8nServer
from local_http import DrippingRedirect, JsonHandler, running

from conftest import ADMIN_TOKEN, Api, AppFactory
from sidecar.outbound.n8n_api import MAX_BODY_BYTES, N8nClient, N8nError

KEY = "n8n-api-key-0123456789"


@pytest.fixture
def n8n() -> Iterator[FakeN8nServer]:
    server = FakeN8nServer(FakeN8n(key=KEY)).start()
    yield server
    server.stop()


def _client(api_url: str, timeout_s: float = 0.5) -> N8nClient:
    return N8nClient(api_url, KEY, requests.Session(), timeout_s)


def test_an_answer_that_stalls_mid_body_is_a_timeout(n8n: FakeN8nServer) -> None:
    """One byte, then nothing for longer than the read timeout: the read in
    flight ends ``timeout`` at the call's deadline (it escaped as urllib3's error)."""
    n8n.state.trickle_s = 3
    started = time.monotonic()
    with pytest.raises(N8nError) as caught:
        _client(n8n.api_url).ping()
    assert caught.value.reason == "timeout"
    assert time.monotonic() - started < 0.5 + 1


def test_a_trickled_answer_ends_at_the_deadline(n8n: FakeN8nServer) -> None:
    n8n.state.trickle_s = 0.2  # each read is quick, the whole answer is not
    started = time.monotonic()
    with pytest.raises(N8nError) as caught:
        _client(n8n.api_url).ping()
    assert caught.value.reason == "timeout"
    assert time.monotonic() - started < 0.5 + 1


class Cut(JsonHandler):
    """Announces more body than it sends, then closes the connection."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        with contextlib.suppress(OSError):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"data": [')
            self.wfile.flush()
            self.close_connection = True


def test_an_answer_that_breaks_off_is_unreachable() -> None:
    with running(Cut) as base, pytest.raises(N8nError) as caught:
        _client(base + "/api/v1", timeout_s=2).ping()
    assert caught.value.reason == "unreachable"
    assert "127.0.0.1" in caught.value.detail


def test_an_answer_over_the_bound_is_a_bad_response(n8n: FakeN8nServer) -> None:
    n8n.state.add(FakeExecution("7", "wf-a", data_pad=MAX_BODY_BYTES + 1))
    with pytest.raises(N8nError) as caught:
        _client(n8n.api_url, timeout_s=5).get("7", with_data=True)
    assert caught.value.reason == "bad_response"


def test_a_stop_whose_n8n_stalls_holds_and_says_why_cancellation_failed(
    make_app: AppFactory, n8n: FakeN8nServer
) -> None:
    """Through the app: the stop is committed and answered (200), its cancellation
    ``failed`` with n8n's ``timeout``, never a 500."""
    n8n.state.add(FakeExecution("1", "wf-a"))
    n8n.state.trickle_s = 3
    app = make_app(
        environ={"N8N_API_KEY": KEY},
        n8n={"api_url": n8n.api_url, "timeout_s": 0.5, "confirm_s": 0.5},
    )
    status, out = Api(app.test_client(), ADMIN_TOKEN).post(
        "/v1/workflows/wf-a/stop", {"reason": "runaway"}
    )
    assert status == 200 and out["stopped"] is not None, out
    assert out["cancellation"]["state"] == "failed"
    assert out["cancellation"]["error"].startswith("timeout"), out["cancellation"]


def test_a_redirect_s_body_is_read_under_the_deadline_too() -> None:
    """A 3xx answer's body is read as any other, bounded by the call's deadline
    (requests' own redirect handling would read it whole, however long it drips)."""
    with running(DrippingRedirect) as base:
        started = time.monotonic()
        with pytest.raises(N8nError) as caught:
            _client(base + "/api/v1").ping()
    assert caught.value.reason == "timeout"
    assert time.monotonic() - started < 0.5 + 1

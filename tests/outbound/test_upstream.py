"""The model gate's upstream client (STYLE 19) against real local HTTP servers: frames
read as they arrive in either framing, the error mapping in the API's own shape."""

from __future__ import annotations

import contextlib
import time

import pytest
from local_http import JsonHandler, running

from conftest import free_port
from sidecar.errors import GateNotConfigured, UpstreamError
from sidecar.gate.wire import OPENAI_CHAT
from sidecar.gate.wire.base import Frame, Framing, StreamBroken
from sidecar.outbound.upstream import Upstream, upstream_pool


def _chunked(
    handler: JsonHandler, status: int, ctype: str, pieces: list[bytes], pause: float = 0.01
) -> None:
    handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
    handler.send_response(status)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    for piece in pieces:
        handler.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        handler.wfile.flush()
        time.sleep(pause)
    handler.wfile.write(b"0\r\n\r\n")


def _server(status: int, ctype: str, pieces: list[bytes]) -> type[JsonHandler]:
    class Handler(JsonHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            _chunked(self, status, ctype, pieces)

    return Handler


def _upstream(base: str | None, timeout_s: float = 5) -> Upstream:
    return Upstream(upstream_pool(), base, "sk-up", timeout_s)


@pytest.mark.parametrize(
    ("framing", "ctype", "pieces", "frames"),
    [
        (
            Framing.NDJSON,
            "application/x-ndjson",
            [b'{"a": 1}\n{"b"', b": 2}\n\n", b'{"done": true}'],
            [Frame('{"a": 1}'), Frame('{"b": 2}'), Frame('{"done": true}')],
        ),
        (
            Framing.SSE,
            "text/event-stream",
            [b"event: x\ndata: 1\n\n: ping\n\ndata: ", b"2\n\n", b"data: [DONE]\n\n"],
            [Frame("1", "x"), Frame("2"), Frame("[DONE]")],
        ),
    ],
)
def test_a_stream_s_frames_are_split_as_they_arrive(
    framing: Framing, ctype: str, pieces: list[bytes], frames: list[Frame]
) -> None:
    with running(_server(200, ctype, pieces)) as base:
        exchange = _upstream(base).post(OPENAI_CHAT, {"stream": True}, True)
        assert exchange.status == 200 and exchange.content_type == ctype
        assert list(exchange.frames(framing)) == frames


def test_an_upstream_error_status_is_relayed_in_the_api_s_shape() -> None:
    own = b'{"error": {"message": "slow down", "type": "rate_limit", "code": null}}'
    with (
        running(_server(429, "application/json", [own])) as base,
        pytest.raises(UpstreamError) as caught,
    ):
        _upstream(base).post(OPENAI_CHAT, {}, False)
    assert caught.value.status == 429 and caught.value.body["error"]["message"] == "slow down"
    html = _server(502, "text/html", [b"<html>bad gateway</html>"])
    with running(html) as base, pytest.raises(UpstreamError) as caught:
        _upstream(base).post(OPENAI_CHAT, {}, False)
    assert caught.value.status == 502
    assert caught.value.body["error"]["code"] == "upstream_error"


def test_an_unreachable_or_missing_upstream_is_mapped() -> None:
    with pytest.raises(UpstreamError) as caught:
        _upstream(f"http://127.0.0.1:{free_port()}/v1").post(OPENAI_CHAT, {}, False)
    assert caught.value.status == 502
    assert caught.value.body["error"]["code"] == "upstream_unreachable"
    with pytest.raises(GateNotConfigured):
        _upstream(None).post(OPENAI_CHAT, {}, False)


def test_the_deadline_covers_the_whole_exchange() -> None:
    """Each piece comes well within the read timeout; the whole body does not
    come within ``timeout_s``: the read fails at the deadline, not after the drip."""
    pieces = [b" "] * 40

    class Drip(JsonHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            with contextlib.suppress(OSError):  # the client gave up: what this test wants
                _chunked(self, 200, "application/x-ndjson", pieces, pause=0.05)

    with running(Drip) as base:
        started = time.monotonic()
        exchange = _upstream(base, timeout_s=0.5).post(OPENAI_CHAT, {}, True)
        with pytest.raises(StreamBroken) as caught:
            list(exchange.frames(Framing.NDJSON))
        assert caught.value.code == "timeout"
        assert time.monotonic() - started < 1.5
        exchange.close()


def test_the_deadline_covers_the_answers_head() -> None:
    """An upstream that sends a header line every 0.3 s (each within the read
    timeout) never holds the turn past ``timeout_s``: its socket is shut down
    at the deadline and the turn answers 504."""

    class HeadDrip(JsonHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with contextlib.suppress(OSError):  # the client gave up: what this test wants
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                for i in range(20):
                    self.wfile.write(f"X-Drip-{i}: a\r\n".encode())
                    self.wfile.flush()
                    time.sleep(0.3)
                self.wfile.write(b"Content-Length: 2\r\n\r\n{}")

    with running(HeadDrip) as base:
        started = time.monotonic()
        with pytest.raises(UpstreamError) as caught:
            _upstream(base, timeout_s=1).post(OPENAI_CHAT, {"messages": []}, False)
        assert caught.value.status == 504
        assert time.monotonic() - started < 2.5


def test_a_body_that_stops_coming_is_a_timeout() -> None:
    """A body shorter than its ``Content-Length``, the connection kept open: the
    read that waits for the rest times out (504 ``timeout``), as an answer
    that never comes does; the body is not 'cut'."""

    class Stalls(JsonHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b'{"choices": ')
            self.wfile.flush()
            time.sleep(2)

    with running(Stalls) as base:
        exchange = _upstream(base, timeout_s=0.5).post(OPENAI_CHAT, {"messages": []}, False)
        with pytest.raises(UpstreamError) as caught:
            exchange.read_all(OPENAI_CHAT)
    assert caught.value.status == 504 and caught.value.reason == "timeout"


def test_a_cookie_an_upstream_sets_is_never_sent_with_a_later_turn() -> None:
    """One gate connection pool serves every caller: a cookie one turn's answer sets
    must not travel with the next turn, whoever sends it."""
    cookies: list[str | None] = []

    class Handler(JsonHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            cookies.append(self.headers.get("Cookie"))
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Set-Cookie", "session=caller-one; Path=/")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with running(Handler) as base:
        upstream = _upstream(base)
        for _ in range(2):
            exchange = upstream.post(OPENAI_CHAT, {"messages": []}, False)
            assert exchange.read_all(OPENAI_CHAT) == b'{"ok": true}'
    assert cookies == [None, None]


def test_a_redirect_is_no_answer_and_is_never_followed() -> None:
    """A 3xx is neither an answer nor an error of the model: a 502 naming
    ``bad_upstream_response``; its Location is never asked."""
    asked: list[str] = []

    class Elsewhere(JsonHandler):
        def do_POST(self) -> None:
            asked.append(self.path)
            self._json(200, {"choices": []})

    with running(Elsewhere) as target:

        class Redirecting(JsonHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = b'{"choices": [{"message": {"content": "not from the model"}}]}'
                self.send_response(302)
                self.send_header("Location", target + "/v1/chat/completions")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        with running(Redirecting) as base, pytest.raises(UpstreamError) as caught:
            _upstream(base).post(OPENAI_CHAT, {"messages": []}, False)
    assert caught.value.status == 502 and caught.value.reason == "bad_upstream_response"
    assert asked == []


def test_a_base_url_is_used_as_requests_prepares_it() -> None:
    """Surrounding whitespace in a configured base URL is dropped, as it always was."""
    with running(_server(200, "application/json", [b'{"ok": true}'])) as base:
        exchange = _upstream(" " + base).post(OPENAI_CHAT, {"messages": []}, False)
        assert exchange.read_all(OPENAI_CHAT) == b'{"ok": true}'

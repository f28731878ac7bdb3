"""The one reader of outbound answers (STYLE 19) against a real local server:
one total deadline, a size bound counted decompressed, read failures named."""

from __future__ import annotations

import contextlib
import gzip
import time
from collections.abc import Iterator

import pytest
import requests
from local_http import JsonHandler, running

from sidecar.outbound.bounded_read import (
    BodyBroken,
    BodyTooLarge,
    BodyTooSlow,
    body_chunks,
    read_body,
)

PLAIN = b'{"status": "confirmed"}'


class Answers(JsonHandler):
    protocol_version = "HTTP/1.1"

    def _head(self, length: int, encoding: str | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(length))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.end_headers()

    def do_GET(self) -> None:
        with contextlib.suppress(OSError):  # a client that gave up: what some tests want
            self._answer()

    def _answer(self) -> None:
        if self.path == "/plain":
            self._head(len(PLAIN))
            self.wfile.write(PLAIN)
        elif self.path == "/gzip":
            raw = gzip.compress(PLAIN)
            self._head(len(raw), "gzip")
            self.wfile.write(raw)
        elif self.path == "/bomb":  # 64 KiB on the wire, 4 MiB decompressed
            raw = gzip.compress(b"0" * (4 << 20))
            self._head(len(raw), "gzip")
            self.wfile.write(raw)
        elif self.path == "/drip":  # each byte quickly, the whole slowly
            self._head(40)
            for _ in range(40):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.05)
        elif self.path == "/stall":  # one byte, then nothing
            self._head(10)
            self.wfile.write(b"{")
            self.wfile.flush()
            time.sleep(2)
        elif self.path == "/cut":  # fewer bytes than announced, then the end
            self._head(100)
            self.wfile.write(b"{")
            self.wfile.flush()
            self.close_connection = True


def _get(base: str, path: str, read_s: float = 5) -> requests.Response:
    return requests.get(base + path, stream=True, timeout=(2, read_s))


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with running(Answers) as url:
        yield url


def test_the_whole_body_is_read(base: str) -> None:
    with _get(base, "/plain") as resp:
        assert read_body(resp, time.monotonic() + 5, 1 << 20) == PLAIN


def test_a_compressed_body_is_read_decompressed(base: str) -> None:
    with _get(base, "/gzip") as resp:
        assert read_body(resp, time.monotonic() + 5, 1 << 20) == PLAIN


def test_the_size_bound_counts_decompressed_bytes(base: str) -> None:
    with _get(base, "/bomb") as resp, pytest.raises(BodyTooLarge) as caught:
        read_body(resp, time.monotonic() + 5, 1 << 20)
    assert caught.value.max_bytes == 1 << 20 and caught.value.received > 1 << 20


def test_the_deadline_bounds_the_whole_body_not_each_read(base: str) -> None:
    started = time.monotonic()
    with _get(base, "/drip") as resp, pytest.raises(BodyTooSlow) as caught:
        list(body_chunks(resp, started + 0.5, 1 << 20))
    assert time.monotonic() - started < 1.5
    assert 0 < caught.value.received < 40


def test_a_deadline_already_passed_reads_nothing(base: str) -> None:
    with _get(base, "/plain") as resp, pytest.raises(BodyTooSlow) as caught:
        read_body(resp, time.monotonic() - 1, 1 << 20)
    assert caught.value.received == 0


def test_a_stalled_read_is_broken_and_timed_out(base: str) -> None:
    with _get(base, "/stall", read_s=0.3) as resp, pytest.raises(BodyBroken) as caught:
        read_body(resp, time.monotonic() + 5, 1 << 20)
    assert caught.value.timed_out is True and caught.value.received == 1
    assert "Timeout" in caught.value.error


def test_a_cut_body_is_broken_not_timed_out(base: str) -> None:
    with _get(base, "/cut") as resp, pytest.raises(BodyBroken) as caught:
        read_body(resp, time.monotonic() + 5, 1 << 20)
    assert caught.value.timed_out is False and caught.value.error

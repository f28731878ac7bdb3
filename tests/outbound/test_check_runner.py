"""An HTTP check against a real local server: whatever it answers, the check
ends within its ``timeout_s``."""

from __future__ import annotations

import contextlib
import time

import requests
from local_http import JsonHandler, running

from sidecar.config_sections import HttpCheck
from sidecar.core.check_verdicts import CheckReason
from sidecar.outbound.check_runner import run_http


class _DrippingRedirect(JsonHandler):
    """A 302 whose body never ends (a byte every 0.1 s)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", "http://127.0.0.1:1/elsewhere")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with contextlib.suppress(OSError):
            for _ in range(100):
                self.wfile.write(b"1\r\nx\r\n")
                self.wfile.flush()
                time.sleep(0.1)


def test_a_redirect_whose_body_never_ends_times_out_at_the_check_s_deadline() -> None:
    """A 3xx answer's body is read under the check's deadline like any answer's
    (requests' own redirect handling would read it whole, however long it drips)."""
    session = requests.Session()
    session.trust_env = False
    with running(_DrippingRedirect) as base:
        check = HttpCheck(kind="http", url=base + "/record/1", timeout_s=1)
        started = time.monotonic()
        result = run_http(check, {}, session, {})
    assert result.reason is CheckReason.TIMEOUT
    assert time.monotonic() - started < 1 + 1

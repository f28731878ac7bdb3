"""An HTTP check against a real local server: whatever it answers, the check
ends within its ``timeout_s``."""

from __future__ import annotations

import time

import requests
from local_http import DrippingRedirect, running

from sidecar.config_sections import HttpCheck
from sidecar.core.check_verdicts import CheckReason
from sidecar.outbound.check_runner import run_http


def test_a_redirect_whose_body_never_ends_times_out_at_the_check_s_deadline() -> None:
    """A 3xx answer's body is read under the check's deadline like any answer's
    (requests' own redirect handling would read it whole, however long it drips)."""
    session = requests.Session()
    session.trust_env = False
    with running(DrippingRedirect) as base:
        check = HttpCheck(kind="http", url=base + "/record/1", timeout_s=1)
        started = time.monotonic()
        result = run_http(check, {}, session, {})
    assert result.reason is CheckReason.TIMEOUT
    assert time.monotonic() - started < 1 + 1

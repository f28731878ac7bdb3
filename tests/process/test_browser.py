"""The operator page in a real headless Chromium (Debian's), driven by Playwright."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from served import Sidecar, tokens_yaml, write_config

from conftest import ADMIN_TOKEN, N8N_TOKEN

pytestmark = pytest.mark.slow

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail(
            "chromium is not installed: the browser test needs it "
            "(scripts/test installs Debian's chromium with apt-get)"
        )
    return found


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page()
        yield page
        browser.close()


def test_operator_sees_a_stopped_chain_and_stops_a_workflow(
    tmp_path: Path, sidecar_env: dict[str, str], browser_page: object
) -> None:
    from playwright.sync_api import Page, expect

    page: Page = browser_page  # type: ignore[assignment]
    config = write_config(tmp_path / "loopstop.yaml", tokens_yaml())
    served = Sidecar(tmp_path, {**sidecar_env, "LOOPSTOP_CONFIG": str(config)}).start()
    try:
        api = f"{served.base}/v1"
        n8n = {"Authorization": f"Bearer {N8N_TOKEN}"}
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        chain = requests.post(
            f"{api}/activations",
            headers=n8n,
            timeout=10,
            json={"workflow": "wf-sheet", "event_key": "row:5", "content": {"a": 1}},
        ).json()
        requests.post(
            f"{api}/chains/{chain['chain_id']}/stop",
            headers=admin,
            timeout=10,
            json={"reason": "runaway sheet loop"},
        )

        response = page.goto(f"{served.base}/ui")
        assert response is not None and response.status == 401
        page.fill("#token", ADMIN_TOKEN)
        page.click("#login")
        expect(page.locator("#chains")).to_contain_text(chain["chain_id"])
        expect(page.locator("#chains")).to_contain_text("stopped: runaway sheet loop")
        expect(page.locator("#who")).to_have_text("operator")
        cookies = page.context.cookies()
        session = next(c for c in cookies if c["name"] == "loopstop_session")
        assert session["httpOnly"] and session["sameSite"] == "Strict"
        assert ADMIN_TOKEN not in session["value"]

        page.fill("#workflow", "wf-browser")
        page.fill("#reason", "stopped from the page")
        page.click("#stop")
        expect(page.locator("#message")).to_contain_text("Workflow stopped")
        after = requests.post(
            f"{api}/activations",
            headers=n8n,
            timeout=10,
            json={"workflow": "wf-browser", "event_key": "e", "content": {"a": 1}},
        ).json()
        assert (after["decision"], after["reason"]) == ("drop", "stopped")

        page.click(f"text={chain['chain_id']}")
        expect(page.locator("#timeline circle")).to_have_count(1)
    finally:
        served.stop()


ATTACK_PAGE = """<!doctype html><html><body>
<form id="f" method="POST" action="{api}/operations/mail:1/reconcile">
  <input name="outcome" value="not_committed"><input name="evidence" value="x">
  <input name="workflow" value="wf-mail">
</form>
<script>
  const api = "{api}";
  fetch(api + "/workflows/wf-mail/stop", {{method: "POST", mode: "no-cors",
    headers: {{"Content-Type": "text/plain"}}, body: '{{"reason": "pwned"}}'}})
  .catch(() => null)
  .then(() => fetch(api + "/workflows/wf-json/stop", {{method: "POST",
    headers: {{"Content-Type": "application/json"}}, body: '{{"reason": "pwned"}}'}}))
  .catch(() => null)
  .then(() => {{ document.title = "sent"; document.getElementById("f").submit(); }});
</script></body></html>"""


def test_a_foreign_page_in_a_real_browser_cannot_drive_the_sidecar(tmp_path: Path) -> None:
    """No tokens (loopback only): a page of another origin, opened in Chromium,
    posts a cross-site form (reconcile an unknown write as not committed), a
    no-cors text/plain fetch (stop a workflow) and a JSON fetch (needs a
    preflight); a page on a foreign name resolving to 127.0.0.1 (DNS
    rebinding) reads the API. Every request reaches the sidecar and is
    refused; nothing changes."""
    from http.server import BaseHTTPRequestHandler

    from local_http import running
    from playwright.sync_api import sync_playwright

    from conftest import SECRET

    served = Sidecar(tmp_path, {"LOOPSTOP_SECRET": SECRET}, workers=1).start()
    api = f"{served.base}/v1"
    page_html = ATTACK_PAGE.format(api=api).encode()

    class Attacker(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page_html)))
            self.end_headers()
            self.wfile.write(page_html)

    try:
        r = requests.post(
            f"{api}/operations/mail:1/begin", json={"payload": 1, "workflow": "wf-mail"}, timeout=10
        )
        assert r.json()["decision"] == "execute"
        fail = {"attempt": 1, "outcome": "unknown", "workflow": "wf-mail"}
        assert requests.post(f"{api}/operations/mail:1/fail", json=fail, timeout=10).ok
        seen: list[tuple[str, str, int]] = []
        rules = "--host-resolver-rules=MAP evil.example 127.0.0.1"
        with running(Attacker) as attacker, sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=chromium_path(), headless=True, args=[*CHROMIUM_ARGS, rules]
            )
            page = browser.new_page()
            page.on(
                "response",
                lambda resp: (
                    seen.append((resp.request.method, resp.url, resp.status))
                    if resp.url.startswith(served.base)
                    else None
                ),
            )
            with page.expect_navigation(url=f"{api}/operations/mail:1/reconcile"):
                page.goto(attacker.replace("127.0.0.1", "localhost") + "/")
            assert page.title() != "sent"  # now the sidecar's answer to the form
            rebound = page.goto(f"http://evil.example:{served.port}/v1/operations?state=unknown")
            assert rebound is not None and rebound.status == 421
            assert "mail:1" not in page.content()
            metrics = page.goto(f"http://evil.example:{served.port}/metrics")
            assert metrics is not None and metrics.status == 421
            browser.close()
        statuses = {(m, url.removeprefix(api)): s for m, url, s in seen}
        print(f"what the browser sent and the sidecar answered: {sorted(statuses.items())}")
        assert statuses[("POST", "/operations/mail:1/reconcile")] == 403  # foreign Origin
        assert statuses[("POST", "/workflows/wf-mail/stop")] in (403, 415)
        # The JSON fetch never left the preflight, which the server refused.
        assert ("POST", "/workflows/wf-json/stop") not in statuses
        assert statuses.get(("OPTIONS", "/workflows/wf-json/stop"), 403) == 403
        # Nothing changed: the write is still unknown, no workflow is stopped.
        again = requests.post(
            f"{api}/operations/mail:1/begin", json={"payload": 1, "workflow": "wf-mail"}, timeout=10
        )
        assert again.json()["decision"] == "reconcile"
        for wf in ("wf-mail", "wf-json"):
            assert requests.get(f"{api}/workflows/{wf}", timeout=10).json()["stopped"] is None
    finally:
        served.stop()

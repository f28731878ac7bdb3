"""The operator page in a real headless Chromium (Debian's), driven by Playwright."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from test_serve import Sidecar, tokens_yaml, write_config

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
        expect(page.locator("#message")).to_contain_text("workflow wf-browser stopped")
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

"""Logging in to the operator page (``/ui``) through a Flask test client."""

from __future__ import annotations

import re

from flask.testing import FlaskClient


def login_csrf(client: FlaskClient) -> str:
    """The CSRF token the login form carries."""
    page = client.get("/ui/login").get_data(as_text=True)
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, page[:500]
    return match.group(1)


def login(client: FlaskClient, token: str) -> str:
    r = client.post("/ui/login", data={"token": token, "csrf": login_csrf(client)})
    assert r.status_code == 303, r.get_data(as_text=True)
    cookie = r.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert token not in cookie  # the value never reaches the browser's cookie jar
    page = client.get("/ui").get_data(as_text=True)
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, page[:500]
    return match.group(1)

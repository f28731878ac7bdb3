"""The model gate's upstreams (DESIGN §5): one per API under
``model_gate.upstreams`` (``upstream_url``/``api_key_env`` remain the
``openai`` entry), the real key in the API's own header, the request's path,
query and version headers forwarded and nothing else of it, and the loopstop
token read where each API's client puts its key. Real local servers, no mocks."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_llm import FakeLLM, serve
from local_http import JsonHandler, running
from task_agent import Agent

from conftest import N8N_TOKEN, Api, AppFactory
from sidecar.auth import presented_token
from sidecar.config import load_settings
from sidecar.errors import ConfigError, GateNotConfigured
from sidecar.gate.wire import OPENAI_CHAT
from sidecar.gate.wire.base import BEARER, Inbound, TokenFrom
from sidecar.gate.wire.base import Api as WireApi
from sidecar.outbound.upstream import Upstream, upstream_pool

CHAT = "/v1/openai/chat/completions"


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with serve() as fake:
        yield fake


def chat_body(task_id: str) -> dict[str, Any]:
    return {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": f"Be brief.\nloopstop-task: {task_id}"},
            {"role": "user", "content": "hi"},
        ],
    }


# -- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gate",
    [
        {"upstream_url": "http://a/v1", "upstreams": {"openai": {"url": "http://b/v1"}}},
        {"api_key_env": "K", "upstreams": {"openai": {"url": "http://b/v1"}}},
    ],
)
def test_upstream_url_and_upstreams_openai_together_are_a_config_error(
    gate: dict[str, Any],
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"model_gate": gate}, {})
    assert [p for p, _ in info.value.problems] == ["model_gate.upstreams.openai"]


@pytest.mark.parametrize(
    ("entry", "path"),
    [
        ({"url": "api.anthropic.com"}, "model_gate.upstreams.anthropic"),
        ({"url": "https://h?x=1"}, "model_gate.upstreams.anthropic"),
        ({"api_key_env": "K"}, "model_gate.upstreams.anthropic.url"),
        (
            {"url": "https://h", "api_key_env": "not a name"},
            "model_gate.upstreams.anthropic.api_key_env",
        ),
        ({"url": "https://h", "key": "sk-in-the-file"}, "model_gate.upstreams.anthropic.key"),
    ],
)
def test_a_bad_upstream_entry_is_named_by_its_path(entry: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"model_gate": {"upstreams": {"anthropic": entry}}}, {})
    assert path in [p for p, _ in info.value.problems], info.value.problems


def test_an_unknown_api_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"model_gate": {"upstreams": {"mistral": {"url": "https://h"}}}}, {})
    assert info.value.problems[0][0] == "model_gate.upstreams.mistral"


@pytest.mark.slow  # runs the CLI in a process
def test_check_config_reports_both_set_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "both.yaml").write_text(
        "model_gate:\n  upstream_url: http://a/v1\n  upstreams: {openai: {url: 'http://b/v1'}}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "check-config"],
        cwd=tmp_path,
        env={"LOOPSTOP_CONFIG": "both.yaml", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "model_gate.upstreams.openai" in out.stderr, out.stderr


# -- the openai entry, either way ---------------------------------------------------------------


@pytest.mark.parametrize("how", ["upstream_url", "upstreams"])
def test_the_openai_upstream_either_way_gets_its_key_as_a_bearer_token(
    make_app: AppFactory, llm: FakeLLM, how: str
) -> None:
    if how == "upstream_url":
        gate: dict[str, Any] = {"upstream_url": llm.base, "api_key_env": "UPSTREAM_KEY"}
    else:
        gate = {"upstreams": {"openai": {"url": llm.base, "api_key_env": "UPSTREAM_KEY"}}}
    api = Api(make_app(model_gate=gate, environ={"UPSTREAM_KEY": "sk-real"}).test_client())
    a = Agent(api)
    llm.mode = "final"
    assert api.post(CHAT, chat_body(a.id))[0] == 200
    assert llm.auth == ["Bearer sk-real"]
    assert N8N_TOKEN not in json.dumps(llm.headers)


def test_an_upstream_without_api_key_env_gets_no_key(make_app: AppFactory, llm: FakeLLM) -> None:
    api = Api(make_app(model_gate={"upstreams": {"openai": {"url": llm.base}}}).test_client())
    a = Agent(api)
    llm.mode = "final"
    assert api.post(CHAT, chat_body(a.id))[0] == 200
    assert llm.auth == [None]
    assert N8N_TOKEN not in json.dumps(llm.headers)


def test_the_query_is_forwarded_and_the_token_is_not(make_app: AppFactory, llm: FakeLLM) -> None:
    gate = {"upstreams": {"openai": {"url": llm.base, "api_key_env": "K"}}}
    api = Api(make_app(model_gate=gate, environ={"K": "sk-real"}).test_client())
    a = Agent(api)
    llm.mode = "final"
    assert api.post(CHAT + "?api-version=2025-03-01-preview&x=%2F", chat_body(a.id))[0] == 200
    assert llm.paths == ["/v1/chat/completions?api-version=2025-03-01-preview&x=%2F"]
    assert api.get("/v1/openai/models", limit=5)[0] == 200
    assert llm.lists[-1][0] == "/v1/models?limit=5"
    assert llm.lists[-1][1]["authorization"] == "Bearer sk-real"


def test_an_api_without_upstream_answers_503_naming_the_setting(make_app: AppFactory) -> None:
    api = Api(make_app().test_client())
    a = Agent(api)
    for status, out in (api.get("/v1/openai/models"), api.post(CHAT, chat_body(a.id))):
        assert status == 503 and out["type"].endswith("model-gate-not-configured")
        assert "model_gate.upstream_url" in out["detail"]
    assert api.get(a.base)[1]["task"]["used"]["model_calls"] == 0


# -- the upstream client: the API's key header, version headers, dropped query parameters ------


class _Echo(JsonHandler):
    """Answers every request with its path and headers."""

    def _echo(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k.lower(): v for k, v in self.headers.items()}
        self._json(200, {"path": self.path, "headers": headers})

    do_GET = _echo
    do_POST = _echo


SPEC = WireApi(
    "test",
    "x-api-key",
    pass_headers=("anthropic-version", "anthropic-beta"),
    default_headers=(("anthropic-version", "2023-06-01"),),
    drop_query=("key",),
)


def test_the_upstream_gets_the_key_in_the_api_s_header_and_only_version_headers() -> None:
    given = {
        "anthropic-version": "2024-01-01",
        "anthropic-beta": "b1",
        "x-api-key": "loopstop-token",
        "authorization": "Bearer loopstop-token",
        "cookie": "c",
    }
    with running(_Echo) as base:
        up = Upstream(upstream_pool(), base, "sk-real", 5, api=SPEC)
        seen = up.get_json(OPENAI_CHAT, "/v1/models", Inbound("/v1/models", "key=tok&a=1", given))
        assert seen["path"] == "/v1/models?a=1"
        h = seen["headers"]
        assert h["x-api-key"] == "sk-real" and h["anthropic-version"] == "2024-01-01"
        assert h["anthropic-beta"] == "b1"
        assert "authorization" not in h and "cookie" not in h
        assert "loopstop-token" not in json.dumps(seen)
        exchange = up.post(OPENAI_CHAT, {}, False, Inbound("/v1/messages", "key=tok", {}))
        seen = json.loads(exchange.read_all(OPENAI_CHAT))
        assert seen["path"] == "/v1/messages"
        assert seen["headers"]["anthropic-version"] == "2023-06-01"  # the default
        keyless = Upstream(upstream_pool(), base, None, 5, api=SPEC)
        assert "x-api-key" not in keyless.get_json(OPENAI_CHAT, "/v1/models")["headers"]


def test_an_upstream_without_url_names_its_setting() -> None:
    up = Upstream(upstream_pool(), None, None, 5, api=SPEC, setting="model_gate.upstreams.x.url")
    with pytest.raises(GateNotConfigured, match=r"model_gate\.upstreams\.x\.url"):
        up.url("/v1/messages")


# -- where the token is read -----------------------------------------------------------------------

X_API_KEY = TokenFrom("x-api-key")
KEY_QUERY = TokenFrom(query="key")


@pytest.mark.parametrize(
    ("headers", "query", "sources", "token"),
    [
        ({"authorization": "Bearer tok"}, {}, (BEARER,), "tok"),
        ({"authorization": "bearer  tok "}, {}, (BEARER,), "tok"),
        ({"authorization": "Basic dG9r"}, {}, (BEARER,), None),
        ({"authorization": "Bearer "}, {}, (BEARER,), None),
        ({"x-api-key": "tok"}, {}, (BEARER,), None),
        ({"x-api-key": "tok"}, {}, (X_API_KEY, BEARER), "tok"),
        ({"authorization": "Bearer tok"}, {}, (X_API_KEY, BEARER), "tok"),
        ({"x-api-key": "a", "authorization": "Bearer b"}, {}, (X_API_KEY, BEARER), "a"),
        ({}, {"key": "tok"}, (X_API_KEY, KEY_QUERY), "tok"),
        ({}, {"key": "tok"}, (BEARER,), None),
        ({}, {}, (X_API_KEY, BEARER), None),
    ],
)
def test_the_token_is_read_where_the_api_s_client_puts_its_key(
    headers: dict[str, str],
    query: dict[str, str],
    sources: tuple[TokenFrom, ...],
    token: str | None,
) -> None:
    assert presented_token(headers, query, sources) == token

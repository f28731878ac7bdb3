"""The model gate's other APIs as the gate tests drive them (beside OpenAI's
``chat`` and ``responses`` in test_model_gate.py): one turn's path and body as
the API's n8n node sends it, and what of the answer reached the agent (its
text and the calls relayed), streamed or not, per API (``which``).

The stand-in model (tests/fake_llm.py) serves every API at once at its
``root``; the hostile modes reach each API's answer.
"""

from __future__ import annotations

import json
from typing import Any

import sseclient
from fake_llm import FakeLLM

from conftest import N8N_TOKEN, Api

#: The APIs besides OpenAI's two, each through its own adapter.
OTHER = ["anthropic", "gemini", "ollama", "azure"]
#: The APIs that give calls no id (the gate numbers them by position).
ID_LESS = ("gemini", "ollama")
AZURE_VERSION = "2025-03-01-preview"
USER = "Where is my order ORD-7?"
SCHEMA = {"type": "object", "properties": {}}


def upstreams(llm: FakeLLM) -> dict[str, Any]:
    """``model_gate.upstreams`` for every API but OpenAI: the stand-in, the key in
    ``UPSTREAM_KEY``."""
    return {name: {"url": llm.root, "api_key_env": "UPSTREAM_KEY"} for name in OTHER}


def build(
    which: str, system: str, stream: bool, chat_body: dict[str, Any], **extra: Any
) -> tuple[str, dict[str, Any]]:
    """The path and body of a turn of ``which`` with ``system`` as its System
    Message and one tool, ``echo``; ``chat_body`` is the Chat Completions request
    (Azure's body, ``stream`` in it); ``extra`` fields are merged into the body."""
    assert "history" not in extra, "a history is built for chat and responses only"
    if which == "azure":
        path = (
            f"/v1/azure/openai/deployments/fake-model/chat/completions?api-version={AZURE_VERSION}"
        )
        return path, chat_body
    if which == "anthropic":
        body: dict[str, Any] = {
            "model": "fake-model",
            "max_tokens": 1024,
            "system": system,
            "messages": [{"role": "user", "content": USER}],
            "tools": [{"name": "echo", "input_schema": SCHEMA}],
            "stream": stream,
        }
        return "/v1/anthropic/v1/messages", {**body, **extra}
    if which == "gemini":
        method = "streamGenerateContent?alt=sse&" if stream else "generateContent?"
        body = {
            "systemInstruction": {"parts": [{"text": system}]},
            "contents": [{"role": "user", "parts": [{"text": USER}]}],
            "tools": [{"functionDeclarations": [{"name": "echo", "parameters": SCHEMA}]}],
        }
        return f"/v1/gemini/v1beta/models/fake-model:{method}key={N8N_TOKEN}", {**body, **extra}
    assert which == "ollama", which
    body = {
        "model": "fake-model",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": USER}],
        "tools": [{"type": "function", "function": {"name": "echo", "parameters": SCHEMA}}],
        "stream": stream,
    }
    return "/v1/ollama/api/chat", {**body, **extra}


def money_body(which: str, limit: int) -> dict[str, Any]:
    """The fields that allow at most ``limit`` output tokens in ``which``."""
    if which in ("anthropic", "azure"):
        return {"max_tokens": limit}
    if which == "gemini":
        return {"generationConfig": {"maxOutputTokens": limit}}
    return {"options": {"num_predict": limit}}


def read(which: str, answer: dict[str, Any]) -> tuple[str, list[str]]:
    """A non-streamed answer's text and the calls it relays (ids; tool names for
    an API without ids)."""
    if which == "azure":
        message = answer["choices"][0]["message"]
        return str(message["content"] or ""), [c["id"] for c in message.get("tool_calls") or []]
    if which == "anthropic":
        blocks = answer["content"]
        text = "".join(b["text"] for b in blocks if b["type"] == "text")
        return text, [b["id"] for b in blocks if b["type"] == "tool_use"]
    if which == "gemini":
        return _gemini_parts([answer])
    message = answer["message"]
    return str(message.get("content") or ""), [
        c["function"]["name"] for c in message.get("tool_calls") or []
    ]


def _gemini_parts(chunks: list[dict[str, Any]]) -> tuple[str, list[str]]:
    parts = [
        p
        for c in chunks
        for cand in c.get("candidates") or []
        for p in (cand.get("content") or {}).get("parts") or []
    ]
    text = "".join(p.get("text") or "" for p in parts)
    return text, [p["functionCall"]["name"] for p in parts if "functionCall" in p]


def read_stream(which: str, raw: bytes) -> tuple[str, list[str], list[dict[str, Any]]]:
    """A streamed answer's text, the calls it relays and its events (parsed)."""
    if which == "ollama":
        lines = [json.loads(x) for x in raw.splitlines() if x.strip()]
        text = "".join((x.get("message") or {}).get("content") or "" for x in lines)
        calls = [
            c["function"]["name"]
            for x in lines
            for c in (x.get("message") or {}).get("tool_calls") or []
        ]
        return text, calls, lines
    events = [
        json.loads(e.data)
        for e in sseclient.SSEClient([raw]).events()
        if e.data and e.data != "[DONE]"
    ]
    if which == "gemini":
        return (*_gemini_parts(events), events)
    if which == "anthropic":
        text = "".join(
            e["delta"].get("text") or "" for e in events if e.get("type") == "content_block_delta"
        )
        ids = [
            e["content_block"]["id"]
            for e in events
            if e.get("type") == "content_block_start" and e["content_block"]["type"] == "tool_use"
        ]
        return text, ids, events
    deltas = [c["choices"][0]["delta"] for c in events if c.get("choices")]
    text = "".join(d.get("content") or "" for d in deltas)
    return text, [t["id"] for d in deltas for t in d.get("tool_calls") or [] if "id" in t], events


def ask(
    api: Api, which: str, stream: bool, path: str, body: dict[str, Any]
) -> tuple[int, str, list[str], Any]:
    """One turn of ``which``: the status, the assistant text, the calls that
    reached the agent, and the answer (its body, or its parsed events)."""
    if not stream:
        status, out = api.post(path, body)
        if status != 200:
            return status, "", [], out
        return (status, *read(which, out), out)
    r = api.client.post(path, json=body, headers={"Authorization": f"Bearer {N8N_TOKEN}"})
    if r.status_code != 200:
        return r.status_code, "", [], r.get_json(silent=True)
    text, calls, events = read_stream(which, r.get_data())
    return 200, text, calls, events

"""The money and number rules of every adapter (DESIGN §3 ``max_cost``, §5), as
tables of wire samples: the output limit each API reads and is sent
(``with_output_limit``), what else bounds a request's cost (``spend``: the
choices it asks for, a field whose cost its bytes do not bound), numbers
bounded at parse, token counts past any turn read as no usage, and
``"error": null`` read as no error in each stream."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.errors import MalformedRequest
from sidecar.gate.wire import (
    ANTHROPIC_MESSAGES,
    AZURE_CHAT,
    AZURE_RESPONSES,
    GEMINI_GENERATE,
    GEMINI_STREAM,
    OLLAMA,
    WireAdapter,
)
from sidecar.gate.wire.base import ErrorEvent, Final, Frame, Passed, Spend, Stamp, json_frame

STAMP = Stamp(1_700_000_000, "abc")

USER = {"role": "user", "content": "hi"}
ANTHROPIC = {"model": "m", "max_tokens": 100, "messages": [USER]}
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
OLLAMA_BODY = {"model": "m", "messages": [USER]}
AZURE = {"messages": [USER]}


def _get(body: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        body = body[key]
    return body


# -- the output limit --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "body", "field"),
    [
        (
            ANTHROPIC_MESSAGES,
            {k: v for k, v in ANTHROPIC.items() if k != "max_tokens"},
            "max_tokens",
        ),
        (GEMINI_GENERATE, GEMINI, "generationConfig.maxOutputTokens"),
        (
            GEMINI_STREAM,
            {**GEMINI, "generation_config": {"temperature": 0}},
            "generation_config.maxOutputTokens",
        ),
        (OLLAMA, OLLAMA_BODY, "options.num_predict"),
        (OLLAMA, {**OLLAMA_BODY, "options": {"num_predict": -1, "seed": 3}}, "options.num_predict"),
        (AZURE_CHAT, AZURE, "max_completion_tokens"),
        (AZURE_RESPONSES, {"input": "hi"}, "max_output_tokens"),
    ],
)
def test_the_output_limit_sent_is_the_one_the_api_reads(
    adapter: WireAdapter, body: dict[str, Any], field: str
) -> None:
    """A request that sets no limit (Ollama's -1 is none) is sent the reserved one,
    in the field its API reads; the request's other settings are kept."""
    assert adapter.max_output_tokens(body) is None
    sent = adapter.with_output_limit(body, 77)
    assert _get(sent, field) == 77 and adapter.max_output_tokens(sent) == 77
    if field.startswith("generation_config"):
        assert sent["generation_config"]["temperature"] == 0
    if "seed" in str(body):
        assert sent["options"]["seed"] == 3
    adapter.validate(sent)


# -- what else bounds the cost -----------------------------------------------------------

IMAGE_URL = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
IMAGE_FILE = {"type": "document", "source": {"type": "file", "file_id": "file_1"}}
IMAGE_INLINE = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": "AA"},
}


@pytest.mark.parametrize(
    ("adapter", "body", "spend"),
    [
        (ANTHROPIC_MESSAGES, ANTHROPIC, Spend()),
        (
            ANTHROPIC_MESSAGES,
            {**ANTHROPIC, "tools": [{"name": "echo", "input_schema": {}}]},
            Spend(),
        ),
        (
            ANTHROPIC_MESSAGES,
            {
                **ANTHROPIC,
                "tools": [{"name": "echo"}, {"type": "web_search_20250305", "name": "w"}],
            },
            Spend(unbounded="tools.1.type"),
        ),
        (ANTHROPIC_MESSAGES, {**ANTHROPIC, "container": "cont_1"}, Spend(unbounded="container")),
        (
            ANTHROPIC_MESSAGES,
            {**ANTHROPIC, "mcp_servers": [{"type": "url", "url": "https://m", "name": "m"}]},
            Spend(unbounded="mcp_servers"),
        ),
        (
            ANTHROPIC_MESSAGES,
            {**ANTHROPIC, "messages": [{"role": "user", "content": [IMAGE_INLINE, IMAGE_URL]}]},
            Spend(unbounded="messages.0.content.1"),
        ),
        (
            ANTHROPIC_MESSAGES,
            {
                **ANTHROPIC,
                "messages": [
                    USER,
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t", "content": [IMAGE_FILE]}
                        ],
                    },
                ],
            },
            Spend(unbounded="messages.1.content.0.content.0"),
        ),
        (GEMINI_GENERATE, GEMINI, Spend()),
        (GEMINI_GENERATE, {**GEMINI, "generationConfig": {"candidateCount": 3}}, Spend(choices=3)),
        (
            GEMINI_GENERATE,
            {**GEMINI, "cachedContent": "cachedContents/1"},
            Spend(unbounded="cachedContent"),
        ),
        (
            GEMINI_GENERATE,
            {**GEMINI, "tools": [{"functionDeclarations": []}, {"googleSearch": {}}]},
            Spend(unbounded="tools.1.googleSearch"),
        ),
        (
            GEMINI_STREAM,
            {
                "contents": [
                    {
                        "role": "user",
                        "parts": [{"text": "see"}, {"fileData": {"fileUri": "gs://b/f"}}],
                    }
                ]
            },
            Spend(unbounded="contents.0.parts.1"),
        ),
        (OLLAMA, {**OLLAMA_BODY, "messages": [{**USER, "images": ["AAAA"]}]}, Spend()),
        (AZURE_CHAT, {**AZURE, "n": 2}, Spend(choices=2)),
        (
            AZURE_RESPONSES,
            {"input": "hi", "previous_response_id": "r"},
            Spend(unbounded="previous_response_id"),
        ),
    ],
)
def test_spend_names_the_choices_and_what_the_bytes_do_not_bound(
    adapter: WireAdapter, body: dict[str, Any], spend: Spend
) -> None:
    """Under a money budget the field ``unbounded`` names is refused (422 naming it)."""
    assert adapter.spend(body) == spend


# -- numbers bounded at parse ------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapter", "body", "loc"),
    [
        (ANTHROPIC_MESSAGES, {**ANTHROPIC, "max_tokens": 10**30}, ["max_tokens"]),
        (ANTHROPIC_MESSAGES, {**ANTHROPIC, "max_tokens": 0}, ["max_tokens"]),
        (ANTHROPIC_MESSAGES, {**ANTHROPIC, "max_tokens": 1.7e308}, ["max_tokens"]),
        (
            GEMINI_GENERATE,
            {**GEMINI, "generationConfig": {"maxOutputTokens": 10**30}},
            ["generationConfig", "maxOutputTokens"],
        ),
        (
            GEMINI_STREAM,
            {**GEMINI, "generationConfig": {"candidateCount": 1000}},
            ["generationConfig", "candidateCount"],
        ),
        (
            GEMINI_GENERATE,
            {**GEMINI, "generation_config": {"max_output_tokens": True}},
            ["generation_config", "max_output_tokens"],
        ),
        (OLLAMA, {**OLLAMA_BODY, "options": {"num_predict": 10**30}}, ["options", "num_predict"]),
        (OLLAMA, {**OLLAMA_BODY, "options": {"num_predict": -3}}, ["options", "num_predict"]),
        (AZURE_CHAT, {**AZURE, "max_tokens": 10**30}, ["max_tokens"]),
    ],
)
def test_a_limit_past_any_bound_is_refused_naming_the_field(
    adapter: WireAdapter, body: dict[str, Any], loc: list[str]
) -> None:
    with pytest.raises(MalformedRequest) as caught:
        adapter.validate(body)
    assert caught.value.extra["errors"][0]["loc"] == ["body", *loc]


@pytest.mark.parametrize(
    ("adapter", "usage"),
    [
        (ANTHROPIC_MESSAGES, {"input_tokens": 1, "output_tokens": 10**400}),
        (GEMINI_GENERATE, {"promptTokenCount": 1, "totalTokenCount": 10**308}),
        (OLLAMA, {"prompt_eval_count": 10**308, "eval_count": 1}),
        (AZURE_CHAT, {"prompt_tokens": 1, "completion_tokens": 10**400}),
    ],
)
def test_a_token_count_past_any_turn_is_no_usage(adapter: WireAdapter, usage: Any) -> None:
    """The turn is then charged its reservation: never free, never a 500."""
    read = adapter.usage(usage)
    assert read.tokens is None and read.split is None


# -- "error": null -----------------------------------------------------------------------


def _frames(adapter: WireAdapter, frames: list[Frame]) -> list[Any]:
    reader = adapter.stream_reader({})
    events: list[Any] = []
    for f in frames:
        events += reader.feed(f)
    return events


def test_error_null_is_no_error_in_an_ollama_stream() -> None:
    line = '{"model":"m","message":{"role":"assistant","content":"hi"},"done":false,"error":null}'
    done = '{"model":"m","message":{"role":"assistant","content":""},"done":true,"error":null}'
    reader = OLLAMA.stream_reader({})
    events = [*reader.feed(Frame(line)), *reader.feed(Frame(done))]
    assert [type(e) for e in events] == [Passed, Final]
    assert b"error" not in events[0].raw  # a null member is not relayed: a client tests the key
    assert b"error" not in reader.finish([], None, STAMP)[-1]
    assert isinstance(_frames(OLLAMA, [Frame('{"error":"boom"}')])[0], ErrorEvent)


def test_error_null_is_no_error_in_a_gemini_stream() -> None:
    chunk = (
        '{"candidates":[{"content":{"parts":[{"text":"hi"}]},"finishReason":"STOP"}],"error":null}'
    )
    (event,) = _frames(GEMINI_STREAM, [Frame(chunk)])
    assert isinstance(event, Passed) and "error" not in json_frame(Frame(event.raw[6:].decode()))
    error = '{"error":{"code":500,"message":"boom","status":"INTERNAL"}}'
    assert isinstance(_frames(GEMINI_STREAM, [Frame(error)])[0], ErrorEvent)


def test_error_null_is_no_error_in_an_anthropic_stream() -> None:
    """Anthropic's error is the event whose ``type`` is ``error``; an ``"error": null``
    member on another event is nothing."""
    start = '{"type":"message_start","message":{"id":"m","usage":{"input_tokens":1}},"error":null}'
    (event,) = _frames(ANTHROPIC_MESSAGES, [Frame(start, "message_start")])
    assert isinstance(event, Passed)
    error = '{"type":"error","error":{"type":"overloaded_error","message":"x"}}'
    assert isinstance(_frames(ANTHROPIC_MESSAGES, [Frame(error, "error")])[0], ErrorEvent)

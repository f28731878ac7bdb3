"""What both OpenAI APIs share: errors, usage, output limits and the model list."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.gate.wire.base import (
    MAX_CHOICES,
    MAX_OUTPUT_LIMIT,
    OPENAI,
    Framing,
    Proposal,
    Spend,
    Usage,
    bad,
    check_int,
    sse,
    token_count,
)
from sidecar.gate.wire.conversation import Conversation


def validate_common(body: Mapping[str, Any]) -> None:
    """``stream`` and ``model``, as both APIs take them.

    :raises MalformedRequest: naming the field.
    """
    if "stream" in body and not isinstance(body["stream"], bool):
        raise bad("stream", "must be a boolean")
    if "model" in body and not isinstance(body["model"], str):
        raise bad("model", "must be a string")
    for name, most in (*((n, MAX_OUTPUT_LIMIT) for n in OUTPUT_LIMITS), ("n", MAX_CHOICES)):
        check_int(body.get(name), name, 1, most)


#: The output limits either API takes, the first given wins.
OUTPUT_LIMITS = ("max_output_tokens", "max_completion_tokens", "max_tokens")
#: Request fields whose cost is held or decided upstream, not bounded by the request.
HELD_UPSTREAM = ("previous_response_id", "conversation", "prompt")
#: Content parts whose tokens the request's bytes do not bound when they are
#: referenced (by URL or file id) rather than inline.
_REFERENCE_KEYS = ("file_id", "file_url")
#: Tool types whose use costs beyond tokens (hosted tools); a function tool does not.
_TOKEN_TOOLS = ("function", "custom")


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def parts_text(content: Any) -> Any:
    """A content that is a non-empty list of text parts (``{"type": "text",
    "text": ...}``), as its text; any other content as it is."""
    if (
        isinstance(content, list)
        and content
        and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        )
    ):
        return "".join(p["text"] for p in content)
    return content


def is_system(item: Any) -> bool:
    """A ``system`` or ``developer`` message (a chat message or a Responses input item)."""
    return (
        isinstance(item, dict)
        and item.get("role") in ("system", "developer")
        and item.get("type", "message") == "message"
    )


_count = token_count


def split(usage: Any) -> tuple[int, int] | None:
    """``(input, output)`` tokens of a usage object of either OpenAI API
    (``input_tokens``/``output_tokens`` or ``prompt_tokens``/``completion_tokens``)."""
    if not isinstance(usage, Mapping):
        return None
    for names in (("input_tokens", "output_tokens"), ("prompt_tokens", "completion_tokens")):
        first, second = (_count(usage.get(n)) for n in names)
        if first is not None and second is not None:
            return first, second
    return None


def read_usage(usage: Any, names: tuple[str, ...]) -> Usage:
    """A usage object whose turn's tokens are the sum of ``names``."""
    if not isinstance(usage, dict):
        return Usage()
    parts = [_count(usage.get(n)) for n in names]
    tokens = None if None in parts else sum(p for p in parts if p is not None)
    return Usage(tokens, split(usage))


def _referenced(part: Any) -> bool:
    """A content part that references its media (a URL that is not a ``data:``
    URL, a file id) instead of carrying it."""
    if not isinstance(part, dict):
        return False
    if any(part.get(k) for k in _REFERENCE_KEYS):
        return True
    for key in ("image_url", "file", "input_file"):
        inner = part.get(key)
        if isinstance(inner, dict) and (
            any(inner.get(k) for k in _REFERENCE_KEYS) or _remote(inner.get("url"))
        ):
            return True
        if _remote(inner):
            return True
    return part.get("type") in ("input_image", "input_file", "item_reference") and (
        _remote(part.get("url")) or part.get("type") == "item_reference"
    )


def _remote(url: Any) -> bool:
    return isinstance(url, str) and bool(url) and not url.startswith("data:")


def spend(body: Mapping[str, Any], items_field: str) -> Spend:
    """``n`` choices (chat), and the first field whose cost the request's bytes
    do not bound: context held upstream (``previous_response_id``,
    ``conversation``, a stored ``prompt``), a hosted tool, or media
    referenced by URL or file id in the ``items_field`` list."""
    for name in HELD_UPSTREAM:
        if body.get(name) not in (None, ""):
            return Spend(unbounded=name)
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        if isinstance(tool, dict) and tool.get("type", "function") not in _TOKEN_TOOLS:
            return Spend(unbounded=f"tools.{i}.type")
    items = body.get(items_field)
    for i, item in enumerate(items if isinstance(items, list) else []):
        if _referenced(item):
            return Spend(unbounded=f"{items_field}.{i}")
        content = item.get("content") if isinstance(item, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if _referenced(part):
                return Spend(unbounded=f"{items_field}.{i}.content.{j}")
    n = body.get("n")
    return Spend(choices=n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1)


def max_output_tokens(body: Mapping[str, Any]) -> int | None:
    """``max_output_tokens`` (Responses), ``max_completion_tokens`` or ``max_tokens`` (chat)."""
    for name in OUTPUT_LIMITS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def error_body(message: str, code: str, kind: str = "loopstop_gate") -> dict[str, Any]:
    """OpenAI's error object (``{"error": {message, type, code, param}}``)."""
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


def upstream_error_body(status: int, answer: Any) -> dict[str, Any]:
    """The upstream's own error body when it is OpenAI-style, else one naming ``status``."""
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return answer
    return error_body(f"the upstream model answered {status}", "upstream_error")


def error_event(message: str, code: str) -> bytes:
    """An error the OpenAI client raises mid-stream (an event with an ``error`` member)."""
    body = error_body(message, code, "upstream_error")
    return sse({"type": "error", **body, "message": message, "code": code}, "error")


def model_list(listed: Any, default_model: str) -> dict[str, Any]:
    """``GET /models``: the upstream's list, or one naming ``default_model``."""
    if isinstance(listed, dict) and isinstance(listed.get("data"), list):
        return listed
    return {
        "object": "list",
        "data": [{"id": default_model, "object": "model", "created": 0, "owned_by": "loopstop"}],
    }


class OpenAIBase(Conversation):
    """The members both OpenAI adapters share."""

    api = OPENAI
    framing = Framing.SSE
    models_path = "/models"

    def streaming(self, body: Mapping[str, Any]) -> bool:
        """``stream: true``."""
        return bool(body.get("stream"))

    def model(self, body: Mapping[str, Any], route: Mapping[str, str]) -> str | None:
        """The body's ``model``."""
        model = body.get("model")
        return model if isinstance(model, str) and model else None

    def number_calls(self, body: Mapping[str, Any], proposals: list[Proposal]) -> list[Proposal]:
        """The proposals as they are: OpenAI gives every call its id."""
        return proposals

    def max_output_tokens(self, body: Mapping[str, Any]) -> int | None:
        """See :func:`max_output_tokens`."""
        return max_output_tokens(body)

    def error_body(self, message: str, code: str, kind: str = "loopstop_gate") -> dict[str, Any]:
        """See :func:`error_body`."""
        return error_body(message, code, kind)

    def upstream_error_body(self, status: int, answer: Any) -> dict[str, Any]:
        """See :func:`upstream_error_body`."""
        return upstream_error_body(status, answer)

    def error_event(self, message: str, code: str) -> bytes:
        """See :func:`error_event`."""
        return error_event(message, code)

    def model_list(self, listed: Any, default_model: str) -> dict[str, Any]:
        """See :func:`model_list`."""
        return model_list(listed, default_model)

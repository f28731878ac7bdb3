"""What the Gemini adapter reads its contents with, and its writes primitives
(DESIGN §5.1): ``functionCall`` / ``functionResponse`` parts, the calls
named by position (:func:`call_id`).

An exchange the gate answered itself is a ``model`` content with one
``functionCall`` and a ``user`` content with its ``functionResponse``, both
under the gate's own id (:func:`~sidecar.core.gate_writes.own_call_id`; the
API's ``id`` fields): n8n never sees it, so it is left out when the calls
n8n sees are numbered (:func:`seen`), and a later call takes the place of
the one the gate answered. Its ``functionCall`` part carries the
``thoughtSignature`` Google documents for calls a model did not make
(:data:`OWN_SIGNATURE`: a Gemini 3 model refuses a call of the current turn
without one).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.core.gate_writes import is_own_call_id, output_anchor, user_anchor
from sidecar.gate.wire.base import Proposal
from sidecar.gate.wire.conversation import Conversation

#: The ``thoughtSignature`` of a call the gate puts in the conversation itself
#: (Google's documented value for a call no model of this conversation made).
OWN_SIGNATURE = "skip_thought_signature_validator"


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def _key(obj: Mapping[str, Any], name: str) -> str:
    """The key ``obj`` spells ``name`` with: proto JSON takes ``lowerCamel`` and
    ``snake_case`` alike (n8n and Google's SDKs send camel)."""
    return name if name in obj or _snake(name) not in obj else _snake(name)


def _get(obj: Any, name: str) -> Any:
    return obj.get(_key(obj, name)) if isinstance(obj, Mapping) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _parts(content: Any) -> list[dict[str, Any]]:
    return [p for p in _list(_get(content, "parts")) if isinstance(p, dict)]


def _call(part: Mapping[str, Any]) -> dict[str, Any] | None:
    found = _get(part, "functionCall")
    return found if isinstance(found, dict) else None


def _numbering(body: Mapping[str, Any]) -> tuple[str, int]:
    """``(anchor, calls)``: the digest of the system text and the contents before
    the first call (an execution that opens alike tells itself apart by its
    ``loopstop-execution`` line, DESIGN §5), and
    how many ``functionCall`` parts the contents hold (the next call's number);
    the gate's own exchanges are not counted (:func:`seen`)."""
    head: list[Any] = []
    calls = 0
    for content in seen(_list(body.get("contents"))):
        found = sum(1 for p in _parts(content) if _call(p) is not None)
        if found == 0 and calls == 0:
            head.append(content)
        calls += found
    opening = [_get(body, "systemInstruction"), head]
    text = json.dumps(opening, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12], calls


def call_id(anchor: str, n: int) -> str:
    """The id of the ``n``-th call (from 0) of the conversation ``anchor`` names."""
    return f"gemini-{anchor}-{n}"


def _exchange_part(part: Mapping[str, Any]) -> dict[str, Any] | None:
    found = _call(part) or _get(part, "functionResponse")
    return found if isinstance(found, dict) else None


def own(content: Any) -> bool:
    """A content of an exchange the gate answered itself: every part a
    ``functionCall`` or ``functionResponse`` under the gate's own id."""
    parts = _parts(content)
    found = [_exchange_part(p) for p in parts]
    return bool(parts) and all(f is not None and is_own_call_id(f.get("id")) for f in found)


def seen(contents: Sequence[Any]) -> list[Any]:
    """The contents n8n sent: without the gate's own exchanges."""
    return [c for c in contents if not own(c)]


def _responses_only(content: Any) -> bool:
    parts = _parts(content)
    return bool(parts) and all(isinstance(_get(p, "functionResponse"), dict) for p in parts)


def _user_text(content: Any) -> str | None:
    """The text of a user's message (None: not one: a model turn, tool outputs)."""
    if _get(content, "role") not in ("user", None) or _responses_only(content):
        return None
    if any(_call(p) is not None for p in _parts(content)):
        return None
    return "".join(p["text"] for p in _parts(content) if isinstance(p.get("text"), str))


@dataclass(frozen=True)
class Item:
    """One item of the conversation the gate splices: its contents (a turn of
    calls with the outputs right after it), its anchor, and whether the user
    wrote it."""

    contents: tuple[Any, ...]
    anchor: str | None = None
    user: bool = False


def _groups(contents: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The contents, each alone, but a turn with calls together with the
    contents of ``functionResponse`` parts right after it."""
    out: list[tuple[Any, ...]] = []
    i = 0
    while i < len(contents):
        j = i + 1
        if any(_call(p) is not None for p in _parts(contents[i])):
            while j < len(contents) and _responses_only(contents[j]):
                j += 1
        out.append(tuple(contents[i:j]))
        i = j
    return out


class GeminiConversation(Conversation):
    """The writes primitives of the Gemini adapter (see the module's docstring)."""

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        """``contents`` as :class:`Item` values: a user message anchored by its
        text, a turn of calls and its outputs by its last call's id (by position,
        as :meth:`~sidecar.gate.wire.gemini.Gemini.number_calls`; the gate's own
        by its own id)."""
        contents = _list(_get(body, "contents"))
        anchor, _ = _numbering(body)
        items: list[Any] = []
        n = 0
        for group in _groups(contents):
            first = group[0]
            calls = [fn for p in _parts(first) if (fn := _call(p)) is not None]
            text = _user_text(first)
            if calls and own(first):
                items.append(Item(group, output_anchor(str(calls[-1]["id"]))))
            elif calls:
                n += len(calls)
                items.append(Item(group, output_anchor(call_id(anchor, n - 1))))
            elif text is not None and len(group) == 1:
                items.append(Item(group, user_anchor(text), user=True))
            else:
                items.append(Item(group))
        return items

    def with_conversation(self, body: Mapping[str, Any], items: list[Any]) -> dict[str, Any]:
        """The body with ``contents`` made of the items' contents."""
        contents = [c for i in items for c in (i.contents if isinstance(i, Item) else (i,))]
        return {**body, _key(body, "contents"): contents}

    def item_anchor(self, item: Any) -> str | None:
        """The :class:`Item`'s anchor."""
        return item.anchor if isinstance(item, Item) else None

    def is_user_message(self, item: Any) -> bool:
        """A user's message (text, not tool outputs)."""
        return isinstance(item, Item) and item.user

    def exchange_items(self, proposal: Proposal, output_text: str) -> list[Any]:
        """A ``model`` content with the one ``functionCall`` under its own id
        (``args`` an object, with :data:`OWN_SIGNATURE`), then a ``user`` content
        with its ``functionResponse`` (``response.result``, as n8n sends it)."""
        args = proposal.args if isinstance(proposal.args, dict) else {}
        call = {"id": proposal.call_id, "name": proposal.tool, "args": args}
        asked = {
            "role": "model",
            "parts": [{"functionCall": call, "thoughtSignature": OWN_SIGNATURE}],
        }
        response = {
            "id": proposal.call_id,
            "name": proposal.tool,
            "response": {"result": output_text},
        }
        answered = {"role": "user", "parts": [{"functionResponse": response}]}
        return [Item((asked, answered), output_anchor(proposal.call_id))]

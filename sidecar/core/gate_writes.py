"""Writes at the model gate (DESIGN §5.1), as pure rules: the operation id a
proposed call names, what its tool's output says of the write, and where
the exchanges the gate answered itself go back into a later request.

- **Templates**: ``"crm-lead:{email}"``; each ``{...}`` is a JMESPath
  expression over the call's arguments, rendered as text (a string as is, a
  number in its RFC 8785 form, a boolean ``true`` / ``false``). A part that
  yields nothing, null, an empty string or a non-scalar is a
  :class:`TemplateError` (the task ends ``blocked``, ``invalid_call``); a
  value holding characters outside the operation id pattern, or longer than
  :data:`MAX_VALUE_CHARS`, is replaced by ``h`` and the first 20 hex digits
  of its SHA-256 (stable: the same value names the same operation). So is a
  value that could pass for another (:func:`needs_hash`): one shaped like a
  hashed value, or one holding a character of the text between two parts
  (``{first}:{last}`` with ``a:b`` and ``c`` against ``a`` and ``b:c``); two
  parts with no text between them are refused (:func:`require_operation_id_template`).
- **Settling**: a tool output is parsed as JSON (n8n hands a tool's items
  over as a JSON list: a list of one item is read as that item); it is
  committed, with the parsed output as receipt, when it parses and
  ``committed_when`` (a JMESPath over it, when given) is truthy; without
  ``committed_when``, an object with an ``error`` member (n8n's error item)
  is not a receipt; otherwise nobody knows (:func:`read_output`).
- **Splicing**: an exchange the gate answered itself (a proposal and its
  own tool output) is kept with the *anchor* of the item that preceded it
  (a key the wire adapter gives to items n8n sends back unchanged) and put
  back after that item in every later request, or right after the last user
  message when the item is not there (:func:`splice`).

No I/O, no clock.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jmespath
from jmespath.exceptions import JMESPathError

from sidecar.canonical import canonical_json

#: What an operation id may hold (DESIGN §1), the whole string.
OPERATION_ID = re.compile(r"[A-Za-z0-9._:@-]{1,200}")
_ALLOWED = re.compile(r"[A-Za-z0-9._:@-]+")
#: What a hashed value looks like (a value of that shape is hashed too).
_HASHED = re.compile(r"h[0-9a-f]{20}")
_PART = re.compile(r"\{([^{}]*)\}")
#: A value longer than this is hashed too (several parts must fit in 200 characters).
MAX_VALUE_CHARS = 64
#: The hex digits of SHA-256 a hashed value keeps (80 bits).
HASH_DIGITS = 20
#: How many gate-answered exchanges a task keeps (the oldest go first).
MAX_KEPT = 16
#: The most characters of a call's arguments (compact JSON) an exchange kept on
#: the task may hold: a longer one is not kept (the ledger still replays it).
MAX_KEPT_ARGS_CHARS = 4000
#: How many times one request may ask the upstream (the first time included):
#: the gate answers writes itself and asks again at most this often, then it
#: answers the agent itself (a model that keeps proposing what is done).
MAX_ASKS_PER_REQUEST = 8
#: The most characters of a tool output the gate writes into the conversation.
MAX_OUTPUT_CHARS = 4000


class TemplateError(ValueError):
    """Raised when a template cannot be rendered from a call's arguments; the
    message names the part."""


@dataclass(frozen=True)
class Template:
    """A parsed template: literal texts and compiled JMESPath parts, alternating
    (``texts`` has one more member than ``parts``)."""

    source: str
    texts: tuple[str, ...]
    parts: tuple[Any, ...]
    exprs: tuple[str, ...]


def parse_template(source: str) -> Template:
    """Parse a template (``check-config`` reports what this raises).

    :raises ValueError: a ``{`` or ``}`` without its pair, an empty part, or a
        part that is not JMESPath.
    """
    texts: list[str] = []
    parts: list[Any] = []
    exprs: list[str] = []
    at = 0
    for match in _PART.finditer(source):
        texts.append(source[at : match.start()])
        expr = match.group(1).strip()
        if not expr:
            raise ValueError(f"empty part at character {match.start()}")
        try:
            parts.append(jmespath.compile(expr))
        except JMESPathError as exc:
            raise ValueError(f"{{{expr}}} is not a JMESPath expression: {exc}") from None
        exprs.append(expr)
        at = match.end()
    texts.append(source[at:])
    for text in texts:
        if "{" in text or "}" in text:
            raise ValueError("a '{' or '}' without its pair")
    return Template(source, tuple(texts), tuple(parts), tuple(exprs))


def require_operation_id_template(template: Template) -> None:
    """An operation id template's literal text must fit the operation id pattern.

    :raises ValueError: it holds other characters, or nothing at all.
    """
    literal = "".join(template.texts)
    if not template.parts and not literal:
        raise ValueError("an operation id template must not be empty")
    if any(not between for between in template.texts[1:-1]):
        raise ValueError(
            "two {...} parts need text between them ({a}:{b}, not {a}{b}): "
            "otherwise two different calls can name one operation"
        )
    if literal and not _ALLOWED.fullmatch(literal):
        raise ValueError(
            "the text outside {...} may hold only letters, digits and . _ : @ - "
            "(an operation id's characters)"
        )


def _value_text(value: Any) -> str | None:
    """A scalar as text (None: not a usable value)."""
    if value is None or isinstance(value, dict | list):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        try:
            return canonical_json(value).decode()
        except ValueError:
            return None
    if isinstance(value, str):
        return value or None
    return None


def _search(part: Any, expr: str, args: Any) -> Any:
    try:
        return part.search(args)
    except (JMESPathError, RecursionError, TypeError, ValueError):
        raise TemplateError(f"{{{expr}}} cannot be read from the call's arguments") from None


def hashed(text: str) -> str:
    """``h`` and the first :data:`HASH_DIGITS` hex digits of the text's SHA-256."""
    return "h" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_DIGITS]


def needs_hash(value: str, separators: str) -> bool:
    """Whether a part's value is written as its hash (:func:`hashed`) rather than
    as itself: it is too long, holds a character an operation id cannot, has
    the shape of a hashed value, or holds a character of ``separators`` (the
    template's text between parts), each of which could make two different
    calls name one operation."""
    return (
        len(value) > MAX_VALUE_CHARS
        or not _ALLOWED.fullmatch(value)
        or _HASHED.fullmatch(value) is not None
        or any(c in separators for c in value)
    )


def render_operation_id(template: Template, args: Any) -> str:
    """The operation id a call names.

    :raises TemplateError: a part yields nothing usable, or the id is longer
        than 200 characters.
    """
    out = [template.texts[0]]
    separators = "".join(template.texts[1:-1])
    for part, expr, text in zip(template.parts, template.exprs, template.texts[1:], strict=True):
        value = _value_text(_search(part, expr, args))
        if value is None:
            raise TemplateError(
                f"{{{expr}}} yields no value (missing, null, empty or not a scalar)"
            )
        if needs_hash(value, separators):
            value = hashed(value)
        out.append(value)
        out.append(text)
    rendered = "".join(out)
    if not OPERATION_ID.fullmatch(rendered) or rendered in (".", ".."):
        raise TemplateError(f"the operation id would be {len(rendered)} characters (at most 200)")
    return rendered


def render_value(template: Template, args: Any) -> Any:
    """A template in a check's input: one whole part keeps its value's type;
    otherwise text, the parts rendered as in an operation id but never hashed
    (the check percent-encodes what it puts in a URL).

    :raises TemplateError: a part yields nothing usable.
    """
    if len(template.parts) == 1 and template.texts == ("", ""):
        value = _search(template.parts[0], template.exprs[0], args)
        if _value_text(value) is None:
            raise TemplateError(f"{{{template.exprs[0]}}} yields no value")
        return value
    out = [template.texts[0]]
    for part, expr, text in zip(template.parts, template.exprs, template.texts[1:], strict=True):
        value = _value_text(_search(part, expr, args))
        if value is None:
            raise TemplateError(f"{{{expr}}} yields no value")
        out += [value, text]
    return "".join(out)


def parse_input_templates(data: Any) -> Any:
    """Every string of a check's ``input`` (nested objects and lists) parsed as a template.

    :raises ValueError: a string that is not a template (:func:`parse_template`).
    """
    if isinstance(data, str):
        return parse_template(data)
    if isinstance(data, Mapping):
        return {k: parse_input_templates(v) for k, v in data.items()}
    if isinstance(data, list):
        return [parse_input_templates(v) for v in data]
    return data


def render_input(parsed: Any, args: Any) -> Any:
    """A check's input rendered from a call's arguments (see :func:`parse_input_templates`).

    :raises TemplateError: a part yields nothing usable.
    """
    if isinstance(parsed, Template):
        return render_value(parsed, args)
    if isinstance(parsed, Mapping):
        return {k: render_input(v, args) for k, v in parsed.items()}
    if isinstance(parsed, list):
        return [render_input(v, args) for v in parsed]
    return parsed


# -- settling -------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputReading:
    """What a tool's output says of its write.

    :ivar committed: the output parses and ``committed_when`` holds.
    :ivar receipt: the parsed output (a list of one item: that item); None
        when it does not parse.
    :ivar why: for the operation's ``last_failure`` detail when not committed.
    """

    committed: bool
    receipt: Any
    why: str | None = None


def tool_item(value: Any) -> Any:
    """n8n hands a tool's items over as a JSON list: a list of one item is read
    as that item (DESIGN §5.1); any other value is returned as it is."""
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


def read_output(output: Any, committed_when: Any | None) -> OutputReading:
    """Read a write tool's output (DESIGN §5.1 settling rule).

    :param output: the output as the request carries it (n8n: a JSON text).
    :param committed_when: a compiled JMESPath expression, or None.
    """
    value: Any = output
    if isinstance(output, str):
        try:
            value = json.loads(output, parse_constant=_refuse, parse_float=_finite)
        except (ValueError, RecursionError):
            return OutputReading(False, None, "the tool's output is not JSON")
    if isinstance(output, bytes | bytearray) or value is None:
        return OutputReading(False, None, "the tool's output is empty or not JSON")
    value = tool_item(value)
    if value in ("", [], {}):
        return OutputReading(False, value, "the tool's output is empty")
    if committed_when is None and _error_items(value):
        # n8n's own error item (a tool node that failed: ``{"error": ...}``, with
        # ``errorType`` when the agent caught the throw) is never a receipt.
        return OutputReading(False, value, "the tool's output is an error item")
    if committed_when is not None:
        try:
            holds = bool(committed_when.search(value))
        except (JMESPathError, RecursionError, TypeError, ValueError):
            holds = False
        if not holds:
            return OutputReading(False, value, "committed_when does not hold on the output")
    return OutputReading(True, value)


def _error_items(value: Any) -> bool:
    """An error item (an object with an ``error`` member), or a list of nothing else."""
    if isinstance(value, dict):
        return "error" in value
    return isinstance(value, list) and all(isinstance(i, dict) and "error" in i for i in value)


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    """A JSON number that fits a double (``1e400`` does not: it would be stored as null)."""
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"{text} does not fit a double")
    return number


def receipt_text(receipt: Any) -> str:
    """A recorded receipt as the tool output the model reads (compact JSON),
    at most :data:`MAX_OUTPUT_CHARS` characters."""
    text = json.dumps(receipt, separators=(",", ":"), ensure_ascii=False, default=str)
    return bounded(text)


def bounded(text: str) -> str:
    """``text`` cut to :data:`MAX_OUTPUT_CHARS` characters (marked when cut)."""
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    return text[: MAX_OUTPUT_CHARS - 1] + "\u2026"


# -- kept exchanges ----------------------------------------------------------------------


@dataclass(frozen=True)
class KeptExchange:
    """An exchange the gate answered itself, kept on the task.

    :ivar anchor: the key of the conversation item that preceded it (None:
        it followed nothing n8n sends back unchanged).
    :ivar call_id: the gate's own id for the call (:func:`own_call_id` of the
        proposal's); ``tool`` and ``args`` as the upstream proposed them;
        ``output`` the gate's own tool output text.
    :ivar decision: ``replay`` (committed before), ``in_progress`` or ``copy`` (one
        write proposed twice in one answer); only a ``replay`` is kept.
    """

    anchor: str | None
    call_id: str
    tool: str
    args: Any
    output: str
    decision: str
    operation_id: str
    at: float

    def to_doc(self) -> dict[str, Any]:
        """The stored form (JSON values)."""
        return {
            "anchor": self.anchor,
            "call_id": self.call_id,
            "tool": self.tool,
            "args": self.args,
            "output": self.output,
            "decision": self.decision,
            "operation_id": self.operation_id,
            "at": self.at,
        }

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> KeptExchange:
        """The exchange of a stored document."""
        return cls(
            doc.get("anchor"),
            str(doc["call_id"]),
            str(doc["tool"]),
            doc.get("args"),
            str(doc.get("output") or ""),
            str(doc.get("decision") or ""),
            str(doc.get("operation_id") or ""),
            float(doc.get("at") or 0),
        )


def kept_with(
    kept: Sequence[Mapping[str, Any]], new: Sequence[KeptExchange]
) -> tuple[Mapping[str, Any], ...]:
    """The kept exchanges with ``new`` appended (one per call id, the latest
    kept), at most :data:`MAX_KEPT` (the oldest dropped).

    Only a ``replay`` is kept: a settled write stays true. An ``in_progress``
    answer is true only while the other execution holds the lease; kept, it
    would tell every later turn "another execution is writing this" after
    that execution died, and the model would never propose the write again
    for the ledger to find it ``unknown``. It answers its own request only.
    One exchange is kept per operation (the latest), and none whose
    arguments pass :data:`MAX_KEPT_ARGS_CHARS`: what every later request
    carries stays bounded.
    """
    lasting = [
        e for e in new if e.decision == "replay" and len(_compact(e.args)) <= MAX_KEPT_ARGS_CHARS
    ]
    ops = {e.operation_id for e in lasting}
    out = [d for d in kept if d.get("operation_id") not in ops] + [e.to_doc() for e in lasting]
    return tuple(out[-MAX_KEPT:])


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def splice(
    items: Sequence[Any],
    kept: Sequence[KeptExchange],
    anchor_of: Callable[[Any], str | None],
    is_user: Callable[[Any], bool],
    items_of: Callable[[KeptExchange], list[Any]],
) -> list[Any]:
    """The conversation with the kept exchanges put back (DESIGN §5.1).

    Each exchange goes right after the item whose anchor it kept (after the
    exchanges already put there, in the order they were kept), or, when no
    item has that anchor, right after the last user message (at the end when
    there is none). An exchange whose call id the conversation already holds
    is not put back twice. Items and exchanges are the adapter's own
    (``anchor_of``, ``is_user``, ``items_of``).
    """
    present = {a for a in (anchor_of(i) for i in items) if a is not None}
    todo = [e for e in kept if output_anchor(e.call_id) not in present]
    if not todo:
        return list(items)
    last_user = max((n for n, i in enumerate(items) if is_user(i)), default=len(items) - 1)
    by_position: dict[int, list[KeptExchange]] = {}
    positions = {a: n for n, a in ((n, anchor_of(i)) for n, i in enumerate(items)) if a}
    placed: dict[str, int] = {}
    for e in todo:
        if e.anchor is not None and e.anchor in positions:
            at = positions[e.anchor]
        elif e.anchor is not None and e.anchor in placed:
            at = placed[e.anchor]  # after an exchange put back before it
        else:
            at = last_user
        by_position.setdefault(at, []).append(e)
        placed[output_anchor(e.call_id)] = at
    out: list[Any] = []
    if -1 in by_position:
        for e in by_position[-1]:
            out += items_of(e)
    for n, item in enumerate(items):
        out.append(item)
        for e in by_position.get(n, []):
            out += items_of(e)
    return out


#: What ends the id of a call the gate answered itself (:func:`own_call_id`).
_OWN_ID = re.compile(r"_g[0-9a-f]{8}$")


def own_call_id(call_id: str, token: str) -> str:
    """The id of an exchange the gate answers itself: the proposal's id, ``_g`` and
    8 hex digits of ``token`` (the proposal's own id may be a position another
    call of the conversation takes later; letters, digits, ``_`` only, as
    Anthropic's ``tool_use`` ids must be).

    :raises ValueError: ``token`` is not 8 hex digits.
    """
    if not re.fullmatch(r"[0-9a-f]{8}", token):
        raise ValueError("token must be 8 lower-case hex digits")
    return f"{call_id or 'call'}_g{token}"


def is_own_call_id(call_id: Any) -> bool:
    """``call_id`` is one :func:`own_call_id` made (a call n8n never saw)."""
    return isinstance(call_id, str) and _OWN_ID.search(call_id) is not None


def output_anchor(call_id: str) -> str:
    """The anchor of a tool output answering ``call_id`` (every adapter uses this form)."""
    return "output:" + call_id


def user_anchor(text: str) -> str:
    """The anchor of a user message holding ``text`` (every adapter uses this form)."""
    return "user:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def last_anchor(items: Sequence[Any], anchor_of: Callable[[Any], str | None]) -> str | None:
    """The anchor of the last item that has one (what a new exchange follows)."""
    for item in reversed(items):
        found = anchor_of(item)
        if found is not None:
            return found
    return None

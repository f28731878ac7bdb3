"""What a transaction reads (:class:`Snapshot`) and decides (:class:`Plan`:
documents to write, index entries, trims, increments), and the JSON text
documents are stored as. Every store applies a plan; none decides one."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson

from sidecar.errors import StoreUnavailable

T = TypeVar("T")
Doc = dict[str, Any]


#: Characters from which a document counts as large: a task document with its
#: history, not a small record. A large text this process wrote keeps the
#: document it was written from (:class:`WrittenText`).
LARGE_DOC_CHARS = 4096

#: ``LOOPSTOP_CHECK_KNOWN_DOCS=1`` (the test suite sets it): every document
#: :func:`decode_doc` takes from a :class:`WrittenText` is compared, value and
#: type, with its text read again (:func:`check_known`), and every written
#: text keeps its document, small ones too (so every kind of document is
#: checked, not only the large ones a test rarely makes).
CHECK_KNOWN = os.environ.get("LOOPSTOP_CHECK_KNOWN_DOCS") == "1"

#: Characters from which a :class:`WrittenText` keeps its document.
KEEP_DOC_CHARS = 0 if CHECK_KNOWN else LARGE_DOC_CHARS


class WrittenText(str):
    """A document's text exactly as orjson wrote it (:func:`written_text`):
    :func:`decode_doc` reads it back with orjson alone, with no check.

    :ivar doc: for a large text (:data:`KEEP_DOC_CHARS`), the document it was
        written from, which :func:`decode_doc` returns without reading the
        text again (None: read it). It holds JSON types only (``dict``,
        ``list``, ``str``, ``int``, ``float``, ``bool``, None), as orjson reads
        them back (no NaN or Infinity, which orjson writes as ``null``: see
        :func:`encode_doc`), and is never changed once written: a document
        read from a store is never changed in place (a record is made from
        it). The test suite checks both on every read (:data:`CHECK_KNOWN`).
    """

    doc: Any = None


def doc_cost(text: str) -> int:
    """An upper estimate of the memory (bytes) the document ``text`` reads into:
    its length, 200 bytes an object or array (a dict of up to five members
    takes 184), 64 a member or element past a container's first (a short
    string and its slot take 59), and 256 beside. A task document of 38 KB
    comes to about 220 KB (143 KB measured); a text of many small containers
    (``[{},{},...]``) takes some 24 times its length, which a count of
    characters would miss. Three passes over the text: about 65 us on 38 KB,
    against 220 us to parse it."""
    containers = text.count("{") + text.count("[")
    return 256 + len(text) + 200 * containers + 64 * text.count(",")


def written(doc: Any) -> tuple[str, bytes]:
    """:func:`encode_doc`'s text of ``doc`` and its UTF-8 bytes: the text is a
    :class:`WrittenText` when orjson wrote it (a store that keeps the texts it
    wrote reads them back faster), keeping ``doc`` when it is large.

    :raises TypeError: when neither orjson nor :func:`json.dumps` can encode ``doc``.
    """
    try:
        data = orjson.dumps(doc)
    except TypeError:
        text = json.dumps(doc, separators=(",", ":"))
        return text, text.encode()
    kept = WrittenText(data, "utf-8")
    if len(data) >= KEEP_DOC_CHARS:
        kept.doc = doc
    return kept, data


def written_text(doc: Any) -> str:
    """:func:`written`'s text alone."""
    return written(doc)[0]


def encode_doc(doc: Any) -> str:
    """A document as compact JSON text (UTF-8, no spaces), as stored.

    orjson writes it (a task document with its 200-call history is ~35 KB:
    about 15 us against 230 us for the standard library); the rare document
    orjson refuses, such as one holding an integer past 64 bits (request
    bodies may carry them) or a lone surrogate, is written by
    :func:`json.dumps` instead, ASCII-escaped, so every value is stored
    exactly. Documents are read back by :func:`decode_doc`. Documents never
    hold NaN or Infinity: the configuration and request bodies refuse them
    (orjson would write ``null``).

    :raises TypeError: when neither can encode ``doc``.
    """
    try:
        return orjson.dumps(doc).decode()
    except TypeError:
        return json.dumps(doc, separators=(",", ":"))


def decode_doc(key: str, text: str | bytes) -> Any:
    """A stored document read back, exactly as :func:`json.loads` reads it.

    orjson reads it (a task document of 43 KB: about 130 us, the check
    included, against 210 us),
    and the document is taken only when orjson writes it back to the very
    same bytes. That holds for every document orjson wrote (:func:`encode_doc`),
    and fails for any text orjson would read otherwise than :func:`json.loads`:
    an integer past 64 bits (orjson reads a float, and writes it with an
    exponent), ``\\u`` escapes, floats such as ``1e-07``, a key named twice.
    Those, and text orjson refuses (NaN, lone surrogates), are read again by
    :func:`json.loads`.

    A large text this process wrote is not read at all: the document it was
    written from is returned (:class:`WrittenText`; a task document of 44 KB
    costs 130-250 us to read).

    :raises StoreUnavailable: the stored text is not JSON (damaged, or written
        by something else): a store that returns what it was not given fails
        closed, as one that does not answer.
    """
    if type(text) is WrittenText:
        doc = text.doc
        if doc is None:
            return orjson.loads(str.__str__(text))  # orjson takes an exact str only
        if CHECK_KNOWN:
            check_known(key, text, doc)
        return doc
    try:
        doc = orjson.loads(text)
        if orjson.dumps(doc) == (text if isinstance(text, bytes) else text.encode()):
            return doc
    except (ValueError, TypeError, UnicodeEncodeError):
        pass  # read below as the standard library reads it, or refused
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreUnavailable(f"the document stored at {key!r} is not JSON") from exc


def check_known(key: str, text: WrittenText, doc: Any) -> None:
    """Compare the document a written text kept with the text read again:
    the same values of the same types (``1`` is not ``1.0``, a tuple not a
    list), in the same order.

    :raises RuntimeError: they differ: the document was changed after it was
        written, or held a type JSON does not have.
    """
    path = _difference(doc, orjson.loads(str.__str__(text)), "$")
    if path is not None:
        raise RuntimeError(f"the document kept for {key!r} differs from its text at {path}")


def _difference(kept: Any, read: Any, path: str) -> str | None:
    """The first path at which ``kept`` and ``read`` differ in value or type."""
    if type(kept) is not type(read):
        return f"{path} ({type(kept).__name__}, read {type(read).__name__})"
    if type(kept) is dict:
        if list(kept) != list(read):
            return f"{path} (members)"
        for name, value in kept.items():
            found = _difference(value, read[name], f"{path}.{name}")
            if found is not None:
                return found
        return None
    if type(kept) is list:
        if len(kept) != len(read):
            return f"{path} (length)"
        for i, (a, b) in enumerate(zip(kept, read, strict=True)):
            found = _difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return None if kept == read else path


@dataclass(frozen=True)
class Write:
    """A document to put (``doc``) or delete (``doc=None``).

    :ivar ttl_s: seconds until the store may forget it; None keeps it until
        a later transaction changes it.
    """

    doc: Doc | None
    ttl_s: float | None = None


@dataclass(frozen=True)
class IndexEntry:
    """Add ``member`` to ``index`` with ``score``, or remove it when ``score`` is None."""

    index: str
    member: str
    score: float | None


@dataclass(frozen=True)
class Increment:
    """Add ``delta`` to the number at ``field`` of a document, applied at commit.

    The document is created as ``{field: delta}`` when absent. Increments of
    one key commute: the store applies each to the value the key has at
    commit, so concurrent ones never conflict and none is lost (Redis:
    inside the compare-and-set script; SQLite: inside the write
    transaction). Keep such documents to counters below 10^14: Redis's
    script re-encodes the whole document with 14 significant digits.
    A plan with increments must also write a document of its own, so that
    a commit whose answer timed out can be recognized (see ``transact``).

    :ivar ttl_s: seconds until the store may forget the document; None keeps it.
    """

    field: str
    delta: int = 1
    ttl_s: float | None = None


@dataclass(frozen=True)
class Bound:
    """Where counters a plan left unchecked must stand for its decision to hold:
    the sum over ``keys`` of each weight times the number at ``field`` of the
    key's document (0 when absent) is below ``below`` and at least
    ``at_least`` (each when given).

    A store checks it, atomically with the plan's writes, only when the plan
    was decided on a guess (``absent_likely``, ``recent_likely``): in place of
    comparing those counters whole, so a counter that other decisions moved
    meanwhile does not make the guess fail while the decision still holds.
    On values actually read, the keys stay unchecked (tolerated) as before.
    """

    keys: tuple[str, ...]
    weights: tuple[float, ...]
    field: str
    below: float | None = None
    at_least: float | None = None


@dataclass
class Plan(Generic[T]):
    """What a transaction function decided: the value to return and the changes.

    :ivar result: returned by :meth:`Store.transact` once the plan is applied.
    :ivar writes: key -> :class:`Write`. Every written key must have been
        read through the snapshot (so the compare-and-set covers it).
    :ivar index: index entries to add or remove.
    :ivar trims: ``(index, score)``: remove every member scored below ``score``
        (keeps "recent" indexes bounded to what is still alive).
    :ivar on_commit: called once after the plan committed (never when it did
        not, nor for a discarded attempt): counters of what actually happened.
    :ivar increments: key -> :class:`Increment`, applied to the key's value at
        commit; such a key need not have been read.
    :ivar unchecked: keys the transaction read but the compare-and-set leaves
        out: the decision tolerates them having changed meanwhile (counters
        that only concurrent increments change). They must not be written.
    :ivar bounds: conditions on unchecked keys (:class:`Bound`) that a plan
        decided on a guess is checked against instead of their whole values.
    """

    result: T
    writes: dict[str, Write] = field(default_factory=dict)
    index: list[IndexEntry] = field(default_factory=list)
    trims: list[tuple[str, float]] = field(default_factory=list)
    on_commit: list[Callable[[], None]] = field(default_factory=list)
    increments: dict[str, Increment] = field(default_factory=dict)
    unchecked: set[str] = field(default_factory=set)
    bounds: list[Bound] = field(default_factory=list)

    def check(self) -> None:
        """Refuse a plan no store can apply safely (stores call this before applying).

        :raises RuntimeError: a key both written and incremented or left
            unchecked; a bound on a key not left unchecked, or with a weight
            per key not given; increments without a document of the plan's
            own (a commit whose answer timed out could not be recognized,
            and would be applied twice).
        """
        for key in self.writes:
            if key in self.unchecked or key in self.increments:
                raise RuntimeError(f"transaction wrote {key!r}, which it left unchecked")
        for bound in self.bounds:
            if len(bound.keys) != len(bound.weights):
                raise RuntimeError("a bound needs one weight per key")
            for key in bound.keys:
                if key not in self.unchecked:
                    raise RuntimeError(f"a bound on {key!r}, which the plan compares whole")
        if self.increments and not self.writes:
            raise RuntimeError("a plan with increments must also write a document")

    def committed(self) -> T:
        """Run the ``on_commit`` callbacks and return the result (stores call this)."""
        for callback in self.on_commit:
            callback()
        return self.result


class Snapshot:
    """The documents a transaction has read; reading a new key loads it.

    Keys named up front are loaded in one round trip; a key first read
    inside the function costs one more (declare keys up front where known).
    """

    def __init__(self, loaded: Mapping[str, Doc | None], load: Callable[[list[str]], None]):
        self._docs = loaded
        self._load = load

    def get(self, key: str) -> Doc | None:
        """The document at ``key`` as read in this transaction, or None."""
        if key not in self._docs:
            self._load([key])
        return self._docs[key]

    def prefetch(self, keys: Iterable[str]) -> None:
        """Read every key of ``keys`` not read yet, together (one round trip),
        when a function learns several keys at once from what it read."""
        fresh = [k for k in dict.fromkeys(keys) if k not in self._docs]
        if fresh:
            self._load(fresh)

    def has_read(self, key: str) -> bool:
        return key in self._docs


TxnFn = Callable[[Snapshot], Plan[T]]

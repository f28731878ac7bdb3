"""What a store object (Redis, PostgreSQL) last read or wrote under each key, for
``recent_likely`` guesses (a value here is only ever a guess: the
compare-and-set checks it)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from sidecar.store.base import META_ID, Plan
from sidecar.store.plan import WrittenText, doc_cost

#: Keys and characters of documents :class:`RecentValues` keeps per store object.
RECENT_KEYS = 4096
RECENT_CHARS = 16_000_000
#: The longest document kept (characters): a larger one is read again next time.
_LARGEST = RECENT_CHARS // 16
#: The memory (bytes, as :func:`~sidecar.store.plan.doc_cost` estimates it)
#: of the written documents kept beside their texts
#: (:class:`~sidecar.store.plan.WrittenText`), per store object: about 70
#: task documents with full histories (estimated at 220 KB each; each takes
#: about 145 KB).
RECENT_DOC_BYTES = 16_000_000


class RecentValues:
    """What this process last read or wrote under each key (raw text, None:
    absent): at most :data:`RECENT_KEYS` keys and :data:`RECENT_CHARS`
    characters of documents, the least recently used forgotten first.

    A text this process wrote keeps the document it was written from (read
    back without parsing) while its document is among the last
    :data:`RECENT_DOC_BYTES` of such documents remembered (by estimated
    memory); an older one lets it go."""

    def __init__(self) -> None:
        self._values: OrderedDict[str, str | None] = OrderedDict()
        self._chars = 0
        # Each kept text and its document's estimated memory (doc_cost, made
        # when it is first kept: a text never remembered costs nothing).
        self._docs: OrderedDict[str, tuple[WrittenText, int]] = OrderedDict()
        self._doc_bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        """The value last seen under ``key`` (None: absent or not known)."""
        with self._lock:
            return self._values.get(key)

    def recall(self, keys: list[str]) -> dict[str, str | None] | None:
        """The values last seen under every key of ``keys``; None unless all are known."""
        values = self._values
        with self._lock:
            try:
                found = {k: values[k] for k in keys}
            except KeyError:
                return None
            for k in keys:
                values.move_to_end(k)
            return found

    def guess(self, keys: list[str]) -> dict[str, str | None]:
        """The values last seen under ``keys``, None (absent) for a key not known."""
        values = self._values
        with self._lock:
            found = {k: values.get(k) for k in keys}
            for k in keys:
                if k in values:
                    values.move_to_end(k)
            return found

    def remember(self, pairs: Iterable[tuple[str, str | None]]) -> None:
        """Keep ``pairs`` (key, raw text or None: absent) as the values last seen."""
        with self._lock:
            self._remember(pairs)

    def forget(self, keys: Iterable[str]) -> None:
        """Drop what is known of ``keys``."""
        with self._lock:
            self._forget(keys)

    def _remember(self, pairs: Iterable[tuple[str, str | None]]) -> None:
        values = self._values
        chars = self._chars
        try:
            for key, value in pairs:
                if key == META_ID:
                    continue
                old = values.pop(key, None)
                if old is not None:
                    chars -= len(old)
                    self._drop_doc(key)
                if value is None:
                    values[key] = None
                elif len(value) <= _LARGEST:
                    values[key] = value
                    chars += len(value)
                    if type(value) is WrittenText and value.doc is not None:
                        self._keep_doc(key, value)
                # else too large to keep: read it again next time
            while len(values) > RECENT_KEYS or chars > RECENT_CHARS:
                key, dropped = values.popitem(last=False)
                if dropped is not None:
                    chars -= len(dropped)
                    self._drop_doc(key)
        finally:
            self._chars = chars

    def _keep_doc(self, key: str, text: WrittenText) -> None:
        docs = self._docs
        cost = doc_cost(text)
        docs[key] = (text, cost)
        self._doc_bytes += cost
        while self._doc_bytes > RECENT_DOC_BYTES:
            _, (oldest, oldest_cost) = docs.popitem(last=False)
            self._doc_bytes -= oldest_cost
            oldest.doc = None  # read from its text from now on

    def _drop_doc(self, key: str) -> None:
        kept = self._docs.pop(key, None)
        if kept is not None:
            self._doc_bytes -= kept[1]

    def _forget(self, keys: Iterable[str]) -> None:
        values = self._values
        for key in keys:
            old = values.pop(key, None)
            if old is not None:
                self._chars -= len(old)
                self._drop_doc(key)

    def after(
        self,
        raw: dict[str, str | None],
        plan: Plan[Any],
        current: dict[str, str | None] | None,
        written: dict[str, str | None],
    ) -> None:
        """Keep what a compare-and-set left: the plan's documents when it
        applied (``written``, their texts; and the other documents as read,
        those the plan left unchecked included: a guess compares them), else
        the values it answered. The counters it incremented are forgotten
        (their new text is the script's), and those a bound covers (a guess
        of them was checked against the bound, not found)."""
        forgotten: Iterable[str] = plan.increments
        if plan.bounds:
            forgotten = {*forgotten, *(k for b in plan.bounds for k in b.keys)}
        if current is not None:
            pairs: Iterable[tuple[str, str | None]] = current.items()
        else:
            kept = [(k, v) for k, v in raw.items() if k not in written and k not in forgotten]
            kept += written.items()
            pairs = kept
        with self._lock:
            if forgotten:
                self._forget(forgotten)
            self._remember(pairs)

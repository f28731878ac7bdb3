"""What a store object (Redis, PostgreSQL) last read or wrote under each key, for
``recent_likely`` guesses (a value here is only ever a guess: the
compare-and-set checks it)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from sidecar.store.base import META_ID, Plan

#: Keys and characters of documents :class:`RecentValues` keeps per store object.
RECENT_KEYS = 4096
RECENT_CHARS = 16_000_000


class RecentValues:
    """What this process last read or wrote under each key (raw text, None:
    absent): at most :data:`RECENT_KEYS` keys and :data:`RECENT_CHARS`
    characters of documents, the least recently used forgotten first."""

    def __init__(self) -> None:
        self._values: OrderedDict[str, str | None] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        """The value last seen under ``key`` (None: absent or not known)."""
        with self._lock:
            return self._values.get(key)

    def recall(self, keys: list[str]) -> dict[str, str | None] | None:
        """The values last seen under every key of ``keys``; None unless all are known."""
        with self._lock:
            if not all(k in self._values for k in keys):
                return None
            for k in keys:
                self._values.move_to_end(k)
            return {k: self._values[k] for k in keys}

    def remember(self, pairs: Iterable[tuple[str, str | None]]) -> None:
        with self._lock:
            for key, value in pairs:
                if key == META_ID:
                    continue
                old = self._values.pop(key, None)
                self._chars -= len(old or "")
                if value is not None and len(value) > RECENT_CHARS // 16:
                    continue  # too large to keep: read it again next time
                self._values[key] = value
                self._chars += len(value or "")
            while len(self._values) > RECENT_KEYS or self._chars > RECENT_CHARS:
                _, dropped = self._values.popitem(last=False)
                self._chars -= len(dropped or "")

    def forget(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                self._chars -= len(self._values.pop(key, None) or "")

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
        (their new text is the script's)."""
        self.forget(plan.increments)
        if current is not None:
            self.remember(current.items())
            return
        kept = ((k, v) for k, v in raw.items() if k not in written and k not in plan.increments)
        self.remember([*kept, *written.items()])

"""Pagination lineage: what a task has paged through, in a fixed size (DESIGN §4, cursor checks).

A lineage remembers record-id fingerprints and cursor fingerprints in two
:class:`SlotTable` s of fixed size, so one page costs the same whether the
task has read a thousand ids or a million, and the stored document never
grows (about 44 KB of JSON, whatever the count).

The rule of a page (:func:`step_page`): a page with record ids not seen
before passes, whatever its cursor (some APIs advance server-side behind a
constant handle); a cursor seen before with no new ids fails ``cycle``; any
other page with no new ids fails ``no_new_records``.

Which way the approximation errs: a table forgets (an id is overwritten by
later ones), it never invents. A forgotten id looks new, so an old page can
pass again: a missed cycle, which the task's budgets (``max_tool_calls``,
``max_idle``, the deadline) still bound. A new id looks seen only when its
64-bit tag equals one of the 16 tags kept in its bucket, placed by 64 other
bits: at most ``16 / 2**64`` (about 8.7e-19) per new id, so a new page looks
old with at most that probability (the page needs only one id that looks
new to pass). The fingerprints come from a 128-bit keyed hash, whose own
collisions (``4096 / 2**128`` per id) add nothing measurable.

How long an id is remembered: a bucket keeps its last 16 ids, so an id is
forgotten once 16 later ids fall into its bucket. With 256 buckets, a page of
100 ids read again after 1,000 more distinct ids is recognised with
probability above 0.999, after 1,500 with 0.96, after 2,000 with 0.44; past
about 3,000 later ids a repeated page is in practice taken as new.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Record-id table: buckets x ways (4,096 fingerprints, 32 KiB).
ID_BUCKETS = 256
#: Cursor table: buckets x ways (512 fingerprints, 4 KiB).
CURSOR_BUCKETS = 32
#: Fingerprints one bucket keeps (the oldest goes first).
WAYS = 16

_LITTLE = sys.byteorder == "little"


def _place(fp: str) -> tuple[int, int]:
    """``(position, tag)`` of a fingerprint: 64 bits choose the bucket, 64
    other bits are the tag kept (never 0, which marks an empty slot)."""
    digest = hashlib.blake2b(fp.encode(), digest_size=16).digest()
    position = int.from_bytes(digest[:8], "little")
    tag = int.from_bytes(digest[8:], "little")
    return position, tag or 1


@dataclass(frozen=True)
class SlotTable:
    """A fixed-size set of fingerprints that may forget but never invents.

    ``buckets * WAYS`` slots of 64-bit tags; a fingerprint lives in one bucket
    (chosen by 64 bits of its hash) as its tag (64 other bits); a full
    bucket drops its oldest tag. :meth:`has` is True only when the exact tag
    is in the bucket. Time per fingerprint: one bucket (``WAYS`` slots).

    :ivar buckets: how many buckets.
    :ivar slots: the tags, little-endian, ``buckets * WAYS * 8`` bytes
        (empty: every slot free).
    """

    buckets: int
    slots: bytes = b""

    def has(self, fp: str) -> bool:
        """True when ``fp`` was added and not forgotten since (or, with
        probability ``WAYS / 2**64``, a fingerprint sharing its tag was)."""
        position, tag = _place(fp)
        start = (position % self.buckets) * WAYS * 8
        bucket = self.slots[start : start + WAYS * 8]
        return any(
            int.from_bytes(bucket[i : i + 8], "little") == tag for i in range(0, len(bucket), 8)
        )

    def adding(self, fps: Iterable[str]) -> tuple[SlotTable, int]:
        """The table with ``fps`` added, and how many of them it did not hold.

        A fingerprint repeated within ``fps`` counts once.
        """
        table = self._mutable()
        fresh = 0
        for fp in dict.fromkeys(fps):
            position, tag = _place(fp)
            start = (position % self.buckets) * WAYS
            end = start + WAYS
            if tag in table[start:end]:
                continue
            fresh += 1
            table[start : end - 1] = table[start + 1 : end]
            table[end - 1] = tag
        return (SlotTable(self.buckets, _bytes(table)) if fresh else self), fresh

    def _mutable(self) -> array[int]:
        table = array("Q")
        if self.slots:
            table.frombytes(self.slots)
            if not _LITTLE:
                table.byteswap()
        else:
            table.frombytes(bytes(self.buckets * WAYS * 8))
        return table

    def encode(self) -> str:
        """The slots as base64 text (as stored)."""
        return base64.b64encode(self.slots).decode()

    @classmethod
    def decode(cls, buckets: int, text: Any) -> SlotTable:
        """The table stored as ``text``; anything not a table of ``buckets``
        (an older layout, damage) is an empty one: forgetting errs toward "new"."""
        if isinstance(text, str):
            try:
                slots = base64.b64decode(text, validate=True)
            except ValueError:
                slots = b""
            if len(slots) == buckets * WAYS * 8:
                return cls(buckets, slots)
        return cls(buckets)


def _bytes(table: array[int]) -> bytes:
    if not _LITTLE:
        table = array("Q", table)
        table.byteswap()
    return table.tobytes()


@dataclass(frozen=True)
class Lineage:
    """What a task has paged through: record ids and cursors seen (fixed-size
    tables) and ``count``, the distinct ids seen in all (the check's revision;
    an id forgotten and seen again counts again)."""

    ids: SlotTable = SlotTable(ID_BUCKETS)
    cursors: SlotTable = SlotTable(CURSOR_BUCKETS)
    count: int = 0

    def to_doc(self) -> dict[str, Any]:
        """The stored form: ``{"v": 2, "count", "ids", "cursors"}`` (tables as base64)."""
        return {
            "v": 2,
            "count": self.count,
            "ids": self.ids.encode(),
            "cursors": self.cursors.encode(),
        }

    @classmethod
    def from_doc(cls, doc: Any) -> Lineage:
        """A stored lineage; None is a new one, and so is anything that is not a
        JSON object (damage errs toward "new"). An older layout (lists of ids)
        keeps its count and starts with empty tables (its pages look new)."""
        if not doc or not isinstance(doc, Mapping):
            return cls()
        if doc.get("v") != 2:
            ids = doc.get("ids")
            count = len(ids) if isinstance(ids, list) else 0
            return cls(count=max(count, _int(doc.get("count"))))
        return cls(
            SlotTable.decode(ID_BUCKETS, doc.get("ids")),
            SlotTable.decode(CURSOR_BUCKETS, doc.get("cursors")),
            _int(doc.get("count")),
        )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass(frozen=True)
class PageVerdict:
    """What one page brought: ``new_records`` not seen before, ``records_seen``
    in all, whether its cursor was seen before, and the verdict (``passed``,
    else ``cycle`` or ``no_new_records``)."""

    new_records: int
    records_seen: int
    cursor_seen_before: bool

    @property
    def passed(self) -> bool:
        return self.new_records > 0

    @property
    def reason(self) -> str:
        """``passed``, ``cycle`` or ``no_new_records`` (the check's reasons)."""
        if self.passed:
            return "passed"
        return "cycle" if self.cursor_seen_before else "no_new_records"


def step_page(
    lineage: Lineage, cursor_fp: str | None, id_fps: Iterable[str]
) -> tuple[Lineage, PageVerdict]:
    """One page of a lineage (pure): the lineage with the page added, and its verdict.

    :param cursor_fp: the page's cursor fingerprint (None: no cursor).
    :param id_fps: the page's record-id fingerprints (keyed hashes; any text).
    """
    ids, fresh = lineage.ids.adding(id_fps)
    cursors, cursor_fresh = (
        (lineage.cursors, 1) if cursor_fp is None else lineage.cursors.adding([cursor_fp])
    )
    repeated_cursor = cursor_fp is not None and cursor_fresh == 0
    count = lineage.count + fresh
    return Lineage(ids, cursors, count), PageVerdict(fresh, count, repeated_cursor)

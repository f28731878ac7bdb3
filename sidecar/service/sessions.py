"""Operator-page sessions revoked at logout (DESIGN "Observability": `/ui`).

A session id is never stored as is: its keyed hash names the record, which
lives as long as a session could (``ttl_s``), so a cookie copied before a
logout stops working on every worker and instance sharing the store.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.canonical import Fingerprinter
from sidecar.service import keys, records
from sidecar.store import Store


class SessionRevocations:
    """Records and looks up revoked ``/ui`` session ids.

    :raises StoreUnavailable: from either method when the store cannot answer.
    """

    def __init__(self, store: Store, fingerprinter: Fingerprinter, clock: Callable[[], float]):
        self.store = store
        self.fp = fingerprinter
        self.clock = clock

    def _key(self, sid: str) -> str:
        return keys.ui_revoked(self.fp.key_hash("ui-session", sid))

    def revoked(self, sid: str) -> bool:
        """True once ``sid`` was logged out."""
        return self.store.get(self._key(sid)) is not None

    def revoke(self, sid: str, ttl_s: float) -> None:
        """Record that ``sid`` logged out, for ``ttl_s`` seconds."""
        key = self._key(sid)

        now = self.clock()
        records.run(self.store, [key], lambda txn: txn.put(key, {"at": now}, ttl_s), now)

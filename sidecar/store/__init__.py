"""Stores, chosen by URL in one factory (:func:`store_from_url`)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

from sidecar.errors import ConfigError
from sidecar.store.base import (
    SCHEMA_VERSION,
    Doc,
    IndexEntry,
    Plan,
    Snapshot,
    Store,
    Write,
)

__all__ = [
    "SCHEMA_VERSION",
    "Doc",
    "IndexEntry",
    "Plan",
    "Snapshot",
    "Store",
    "Write",
    "sqlite_path",
    "store_from_url",
]


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL, None for any other scheme.

    ``sqlite:///./loopstop.db`` is relative to the working directory,
    ``sqlite:////var/lib/loopstop/loopstop.db`` absolute (SQLAlchemy's form).
    """
    parsed = urlparse(url)
    if parsed.scheme != "sqlite":
        return None
    path = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
    return Path(path or "loopstop.db")


def store_from_url(url: str) -> Store:
    """Open the store a URL names.

    :param url: ``sqlite:///path[?busy_timeout_s=5]`` or
        ``redis://host:port/db`` / ``rediss://...``.
    :raises ConfigError: for an unknown scheme or a bad parameter.
    :raises StoreUnavailable: when a SQLite file cannot be opened.
    """
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    if parsed.scheme == "sqlite":
        from sidecar.store.sqlite import SQLiteStore

        path = sqlite_path(url)
        assert path is not None
        unknown = set(query) - {"busy_timeout_s"}
        if unknown:
            raise ConfigError([("store", f"unknown sqlite parameter(s): {sorted(unknown)}")])
        try:
            busy = float(query.get("busy_timeout_s", ["5"])[0])
        except ValueError as exc:
            raise ConfigError([("store", "busy_timeout_s must be a number")]) from exc
        return SQLiteStore(path, busy_timeout_s=busy)
    if parsed.scheme in ("redis", "rediss"):
        from sidecar.store.redis import RedisStore

        unknown = set(query) - {"socket_timeout_s", "connect_timeout_s"}
        if unknown:
            raise ConfigError([("store", f"unknown redis parameter(s): {sorted(unknown)}")])
        return RedisStore(url)
    raise ConfigError(
        [("store", f"unknown store scheme {parsed.scheme!r}: use sqlite:/// or redis://")]
    )

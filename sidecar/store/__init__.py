"""Stores, chosen by URL in one factory (:func:`store_from_url`)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

from sidecar.errors import ConfigError
from sidecar.store.base import (
    SCHEMA_VERSION,
    Doc,
    Increment,
    IndexEntry,
    Plan,
    Snapshot,
    Store,
    Write,
)

__all__ = [
    "SCHEMA_VERSION",
    "Doc",
    "Increment",
    "IndexEntry",
    "Plan",
    "Snapshot",
    "Store",
    "Write",
    "check_store_url",
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


def check_store_url(url: str) -> None:
    """Validate a store URL without opening anything.

    :raises ConfigError: an unknown scheme, a malformed SQLite URL or an
        unknown or malformed parameter.
    """
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    if parsed.scheme == "sqlite":
        if parsed.netloc:
            raise ConfigError(
                [
                    (
                        "store",
                        f"{url!r}: write sqlite:///relative/path.db or "
                        "sqlite:////absolute/path.db (three or four slashes)",
                    )
                ]
            )
        allowed = {"busy_timeout_s"}
    elif parsed.scheme in ("redis", "rediss"):
        allowed = {"socket_timeout_s", "connect_timeout_s"}
    else:
        raise ConfigError(
            [("store", f"unknown store scheme {parsed.scheme!r}: use sqlite:/// or redis://")]
        )
    unknown = set(query) - allowed
    if unknown:
        raise ConfigError([("store", f"unknown {parsed.scheme} parameter(s): {sorted(unknown)}")])
    for name, values in query.items():
        try:
            if float(values[-1]) <= 0:
                raise ValueError
        except ValueError:
            raise ConfigError([("store", f"{name} must be a positive number")]) from None


def store_from_url(url: str) -> Store:
    """Open the store a URL names.

    :param url: ``sqlite:///path[?busy_timeout_s=5]`` or
        ``redis://host:port/db`` / ``rediss://...``.
    :raises ConfigError: for an unknown scheme or a bad parameter.
    :raises StoreUnavailable: when a SQLite file cannot be opened.
    """
    check_store_url(url)
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        from sidecar.store.sqlite import SQLiteStore

        path = sqlite_path(url)
        assert path is not None
        busy = float(parse_qs(parsed.query).get("busy_timeout_s", ["5"])[-1])
        return SQLiteStore(path, busy_timeout_s=busy)
    from sidecar.store.redis import RedisStore

    return RedisStore(url)

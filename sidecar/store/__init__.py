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
    "SCHEMES",
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


#: The schemes :func:`store_from_url` opens.
SCHEMES = ("sqlite", "redis", "rediss", "redis+sentinel", "postgresql", "postgres")


def check_store_url(url: str) -> None:
    """Validate a store URL without opening anything.

    :raises ConfigError: an unknown scheme, a malformed SQLite or Sentinel
        URL or an unknown or malformed parameter.
    """
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    numeric = set(query)
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
    elif parsed.scheme in ("redis", "rediss", "redis+sentinel"):
        allowed = {"socket_timeout_s", "connect_timeout_s"}
        if parsed.scheme == "redis+sentinel":
            from sidecar.store.redis import parse_sentinel_url

            try:
                parse_sentinel_url(url.split("?", 1)[0])
            except ValueError as exc:
                raise ConfigError([("store", f"redis+sentinel URL: {exc}")]) from None
    elif parsed.scheme in ("postgresql", "postgres"):
        # libpq's own parameters (sslmode, ...) pass through; these are the store's.
        from sidecar.store.postgres import PARAMS

        allowed = set(query)
        numeric = set(query) & (PARAMS - {"isolation"})
        isolation = query.get("isolation", ["cas"])[-1]
        if isolation not in ("cas", "serializable"):
            raise ConfigError([("store", "isolation must be cas or serializable")])
        if "pool_size" in query and not query["pool_size"][-1].isdigit():
            raise ConfigError([("store", "pool_size must be a positive integer")])
    else:
        raise ConfigError(
            [
                (
                    "store",
                    f"unknown store scheme {parsed.scheme!r}: use sqlite:///, redis://, "
                    "redis+sentinel:// or postgresql://",
                )
            ]
        )
    unknown = set(query) - allowed
    if unknown:
        raise ConfigError([("store", f"unknown {parsed.scheme} parameter(s): {sorted(unknown)}")])
    for name in numeric:
        try:
            if float(query[name][-1]) <= 0:
                raise ValueError
        except ValueError:
            raise ConfigError([("store", f"{name} must be a positive number")]) from None


def store_from_url(
    url: str,
    *,
    timeout_s: float = 2.0,
    wait_replicas: int = 0,
    policy_check_s: float = 5.0,
) -> Store:
    """Open the store a URL names.

    :param url: ``sqlite:///path[?busy_timeout_s=5]``, ``redis://host:port/db``
        / ``rediss://...``, ``redis+sentinel://host:port[,host:port]/<service>/<db>``
        or ``postgresql://user@host:port/db`` (``postgres://`` too).
    :param timeout_s: the deadline of one decision's store work, seconds
        (Redis and PostgreSQL; SQLite waits ``busy_timeout_s`` for its lock).
    :param wait_replicas: Redis replicas that must acknowledge each write.
    :param policy_check_s: seconds between checks of Redis's eviction policy.
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
    if parsed.scheme in ("postgresql", "postgres"):
        from sidecar.store.postgres import PostgresStore

        return PostgresStore(url, timeout_s=timeout_s)
    from sidecar.store.redis import RedisStore

    return RedisStore(
        url, timeout_s=timeout_s, wait_replicas=wait_replicas, policy_check_s=policy_check_s
    )

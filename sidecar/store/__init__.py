"""Stores, chosen by URL scheme: one registry (:data:`SCHEMES`, as the
``limits`` library keeps its storages) and one factory (:func:`store_from_url`)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from urllib.parse import urlparse

from sidecar.errors import ConfigError
from sidecar.store.base import (
    SCHEMA_VERSION,
    Bound,
    Compactable,
    Doc,
    Increment,
    IndexEntry,
    Plan,
    Snapshot,
    Store,
    StoreEvents,
    StoreOptions,
    Sweepable,
    Write,
)
from sidecar.store.sqlite import sqlite_path

__all__ = [
    "SCHEMA_VERSION",
    "SCHEMES",
    "Bound",
    "Compactable",
    "Doc",
    "Increment",
    "IndexEntry",
    "Plan",
    "Snapshot",
    "Store",
    "StoreEvents",
    "StoreOptions",
    "Sweepable",
    "Write",
    "check_store_url",
    "sqlite_path",
    "store_class",
    "store_from_url",
]

#: Every store URL scheme and the class that opens it (``module:Class``). A
#: class is imported when a URL of its scheme is first checked or opened, so
#: a server on SQLite never imports redis-py or psycopg; each class names
#: its schemes again in :attr:`Store.schemes`.
SCHEMES: Mapping[str, str] = MappingProxyType(
    {
        "sqlite": "sidecar.store.sqlite:SQLiteStore",
        "redis": "sidecar.store.redis:RedisStore",
        "rediss": "sidecar.store.redis:RedisStore",
        "redis+sentinel": "sidecar.store.redis:RedisStore",
        "postgresql": "sidecar.store.postgres:PostgresStore",
        "postgres": "sidecar.store.postgres:PostgresStore",
    }
)


def store_class(scheme: str) -> type[Store]:
    """The store class registered for ``scheme``.

    :raises ConfigError: an unknown scheme.
    """
    target = SCHEMES.get(scheme)
    if target is None:
        raise ConfigError(
            [
                (
                    "store",
                    f"unknown store scheme {scheme!r}: use sqlite:///, redis://, "
                    "redis+sentinel:// or postgresql://",
                )
            ]
        )
    module, _, name = target.partition(":")
    cls: type[Store] = getattr(importlib.import_module(module), name)
    return cls


def check_store_url(url: str) -> None:
    """Validate a store URL without opening anything.

    :raises ConfigError: an unknown scheme, a malformed SQLite or Sentinel
        URL or an unknown or malformed parameter.
    """
    store_class(urlparse(url).scheme).check_url(url)


def store_from_url(
    url: str,
    *,
    timeout_s: float = 2.0,
    wait_replicas: int = 0,
    policy_check_s: float = 5.0,
    events: StoreEvents | None = None,
) -> Store:
    """Open the store a URL names.

    :param url: ``sqlite:///path[?busy_timeout_s=5]``, ``redis://host:port/db``
        / ``rediss://...``, ``redis+sentinel://host:port[,host:port]/<service>/<db>``
        or ``postgresql://user@host:port/db`` (``postgres://`` too).
    :param timeout_s: the deadline of one decision's store work, seconds
        (Redis and PostgreSQL; SQLite waits ``busy_timeout_s`` for its lock).
    :param wait_replicas: Redis replicas that must acknowledge each write.
    :param policy_check_s: seconds between checks of Redis's eviction policy.
    :param events: where the store reports round trips and conflicts (the
        app's metrics); none by default.
    :raises ConfigError: for an unknown scheme or a bad parameter.
    :raises StoreUnavailable: when a SQLite file cannot be opened.
    """
    cls = store_class(urlparse(url).scheme)
    cls.check_url(url)
    options = StoreOptions(timeout_s, wait_replicas, policy_check_s, events or StoreEvents())
    return cls.from_url(url, options)

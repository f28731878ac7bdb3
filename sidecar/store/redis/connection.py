"""How the Redis store reaches its primary: the client, directly or through
Sentinel, with the deadlines of one call and redis-py's own retries off."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, urlparse

import hiredis
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from sidecar.errors import ConfigError
from sidecar.store.base import check_parameters
from sidecar.urls import redact_url

#: The URL query parameters the Redis store reads (seconds, positive).
URL_PARAMETERS = frozenset({"socket_timeout_s", "connect_timeout_s"})


@dataclass(frozen=True)
class Connection:
    """The client of one Redis store.

    :ivar client: commands go to the primary through it.
    :ivar sentinel: the sentinels that name the primary (None: a direct URL).
    :ivar url_redacted: the URL without its password, for the operator log.
    :ivar socket_timeout_s: how long a command's answer is waited for.
    """

    client: redis.Redis
    sentinel: Sentinel | None
    url_redacted: str
    socket_timeout_s: float


def command(client: redis.Redis, *args: str | bytes | int) -> Any:
    """Run one command on a connection of ``client``'s pool: its reply, parsed
    as ``client.execute_command`` parses it (``decode_responses`` included;
    none of the commands sent this way has a response callback).

    It sends what ``execute_command`` sends, on the same pool and connection
    class (a Sentinel client's included), the command packed by hiredis in one
    call, without the client's per-command wrapper: its retry machinery (the
    store turns retries off) and its observability hooks cost about 50 us of
    CPU a command, as much as the round trip's own. A connection whose command
    failed other than by an error reply is closed, never reused, as
    ``execute_command`` closes it.

    :raises redis.RedisError: as ``execute_command`` raises it (a
        ``ConnectionError`` or ``TimeoutError``; a ``ResponseError`` such as
        ``NoScriptError`` for an error reply).
    """
    pool = client.connection_pool
    conn: Any = pool.get_connection()  # redis-py's connection methods are untyped
    try:
        conn.send_packed_command([hiredis.pack_command(cast(Any, args))])
        return conn.read_response()
    except redis.ResponseError:
        raise
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def check_url(url: str) -> None:
    """Validate a ``redis://``, ``rediss://`` or ``redis+sentinel://`` URL.

    :raises ConfigError: an unknown or bad parameter, a malformed Sentinel URL.
    """
    if urlparse(url).scheme == "redis+sentinel":
        try:
            parse_sentinel_url(url.split("?", 1)[0])
        except ValueError as exc:
            raise ConfigError([("store", f"redis+sentinel URL: {exc}")]) from None
    check_parameters(url, URL_PARAMETERS)


def connect(url: str, timeout_s: float) -> Connection:
    """A client for ``url`` (connections open lazily, at the first command).

    The socket timeout is the URL's ``socket_timeout_s``, never longer than
    ``timeout_s``; connecting waits ``connect_timeout_s`` (1 s by default).
    redis-py's retries are off: a command that timed out may or may not have
    run, and the caller's retry must see the true state.
    """
    query = parse_qs(urlparse(url).query)
    socket_timeout = min(float(query.pop("socket_timeout_s", [str(timeout_s)])[0]), timeout_s)
    connect_timeout = min(float(query.pop("connect_timeout_s", ["1"])[0]), timeout_s)
    base = url.split("?", 1)[0]
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 30,
    }
    if urlparse(base).scheme != "redis+sentinel":
        return Connection(
            redis.Redis.from_url(base, **options), None, redact_url(base), socket_timeout
        )
    hosts, service, db, password = parse_sentinel_url(base)
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        hosts,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        service, db=db, password=password, **options
    )
    return Connection(client, sentinel, redact_url(base), socket_timeout)


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, int, str | None]:
    """``redis+sentinel://[:pw@]h:p[,h:p]/<service>/<db>`` -> (hosts, service, db, password).

    :raises ValueError: a missing host, port, service or a bad db number.
    """
    rest = url.split("://", 1)[1]
    netloc, _, path = rest.partition("/")
    password = None
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        password = auth.partition(":")[2] or None
    hosts: list[tuple[str, int]] = []
    for part in netloc.split(","):
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"sentinel address {part!r} is not host:port")
        hosts.append((host.strip("[]"), int(port)))
    service, _, db = path.strip("/").partition("/")
    if not service:
        raise ValueError("the URL names no service (redis+sentinel://host:port/<service>/<db>)")
    if db and not db.isdigit():
        raise ValueError(f"db {db!r} is not a number")
    return hosts, service, int(db or 0), password

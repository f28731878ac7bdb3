"""Reading an answer's body under one total deadline and a size bound.

``requests``' ``timeout`` bounds each socket read, not the answer: a server
that trickles its body a byte at a time, or drips keep-alive comments, would
hold the caller for as long as it likes. Every outbound call (a check's,
n8n's API, the model gate's upstream) therefore leaves its answer's body
unread (``requests``' ``stream=True``; for the gate's upstream, urllib3's
``preload_content=False``) and reads it here: one socket read at a time (``read1``
returns what has arrived, never waiting for a block to fill), the deadline
checked before each read (a read in flight ends within its own read
timeout), the size counted decompressed (urllib3 decompresses each read to
its size, so a gzip bomb stops at the bound).

The request itself is sent by :func:`send_unread`, never by
``Session.request``: with redirects off, that still reads a redirect's whole
body before returning (to release its connection), with no bound at all.

Each caller maps the three failures below to its own answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import requests
import urllib3
from requests.hooks import dispatch_hook
from urllib3.response import BaseHTTPResponse

#: One socket read (bytes).
READ_BYTES = 65536


class BodyError(Exception):
    """Raised when an answer's body could not be read whole.

    :ivar received: the bytes read before it failed (decompressed).
    """

    def __init__(self, message: str, received: int) -> None:
        super().__init__(message)
        self.received = received


class BodyTooSlow(BodyError):
    """Raised when the deadline passed before the body ended."""


class BodyTooLarge(BodyError):
    """Raised when the body passed its size bound (counted decompressed).

    :ivar max_bytes: the bound.
    """

    def __init__(self, max_bytes: int, received: int) -> None:
        super().__init__(f"the body exceeds {max_bytes} bytes", received)
        self.max_bytes = max_bytes


class BodyBroken(BodyError):
    """Raised when a read failed: the connection broke, a socket read timed
    out, the body was cut or could not be decompressed.

    :ivar error: the failure's type name (urllib3's or the socket's), for
        messages and evidence.
    :ivar timed_out: a socket read timed out (nothing came for its read timeout).
    """

    def __init__(self, cause: Exception, received: int) -> None:
        super().__init__(f"the body broke off ({type(cause).__name__})", received)
        self.error = type(cause).__name__
        self.timed_out = isinstance(cause, urllib3.exceptions.TimeoutError | TimeoutError)


def send_unread(
    session: requests.Session,
    method: str,
    url: str,
    headers: Mapping[str, str],
    timeout: float | tuple[float, float],
    *,
    params: Mapping[str, Any] | None = None,
    data: bytes | None = None,
    json: Any = None,
) -> requests.Response:
    """Send one request through ``session``'s transport adapter
    (``HTTPAdapter.send``, requests' Transport Adapter interface): no
    redirect followed, the answer's body left unread (``stream``) for
    :func:`body_chunks` or :func:`read_body`, a 3xx answer's included.

    It sends what ``Session.request`` sends, the session's default headers,
    TLS settings and response hooks included, without the per-request
    merging the callers have no use for: their sessions take nothing from
    the environment (``trust_env`` is off), and no cookie an answer sets is
    kept for the next request (one caller's must not reach another's).
    ``Session.request`` also read a redirect's whole body, unbounded, and
    its merging cost the model gate about 300 us of CPU per turn.

    :param timeout: seconds, or ``(connect, read)`` seconds.
    :raises requests.RequestException: as ``Session.request`` raises it.
    """
    prepared = requests.PreparedRequest()
    prepared.prepare(
        method=method,
        url=url,
        headers={**session.headers, **headers},
        params=params,
        data=data,
        json=json,
    )
    url = cast(str, prepared.url)  # as prepared: the adapter is chosen by it
    verify = True if session.verify is None else session.verify
    cert, proxies = session.cert, session.proxies
    resp = session.get_adapter(url).send(
        prepared, stream=True, timeout=timeout, verify=verify, cert=cert, proxies=proxies
    )
    # The session's response hooks, as Session.send runs them.
    hooked = dispatch_hook(  # type: ignore[no-untyped-call]
        "response",
        session.hooks,
        resp,
        stream=True,
        timeout=timeout,
        verify=verify,
        cert=cert,
        proxies=proxies,
    )
    return cast(requests.Response, hooked)


def body_chunks(
    resp: requests.Response,
    until: float,
    max_bytes: int,
    monotonic: Callable[[], float] = time.monotonic,
) -> Iterator[bytes]:
    """The body of ``resp`` (opened with ``stream=True``) as it arrives, until it
    ends: :func:`raw_chunks` of its urllib3 answer (same bounds and errors)."""
    return raw_chunks(resp.raw, until, max_bytes, monotonic)


def raw_chunks(
    raw: BaseHTTPResponse,
    until: float,
    max_bytes: int,
    monotonic: Callable[[], float] = time.monotonic,
) -> Iterator[bytes]:
    """The body of urllib3's answer ``raw`` (its content not preloaded) as it
    arrives, until it ends.

    :param until: the deadline, on ``monotonic``'s clock (seconds).
    :param max_bytes: the most body read, decompressed.
    :raises BodyTooSlow: ``until`` passed before the body ended.
    :raises BodyTooLarge: the body passed ``max_bytes``.
    :raises BodyBroken: a read failed.
    """
    received = 0
    while True:
        if monotonic() > until:
            raise BodyTooSlow("the whole answer took too long", received)
        try:
            data = raw.read1(READ_BYTES, decode_content=True)
        except Exception as exc:  # urllib3's read, protocol and decoding errors; the socket's
            raise BodyBroken(exc, received) from exc
        if not data:
            return
        received += len(data)
        if received > max_bytes:
            raise BodyTooLarge(max_bytes, received)
        yield data


def read_body(
    resp: requests.Response,
    until: float,
    max_bytes: int,
    monotonic: Callable[[], float] = time.monotonic,
) -> bytes:
    """The whole body of ``resp``, read by :func:`body_chunks` (same bounds and errors)."""
    return b"".join(body_chunks(resp, until, max_bytes, monotonic))

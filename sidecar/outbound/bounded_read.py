"""Reading an answer's body under one total deadline and a size bound.

``requests``' ``timeout`` bounds each socket read, not the answer: a server
that trickles its body a byte at a time, or drips keep-alive comments, would
hold the caller for as long as it likes. Every outbound call (a check's,
n8n's API, the model gate's upstream) therefore opens its answer with
``stream=True`` and reads it here: one socket read at a time (``read1``
returns what has arrived, never waiting for a block to fill), the deadline
checked before each read (a read in flight ends within its own read
timeout), the size counted decompressed (urllib3 decompresses each read to
its size, so a gzip bomb stops at the bound).

Each caller maps the three failures below to its own answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import requests
import urllib3

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


def body_chunks(
    resp: requests.Response,
    until: float,
    max_bytes: int,
    monotonic: Callable[[], float] = time.monotonic,
) -> Iterator[bytes]:
    """The body of ``resp`` (opened with ``stream=True``) as it arrives, until it ends.

    :param until: the deadline, on ``monotonic``'s clock (seconds).
    :param max_bytes: the most body read, decompressed.
    :raises BodyTooSlow: ``until`` passed before the body ended.
    :raises BodyTooLarge: the body passed ``max_bytes``.
    :raises BodyBroken: a read failed.
    """
    raw = resp.raw
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

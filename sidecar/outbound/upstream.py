"""The model gate's upstream: the real model's HTTP API (DESIGN §5).

One :class:`Upstream` per gate: POST a turn, GET the model list, under
``timeout_s`` (connect at most 5 s of it) and one deadline for the whole
exchange, from the request to the answer's last byte: a server dripping
bytes or keep-alive comments cannot hold a worker past it; and at most
``max_answer_bytes`` of answer, counted decompressed (a gzip bomb stops
there). The body is read by :mod:`sidecar.outbound.bounded_read`, as every
outbound answer is; a stream's frames are read as they arrive.

The exchange goes through urllib3's connection pool (:func:`upstream_pool`),
the transport ``requests`` itself sends through, called directly: a turn
then costs about 200 us of CPU less than through ``requests``' request
preparation, response building and cookie handling, none of which the gate
uses (it sends one prepared body, never keeps a cookie and never follows a
redirect). It sends what the gate's ``requests`` session sent: the same
CA bundle (certifi's), no proxy or netrc from the environment, no retry,
``Accept: */*`` and the encodings urllib3 can decode.

Errors are mapped here: a timeout is a ``504``, an unreachable upstream a
``502``, an error status is relayed with its status and its body in the
API's own error shape (through the adapter); a body that is cut, too slow
or unreadable raises :class:`~sidecar.gate.wire.base.StreamBroken` while a
stream is read, :class:`~sidecar.errors.UpstreamError` otherwise.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

import certifi
import sseclient
import urllib3
from urllib3.response import BaseHTTPResponse

from sidecar import __version__
from sidecar.errors import GateNotConfigured, UpstreamError
from sidecar.gate.wire.base import OPENAI, Api, Frame, Framing, Inbound, StreamBroken, WireAdapter
from sidecar.outbound.bounded_read import (
    BodyBroken,
    BodyTooLarge,
    BodyTooSlow,
    raw_chunks,
)
from sidecar.outbound.head_watch import bounded_pool, head_deadline

#: The longest the TCP connect may take (of ``timeout_s``).
CONNECT_S = 5.0
#: The model list's deadlines (n8n's credential test): connect, then read (at most).
LIST_CONNECT_S = 3.0
LIST_READ_S = 10.0
#: Connections kept open per upstream host (requests' own default pool size).
POOL_SIZE = 10
#: What every upstream request sends unless the API's headers say otherwise.
BASE_HEADERS = {
    **urllib3.util.make_headers(accept_encoding=True, user_agent=f"loopstop/{__version__}"),
    "Accept": "*/*",
}


def upstream_pool() -> urllib3.PoolManager:
    """The gate's connection pool to its upstreams: TLS verified against
    certifi's CA bundle (as ``requests`` verifies), no retry (a connection
    found closed before use is opened again), at most :data:`POOL_SIZE`
    idle connections kept per host, an answer's head read under the
    exchange's deadline (:mod:`sidecar.outbound.head_watch`)."""
    return bounded_pool(
        num_pools=16,
        maxsize=POOL_SIZE,
        retries=False,
        cert_reqs="CERT_REQUIRED",
        ca_certs=certifi.where(),
    )


def _timed_out(exc: BaseException) -> bool:
    """A connect or read timed out (a refused connection did not: urllib3's
    ``NewConnectionError`` is a ``ConnectTimeoutError`` only by inheritance,
    as ``requests`` tells them apart)."""
    reason = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
    if isinstance(reason, urllib3.exceptions.NewConnectionError):
        return False
    return isinstance(reason, urllib3.exceptions.TimeoutError | TimeoutError)


def _send(
    pool: urllib3.PoolManager,
    method: str,
    url: str,
    headers: Mapping[str, str],
    timeout: urllib3.Timeout,
    body: bytes | None = None,
) -> BaseHTTPResponse:
    """One request, its answer's body left unread (for :func:`raw_chunks`), a
    redirect never followed.

    :raises urllib3.exceptions.HTTPError: it could not be sent, or no answer
        came (a timeout is :class:`urllib3.exceptions.TimeoutError`).
    :raises OSError: a socket error urllib3 did not wrap.
    """
    return pool.urlopen(
        method,
        url,
        body=body,
        headers={**BASE_HEADERS, **headers},
        timeout=timeout,
        retries=False,
        redirect=False,
        preload_content=False,
        decode_content=True,
    )


def _broken(exc: Exception) -> StreamBroken:
    if isinstance(exc, BodyBroken) and exc.timed_out:  # nothing came for a read timeout
        return StreamBroken("the upstream model's stream took too long", "timeout")
    name = exc.error if isinstance(exc, BodyBroken) else type(exc).__name__
    return StreamBroken(f"the upstream model's stream broke ({name})", "upstream_stream_cut")


@dataclass
class Exchange:
    """An upstream answer whose status was not an error, its body still unread.

    :ivar status: the HTTP status.
    :ivar content_type: its ``Content-Type`` (``""`` when absent).
    """

    resp: BaseHTTPResponse
    deadline: float
    monotonic: Callable[[], float]
    max_bytes: int = 8 << 20

    @property
    def status(self) -> int:
        return self.resp.status

    @property
    def content_type(self) -> str:
        return str(self.resp.headers.get("Content-Type", ""))

    def chunks(self) -> Iterator[bytes]:
        """The body's bytes as they arrive, until the upstream ends it
        (:func:`~sidecar.outbound.bounded_read.raw_chunks`).

        :raises StreamBroken: the deadline passed (code ``timeout``), or the
            answer passed ``max_bytes`` (code ``answer_too_large``).
        :raises BodyBroken: a read failed (the connection broke, the body was cut).
        """
        try:
            yield from raw_chunks(self.resp, self.deadline, self.max_bytes, self.monotonic)
        except BodyTooSlow:
            raise StreamBroken("the upstream model took too long", "timeout") from None
        except BodyTooLarge:
            raise StreamBroken(
                f"the upstream model's answer is larger than {self.max_bytes} bytes "
                "(model_gate.max_answer_bytes)",
                "answer_too_large",
            ) from None

    def read_all(self, adapter: WireAdapter) -> bytes:
        """The whole body, read under the deadline, then closed.

        :raises UpstreamError: too slow (504, reason ``timeout``), cut (502,
            reason ``upstream_stream_cut``) or too large (502, reason
            ``answer_too_large``); ``received`` says how many bytes came.
        """
        chunks: list[bytes] = []
        try:
            for data in self.chunks():
                chunks.append(data)
        except StreamBroken as exc:
            if exc.code == "answer_too_large":
                raise UpstreamError(
                    502,
                    adapter.error_body(str(exc), exc.code),
                    reason=exc.code,
                    received=sum(map(len, chunks)),
                ) from None
            raise UpstreamError(
                504,
                adapter.error_body("the upstream model did not answer in time", "timeout"),
                reason="timeout",
                received=sum(map(len, chunks)),
            ) from None
        except BodyBroken as exc:
            if not exc.timed_out:
                raise UpstreamError(
                    502,
                    adapter.error_body(
                        "the upstream model's answer broke off", "upstream_stream_cut"
                    ),
                    reason="upstream_stream_cut",
                    received=sum(map(len, chunks)),
                ) from None
            raise UpstreamError(  # nothing came for a whole read timeout
                504,
                adapter.error_body("the upstream model did not answer in time", "timeout"),
                reason="timeout",
                received=sum(map(len, chunks)),
            ) from None
        except Exception:  # urllib3's read and protocol errors
            raise UpstreamError(
                502,
                adapter.error_body("the upstream model's answer broke off", "upstream_stream_cut"),
                reason="upstream_stream_cut",
                received=sum(map(len, chunks)),
            ) from None
        finally:
            self.close()
        return b"".join(chunks)

    def frames(self, framing: Framing) -> Iterator[Frame]:
        """The stream's frames as they arrive.

        :raises StreamBroken: the deadline passed, or the stream broke.
        """
        try:
            if framing is Framing.SSE:
                for event in sseclient.SSEClient(self.chunks()).events():
                    if self.monotonic() > self.deadline:
                        raise StreamBroken("the upstream model's stream took too long", "timeout")
                    yield Frame(event.data, None if event.event == "message" else event.event)
            else:
                yield from self._lines()
        except StreamBroken:
            raise
        except Exception as exc:  # urllib3's protocol and read errors, timeouts
            raise _broken(exc) from None

    def _lines(self) -> Iterator[Frame]:
        rest = b""
        for data in self.chunks():
            rest += data
            *lines, rest = rest.split(b"\n")
            for line in lines:
                if line.strip():
                    yield Frame(line.decode("utf-8", "replace"))
        if rest.strip():
            yield Frame(rest.decode("utf-8", "replace"))

    def close(self) -> None:
        """Close the answer (idempotent). A body read to its end has already
        put its connection back in the pool for the next turn (urllib3 does);
        one left unread closes its connection."""
        self.resp.close()


class Upstream:
    """One API's real model at ``base_url``, its key in the API's own header
    (:class:`~sidecar.gate.wire.base.Api`: ``Authorization: Bearer`` for
    OpenAI, ``x-api-key`` for Anthropic); no key header without a key.

    A request is forwarded to the same path (below the API's prefix) and
    query, less the API's ``drop_query`` parameters, with its ``pass_headers``
    (version headers) and nothing else of it: never its token.

    :param pool: the connection pool (:func:`upstream_pool`).
    :param max_answer_bytes: the most answer read (decompressed).
    :param monotonic: the deadline clock (seconds).
    :param api: the API it speaks.
    :param setting: the configuration to name when no ``base_url`` is set.
    """

    def __init__(
        self,
        pool: urllib3.PoolManager,
        base_url: str | None,
        api_key: str | None,
        timeout_s: float,
        max_answer_bytes: int = 8 << 20,
        monotonic: Callable[[], float] = time.monotonic,
        *,
        api: Api = OPENAI,
        setting: str = "model_gate.upstream_url",
    ) -> None:
        self.pool = pool
        self.base_url = base_url
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_answer_bytes = max_answer_bytes
        self.monotonic = monotonic
        self.api = api
        self.setting = setting

    def url(self, path: str, query: str = "") -> str:
        """The upstream URL of ``path`` and ``query`` (less the API's ``drop_query``).

        :raises GateNotConfigured: no upstream is configured.
        """
        if not self.base_url:
            raise GateNotConfigured(
                f"no upstream for the {self.api.name} API: set {self.setting} to the real "
                "model's base URL"
            )
        kept = [
            part
            for part in query.split("&")
            if part and unquote_plus(part.partition("=")[0]) not in self.api.drop_query
        ]
        return self.base_url.strip().rstrip("/") + path + ("?" + "&".join(kept) if kept else "")

    def _headers(self, inbound: Inbound | None) -> dict[str, str]:
        api = self.api
        out = dict(api.default_headers)
        given = inbound.headers if inbound is not None else {}
        for name in api.pass_headers:
            value = given.get(name)
            if value is not None:
                out[name] = value
        if self.api_key:
            out[api.key_header] = api.key_prefix + self.api_key
        return out

    def post(
        self,
        adapter: WireAdapter,
        payload: Mapping[str, Any],
        stream: bool,
        inbound: Inbound | None = None,
        raw: bytes | None = None,
    ) -> Exchange:
        """POST ``payload`` to the request's path (the adapter's, without ``inbound``);
        the answer's body is left to read.

        :param raw: ``payload`` as JSON bytes already (the request as it came):
            sent as they are instead of serialising ``payload`` again.

        :raises GateNotConfigured: no upstream is configured.
        :raises UpstreamError: unreachable (502), timed out (504), an error
            status (relayed with its status; its body when it is the API's
            error), or a status that is neither an answer nor an error (a
            redirect: 502, ``bad_upstream_response``).
        """
        if inbound is None:
            inbound = Inbound(adapter.path)
        url = self.url(inbound.path, inbound.query)
        deadline = self.monotonic() + self.timeout_s
        headers = self._headers(inbound)
        headers["Content-Type"] = "application/json"
        if stream:
            headers["Accept"] = adapter.framing.content_type
        sent = raw if raw is not None else json.dumps(payload).encode("utf-8")
        timeout = urllib3.Timeout(connect=min(self.timeout_s, CONNECT_S), read=self.timeout_s)
        head_by = time.monotonic() + self.timeout_s  # the watch's clock: real sockets
        try:
            with head_deadline(head_by):
                resp = _send(self.pool, "POST", url, headers, timeout, sent)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if _timed_out(exc) or time.monotonic() >= head_by:  # the head took too long
                raise UpstreamError(
                    504, adapter.error_body("the upstream model did not answer in time", "timeout")
                ) from None
            cause = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
            raise UpstreamError(
                502,
                adapter.error_body(
                    f"the upstream model is unreachable ({type(cause).__name__})",
                    "upstream_unreachable",
                ),
            ) from None
        exchange = Exchange(resp, deadline, self.monotonic, self.max_answer_bytes)
        if resp.status >= 400:
            try:
                answer = json.loads(b"".join(exchange.chunks()))
            except Exception:  # unreadable, cut or too slow: the status still says it
                answer = None
            finally:
                exchange.close()
            raise UpstreamError(resp.status, adapter.upstream_error_body(resp.status, answer))
        if not 200 <= resp.status < 300:  # a redirect (never followed): no answer
            exchange.close()
            message = f"the upstream model answered {resp.status}, not an answer"
            raise UpstreamError(
                502,
                adapter.error_body(message, "bad_upstream_response"),
                reason="bad_upstream_response",
            )
        return exchange

    def get_json(self, adapter: WireAdapter, path: str, inbound: Inbound | None = None) -> Any:
        """GET ``path`` (with ``inbound``'s query and version headers): its JSON
        when it answers 200, else None.

        :raises GateNotConfigured: no upstream is configured.
        :raises UpstreamError: it cannot be reached (502).
        """
        url = self.url(path, inbound.query if inbound is not None else "")
        read_s = min(self.timeout_s, LIST_READ_S)
        timeout = urllib3.Timeout(connect=LIST_CONNECT_S, read=read_s)
        try:
            with head_deadline(time.monotonic() + read_s):
                resp = _send(self.pool, "GET", url, self._headers(inbound), timeout)
        except (urllib3.exceptions.HTTPError, OSError):
            raise UpstreamError(
                502,
                adapter.error_body("the upstream model cannot be reached", "upstream_unreachable"),
            ) from None
        exchange = Exchange(resp, self.monotonic() + read_s, self.monotonic, self.max_answer_bytes)
        try:
            if resp.status != 200:
                return None
            return json.loads(b"".join(exchange.chunks()))
        except Exception:  # unreadable, too large, cut or too slow: no list
            return None
        finally:
            exchange.close()

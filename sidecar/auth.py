"""Bearer tokens and their scopes (DESIGN "HTTP conventions").

Each configured token has a name (shown in logs, never its value), the
environment variable that holds its value, the workflows it may act for
(``*`` for all) and whether it is ``admin``. Presented tokens are compared
in constant time against every configured token (``hmac.compare_digest``
over SHA-256 digests, no early exit), so timing reveals neither a prefix
nor which token matched.

The model gate's routes read the token where each API's client puts its
key (DESIGN §5's table: ``x-api-key`` for Anthropic, ``x-goog-api-key`` or
the ``key`` query parameter for Gemini, ``api-key`` for Azure):
:func:`presented_token` finds it, :meth:`TokenTable.authenticate_token`
compares it as every other token. It is never logged nor forwarded.

Web pages (DESIGN "HTTP conventions"): a browser attaches no token, but a
page of any site can post forms to a loopback server and a foreign host name
can be made to resolve to 127.0.0.1 (DNS rebinding). So, in every mode, a
request whose ``Origin`` is not the server's own is refused
(:func:`check_origin`), and without tokens the ``Host`` must be a loopback
name or address with the port the server listens on (:func:`check_host`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from sidecar.config import TokenConfig
from sidecar.errors import (
    Forbidden,
    ForeignOrigin,
    MisdirectedRequest,
    Unauthenticated,
)
from sidecar.gate.wire.base import BEARER, TokenFrom


@dataclass(frozen=True)
class Principal:
    """Who a request acts as.

    :ivar workflows: the workflows in scope; None means every workflow (``*``).
    """

    name: str
    workflows: frozenset[str] | None
    admin: bool
    authenticated: bool = True

    def allows(self, workflow: str | None) -> bool:
        """True when the scope covers ``workflow`` (None, "no workflow", needs ``*``)."""
        if self.workflows is None:
            return True
        return workflow is not None and workflow in self.workflows

    def require(self, workflow: str | None, *, of_record: bool = False) -> None:
        """:raises Forbidden: when the scope does not cover ``workflow``.

        :param of_record: the workflow is an existing record's: the answer
            does not name it (a scoped token learns nothing about others).
        """
        if not self.allows(workflow):
            if of_record:
                raise Forbidden(
                    f"the record belongs to a workflow outside token {self.name!r}'s scope"
                )
            if workflow is None:
                raise Forbidden(
                    f"token {self.name!r} is limited to named workflows: the request must "
                    "name its workflow"
                )
            raise Forbidden(f"token {self.name!r} may not act for workflow {workflow!r}")

    def require_admin(self) -> None:
        """:raises Forbidden: when the token is not ``admin``."""
        if not self.admin:
            raise Forbidden(f"token {self.name!r} is not an admin token")


def presented_token(
    headers: Mapping[str, str], query: Mapping[str, str], sources: Iterable[TokenFrom]
) -> str | None:
    """The token a request presents: the first of ``sources`` it sends (a header
    or a query parameter; a ``bearer`` header's value after ``Bearer``), None
    when it sends none of them (or a bearer header of another scheme).

    :param headers: the request's headers, looked up by lower-case name (keys in
        lower case, or a case-insensitive mapping such as werkzeug's ``Headers``).
    """
    for source in sources:
        value = query.get(source.query) if source.query else headers.get(source.header.lower())
        if value is None:
            continue
        if source.bearer:
            scheme, _, value = value.partition(" ")
            if scheme.lower() != "bearer":
                return None
        return value.strip() or None
    return None


class LoginDecision(StrEnum):
    """What an operator-page login logs: in, or refused while throttled."""

    LOGGED_IN = "logged_in"
    THROTTLED = "throttled"


#: The principal of a server with no tokens configured (loopback only).
ANONYMOUS = Principal(name="anonymous", workflows=None, admin=True, authenticated=False)


def is_loopback(host: str | None) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host is None:
        return False
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _host_port(authority: str, scheme: str) -> tuple[str, int] | None:
    """``(host, port)`` of an authority (``name:port``, ``[::1]:port``), the
    scheme's default port when none is given; None when it does not parse."""
    try:
        parts = urlsplit(f"//{authority}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host or parts.username is not None or parts.path or parts.query:
        return None
    return host.lower(), port if port is not None else _DEFAULT_PORTS.get(scheme, 80)


def check_host(host_header: str | None, scheme: str, bound_port: int | None) -> None:
    """Without tokens: the ``Host`` must be loopback, with the bound port.

    :param bound_port: the port the connection arrived on; None when unknown
        (then only the name is checked).
    :raises MisdirectedRequest: a foreign name (DNS rebinding) or another port.
    """
    found = _host_port(host_header or "", scheme)
    if found is None or not is_loopback(found[0]):
        raise MisdirectedRequest(
            "no tokens are configured: the Host must be localhost or a loopback address"
        )
    if bound_port is not None and found[1] != bound_port:
        raise MisdirectedRequest(f"the Host names port {found[1]}; this server listens on another")


def bound_port(environ: Mapping[str, Any]) -> int | None:
    """The port a WSGI request's connection arrived on (gunicorn's socket), None
    when unknown."""
    sock = environ.get("gunicorn.socket")
    try:
        name = sock.getsockname() if sock is not None else None
    except OSError:
        return None
    return int(name[1]) if isinstance(name, tuple) and len(name) >= 2 else None


def check_origin(origin: str | None, host_header: str | None, scheme: str) -> None:
    """A request with an ``Origin`` (RFC 6454) must come from the server's own origin.

    Requests without ``Origin`` (n8n, curl, OpenAI clients) pass; a browser
    sends one on every cross-site request and on every same-origin one but
    GET/HEAD.

    :raises ForeignOrigin: another scheme, host or port, or ``null``.
    """
    if origin is None:
        return
    parts = urlsplit(origin.strip())
    own = _host_port(host_header or "", scheme)
    theirs = _host_port(parts.netloc, parts.scheme) if parts.scheme in _DEFAULT_PORTS else None
    if own is None or theirs is None or parts.scheme != scheme or theirs != own:
        raise ForeignOrigin(
            "the request comes from a web page of another origin: refused (CSRF protection)"
        )


class TokenTable:
    """The configured tokens, ready to authenticate ``Authorization`` headers.

    :param tokens: the configuration's token list.
    :param environ: where token values are read (each ``env`` must be set;
        :func:`sidecar.config.load_settings` checked that).
    """

    def __init__(self, tokens: Iterable[TokenConfig], environ: Mapping[str, str]) -> None:
        self._entries: list[tuple[bytes, Principal]] = []
        for t in tokens:
            value = environ.get(t.env, "")
            scope = (
                None
                if "*" in t.workflows
                else frozenset(unicodedata.normalize("NFC", w) for w in t.workflows)
            )
            self._entries.append(
                (hashlib.sha256(value.encode()).digest(), Principal(t.name, scope, t.admin))
            )

    def by_name(self, name: str) -> Principal | None:
        """The principal of the token named ``name`` (the operator page's session)."""
        return next((p for _, p in self._entries if p.name == name), None)

    @staticmethod
    def loopback(remote_addr: str | None) -> bool:
        return is_loopback(remote_addr)

    @property
    def open(self) -> bool:
        """True when no token is configured: serve unauthenticated, loopback only."""
        return not self._entries

    def authenticate(self, authorization: str | None, remote_addr: str | None) -> Principal:
        """Resolve the caller from an ``Authorization: Bearer <token>`` header.

        :raises Unauthenticated: header missing, not Bearer, or no token matches.
        :raises Forbidden: no tokens are configured and the caller is not on loopback.
        """
        return self.authenticate_token(
            presented_token({"authorization": authorization or ""}, {}, (BEARER,)),
            remote_addr,
        )

    def authenticate_token(
        self, token: str | None, remote_addr: str | None, sources: Iterable[TokenFrom] = (BEARER,)
    ) -> Principal:
        """Resolve the caller from a presented token (:func:`presented_token`),
        compared in constant time against every configured token.

        :param sources: where it was looked for (named in the 401's text).
        :raises Unauthenticated: no token, or no configured token matches.
        :raises Forbidden: no tokens are configured and the caller is not on loopback.
        """
        if self.open:
            if not is_loopback(remote_addr):
                raise Forbidden("no tokens are configured: only loopback callers are served")
            return ANONYMOUS
        if not token:
            raise Unauthenticated("send " + " or ".join(s.describe() for s in sources))
        digest = hashlib.sha256(token.encode()).digest()
        found: Principal | None = None
        for expected, principal in self._entries:
            if hmac.compare_digest(expected, digest):
                found = principal
        if found is None:
            raise Unauthenticated("the token matches no configured token")
        return found

"""One rule for showing a URL that may hold a password: :func:`redact_url`.

Every URL loopstop shows (the log, ``/readyz``, a stop's answer, ``check-config``)
goes through it: the store's (``redis://:pw@host``, ``postgresql://u:pw@host``)
and n8n's API (``http://user:pw@n8n:5678/api/v1``) alike.
"""

from __future__ import annotations

__all__ = ["redact_url"]


def redact_url(url: str) -> str:
    """``url`` with the password of its userinfo replaced by ``***`` (RFC 3986
    ``scheme://user:password@host/...``); the user, host, port and path are kept.

    Everything up to the last ``@`` before the query is taken as userinfo, so a
    password holding a raw ``/`` or ``@`` is hidden too (at worst more is hidden
    than needed, never less). A URL without a password is returned unchanged.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    head, mark, tail = _split_query(rest)
    userinfo, at, host = head.rpartition("@")
    if not at:
        return url
    user, colon, _password = userinfo.partition(":")
    if not colon:
        return url
    return f"{scheme}{sep}{user}:***@{host}{mark}{tail}"


def _split_query(rest: str) -> tuple[str, str, str]:
    """``rest`` cut before its first ``?`` or ``#``: (before, the mark, after)."""
    cuts = [i for i in (rest.find("?"), rest.find("#")) if i >= 0]
    if not cuts:
        return rest, "", ""
    i = min(cuts)
    return rest[:i], rest[i], rest[i + 1 :]

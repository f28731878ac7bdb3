"""Canonical JSON and keyed fingerprints.

Canonical JSON is RFC 8785 (JSON Canonicalization Scheme), computed by the
``rfc8785`` package, so that n8n (JavaScript) and Python agree on what "the
same value" is: ``{"a": 1.0}`` and ``{"a": 1}`` canonicalize alike and key
order never matters.

A fingerprint is ``HMAC-SHA256(secret, JCS(value))`` as lower-case hex.
Raw values are never stored: only fingerprints. Each fingerprint is tagged
with the id of the secret that made it, so that after a rotation
(``LOOPSTOP_SECRET_PREVIOUS``) records made under the previous secret still
match.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rfc8785

#: The largest integer an IEEE-754 double holds exactly (RFC 7493 §2.2, I-JSON).
MAX_SAFE_INTEGER = 2**53 - 1


def _to_js_numbers(value: Any) -> Any:
    """Map integers outside the I-JSON range to floats, as JavaScript parses them.

    n8n parses JSON with ``JSON.parse``: an integer beyond 2**53 becomes the
    nearest double. Doing the same here keeps fingerprints equal on both
    sides instead of rejecting an honest payload (a 64-bit database id).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
        try:
            return float(value)
        except OverflowError:
            raise ValueError("integer out of the range of a double") from None
    if isinstance(value, dict):
        return {k: _to_js_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_js_numbers(v) for v in value]
    return value


def canonical_json(value: Any) -> bytes:
    """Serialize a JSON value per RFC 8785 (JCS).

    :param value: a JSON value (dict with str keys, list, str, int, float,
        bool, None).
    :returns: the canonical UTF-8 bytes.
    :raises ValueError: when the value holds NaN or an infinity (not JSON;
        RFC 8785 §3.2.2.3) or a non-JSON type.
    """
    if _plain(value, 0):
        # No float, every key ASCII: the standard library writes the same bytes
        # (keys in code-unit order, the same escapes, integers as digits).
        try:
            return _PLAIN_WRITER.encode(value).encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: not Unicode text
            raise ValueError(str(exc)) from exc
    try:
        return rfc8785.dumps(_to_js_numbers(value))
    except (rfc8785.CanonicalizationError, UnicodeEncodeError) as exc:
        raise ValueError(str(exc)) from exc


#: What ``json.dumps(value, sort_keys=True, separators=(",", ":"),
#: ensure_ascii=False)`` writes with, built once (``json.dumps`` builds one per
#: call when given options).
_PLAIN_WRITER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)

#: How deep :func:`_plain` looks before leaving a value to ``rfc8785``.
_PLAIN_DEPTH = 32


def _plain(value: Any, depth: int) -> bool:
    """True when ``value``'s RFC 8785 form is what :func:`json.dumps` writes
    with sorted keys, compact separators and ``ensure_ascii=False``: only
    dicts with ASCII keys (sorting by UTF-16 code units and by code points
    agree on them), lists, strings (both escape only ``"``, ``\\`` and control
    characters, the same way), integers within :data:`MAX_SAFE_INTEGER`,
    booleans and null. Floats (ES6 number form) and anything else are not.
    """
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(-MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER)
    if depth >= _PLAIN_DEPTH:
        return False
    if kind is dict:
        for k, v in value.items():
            if type(k) is not str or not k.isascii() or not _plain(v, depth + 1):
                return False
        return True
    if kind is list:
        return all(_plain(v, depth + 1) for v in value)
    return False


#: SHA-256's block size and the HMAC pads as translation tables (RFC 2104 §2).
_BLOCK = 64
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


@dataclass(frozen=True)
class Secret:
    """An HMAC key and its public id.

    :ivar key: the raw key bytes (never logged).
    :ivar id: 12 hex characters derived from the key, safe to store beside
        each record so the record can later be matched under the right key.
    """

    key: bytes

    @functools.cached_property
    def id(self) -> str:
        return hashlib.sha256(b"loopstop-secret-id:" + self.key).hexdigest()[:12]

    @functools.cached_property
    def _pads(self) -> tuple[Any, Any]:
        """SHA-256 states after the key's inner and outer pads (RFC 2104 §2),
        computed once; each MAC copies them."""
        key = self.key if len(self.key) <= _BLOCK else hashlib.sha256(self.key).digest()
        key = key.ljust(_BLOCK, b"\0")
        return hashlib.sha256(key.translate(_IPAD)), hashlib.sha256(key.translate(_OPAD))

    def hmac_hex(self, message: bytes) -> str:
        """``HMAC-SHA256(key, message)`` as hex (RFC 2104; what :func:`hmac.new`
        computes, without setting the key up again on every call)."""
        inner_pad, outer_pad = self._pads
        inner = inner_pad.copy()
        inner.update(message)
        outer = outer_pad.copy()
        outer.update(inner.digest())
        return str(outer.hexdigest())

    def __repr__(self) -> str:
        return f"Secret(id={self.id!r})"


class Fingerprinter:
    """Computes keyed fingerprints under the current secret and verifies old ones.

    :param current: the secret new records are fingerprinted with.
    :param previous: secrets still accepted for records made before a
        rotation, newest first.
    """

    def __init__(self, current: Secret, previous: Iterable[Secret] = ()) -> None:
        self.current = current
        self.previous = tuple(previous)
        self._by_id = {s.id: s for s in (current, *self.previous)}

    @property
    def secret_ids(self) -> tuple[str, ...]:
        """Ids of every secret this fingerprinter knows, current first."""
        return tuple(self._by_id)

    def fingerprint(self, value: Any, secret_id: str | None = None) -> str:
        """``HMAC-SHA256(secret, JCS(value))`` as hex.

        :param secret_id: which secret to use (default: the current one).
        :raises KeyError: when ``secret_id`` names no known secret.
        :raises ValueError: when ``value`` is not canonicalizable JSON.
        """
        secret = self.current if secret_id is None else self._by_id[secret_id]
        return secret.hmac_hex(canonical_json(value))

    def fingerprint_canonical(self, value: Any) -> tuple[str, bytes]:
        """``value``'s fingerprint under the current secret, and the canonical JSON
        (RFC 8785) it was made of, for a caller that reads that form too.

        :raises ValueError: when ``value`` is not canonicalizable JSON.
        """
        data = canonical_json(value)
        return self.current.hmac_hex(data), data

    def fingerprints(self, value: Any) -> dict[str, str]:
        """The fingerprint of ``value`` under every known secret, keyed by secret id.

        The policy core compares a record's fingerprint with the entry for
        the record's own ``secret_id``; a record whose secret is no longer
        configured finds no entry and cannot be matched.
        """
        data = canonical_json(value)
        return {sid: s.hmac_hex(data) for sid, s in self._by_id.items()}

    def mac(self, message: str, secret_id: str | None = None) -> str:
        """HMAC-SHA256 of a text message, hex, under the current (or a named) secret.

        :raises KeyError: when ``secret_id`` names no known secret.
        """
        secret = self.current if secret_id is None else self._by_id[secret_id]
        return secret.hmac_hex(message.encode())

    def key_hash(self, kind: str, value: str) -> str:
        """A short keyed hash of an identity (an event key, an address) for store keys.

        Store keys never hold raw identities. Made with the current secret:
        after a rotation, lookups by identity start afresh.
        """
        return self.mac(f"{kind}:{value}")[:32]


def secret_from_text(text: str) -> Secret:
    """Turn a configured secret string into a :class:`Secret`.

    :raises ValueError: when the secret is shorter than 16 characters.
    """
    text = text.strip()
    if len(text) < 16:
        raise ValueError("a secret needs at least 16 characters")
    return Secret(text.encode())


def load_or_create_secret_file(path: Path) -> Secret:
    """Read the secret kept at ``path``, creating it once (mode 0600) if absent.

    Creation is race-free across processes: the key is written to a private
    temporary file which is then hard-linked into place; ``os.link`` fails
    if another process won, and that process's file is read instead.

    :raises OSError: when the folder is not writable or the file unreadable.
    :raises ValueError: when the file exists but holds too short a secret.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(48) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            with contextlib.suppress(FileExistsError):  # another process won the race
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return secret_from_text(path.read_text())


def build_fingerprinter(environ: Mapping[str, str], secret_file: Path | None) -> Fingerprinter:
    """Build the fingerprinter from ``LOOPSTOP_SECRET`` (+ ``_PREVIOUS``) or a kept file.

    :param secret_file: where the generated secret lives when
        ``LOOPSTOP_SECRET`` is unset (beside the SQLite database); None when
        the store is shared (Redis) and a configured secret is required.
    :raises ValueError: when no secret can be had, with a sentence saying why.
    """
    configured = environ.get("LOOPSTOP_SECRET", "").strip()
    previous = [
        secret_from_text(p)
        for p in environ.get("LOOPSTOP_SECRET_PREVIOUS", "").split(",")
        if p.strip()
    ]
    if configured:
        current = secret_from_text(configured)
    elif secret_file is not None:
        current = load_or_create_secret_file(secret_file)
    else:
        raise ValueError(
            "LOOPSTOP_SECRET is required with a shared (Redis or PostgreSQL) store: every instance "
            "must fingerprint with the same secret"
        )
    return Fingerprinter(current, previous)

"""Chain markers: ``ls1.<chain_id>.<depth>.<signature>``.

A marker is an opaque string the flow embeds in what it writes (a sheet
column, an email body line, a webhook header) so that, when the write comes
back through a trigger, the activation continues the chain one hop deeper.
The signature is the first 32 hex digits (128 bits) of
``HMAC-SHA256(secret, "ls1.<namespace>.<chain_id>.<depth>")``: a marker made
by a test execution does not verify in production. A marker whose signature
verifies under no configured secret is ignored (and counted), never trusted.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sidecar.canonical import Fingerprinter
from sidecar.core.chains import Marker

PREFIX = "ls1"
SIGNATURE_HEX = 32
MAX_DEPTH_DIGITS = 4
_CHAIN_ID = r"c[0-9a-f]{20}"
_VALID = re.compile(
    rf"{PREFIX}\.({_CHAIN_ID})\.(\d{{1,{MAX_DEPTH_DIGITS}}})\.([0-9a-f]{{{SIGNATURE_HEX}}})"
)
#: Anything that starts like a marker: candidates to verify (and count when they fail).
_CANDIDATE = re.compile(rf"(?<![A-Za-z0-9]){PREFIX}\.[A-Za-z0-9._-]*", re.IGNORECASE)
CHAIN_ID_PATTERN = rf"^{_CHAIN_ID}$"


@dataclass(frozen=True)
class Scan:
    """What a search for markers found: the valid ones and how many failed."""

    valid: tuple[Marker, ...]
    invalid: int

    def candidates(self, most: int = 10) -> tuple[Marker, ...]:
        """Distinct valid markers, deepest first (an email quoting a thread
        holds several; each is tried, so a stale one never hides a live one)."""
        unique = sorted(set(self.valid), key=lambda m: (-m.depth, m.chain_id))
        return tuple(unique[:most])


def _signature(fingerprinter: Fingerprinter, body: str, secret_id: str | None = None) -> str:
    return fingerprinter.mac(body, secret_id)[:SIGNATURE_HEX]


def encode(fingerprinter: Fingerprinter, ns: str, chain_id: str, depth: int) -> str:
    """The signed marker for ``chain_id`` at ``depth`` in namespace ``ns``."""
    body = f"{PREFIX}.{chain_id}.{depth}"
    return f"{body}.{_signature(fingerprinter, f'{PREFIX}.{ns}.{chain_id}.{depth}')}"


def verify(fingerprinter: Fingerprinter, ns: str, text: str) -> Marker | None:
    """Parse and verify one marker (surrounding whitespace allowed); None if it fails."""
    match = _VALID.fullmatch(text.strip().lower())
    if match is None:
        return None
    chain_id, depth, signature = match.groups()
    if depth != str(int(depth)):  # one spelling per depth: no leading zeros
        return None
    body = f"{PREFIX}.{ns}.{chain_id}.{depth}"
    ok = False
    for secret_id in fingerprinter.secret_ids:  # constant time per secret, no early exit
        ok |= hmac.compare_digest(_signature(fingerprinter, body, secret_id), signature)
    return Marker(chain_id, int(depth)) if ok else None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


#: A search that found nothing.
NOTHING = Scan((), 0)


def may_hold(canonical: bytes) -> bool:
    """Whether a value whose canonical JSON is ``canonical`` may hold a marker
    candidate: False only when :func:`scan` of that value finds nothing.

    :func:`scan` tries a string (or key) only when its lower-case form holds
    ``ls1.``; no character but ``L``, ``l``, ``S``, ``s``, ``1`` and ``.`` has
    a lower-case form holding any of those four, so such a string holds
    ``[Ll][Ss]1.``, which RFC 8785 writes as is (it escapes only ``"``,
    ``\\`` and control characters): the bytes, lower-cased, hold ``ls1.``.
    """
    return b"ls1." in canonical.lower()


def scan_given(fingerprinter: Fingerprinter, ns: str, text: str) -> Scan:
    """Verify a marker the caller handed over in ``marker``: anything there that
    is not a valid marker counts as one invalid marker."""
    found = scan(fingerprinter, ns, text)
    if not found.valid and not found.invalid:
        return Scan((), 1)
    return found


def scan(fingerprinter: Fingerprinter, ns: str, *values: Any) -> Scan:
    """Find markers in every string (and object key) of ``values``.

    Header lines (``"X-Loopstop-Chain: ls1...."``), body lines, sheet cells:
    anything that contains ``ls1.`` (not preceded by a letter or digit, so
    ``tools1.example.org`` is no candidate) is tried, in any letter case.
    """
    valid: list[Marker] = []
    invalid = 0
    for value in values:
        for text in _strings(value):
            if "ls1." not in text.lower():
                continue
            for candidate in _CANDIDATE.findall(text):
                marker = verify(fingerprinter, ns, candidate.rstrip("."))
                if marker is None:
                    invalid += 1
                else:
                    valid.append(marker)
    return Scan(tuple(valid), invalid)

"""RFC 8785 canonical JSON and keyed fingerprints."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.canonical import (
    Fingerprinter,
    Secret,
    canonical_json,
    secret_from_text,
)

F = Fingerprinter(Secret(b"k" * 32))


def test_number_forms_and_key_order_do_not_matter() -> None:
    assert canonical_json({"b": 1.0, "a": [1e21, 0.1]}) == b'{"a":[1e+21,0.1],"b":1}'
    assert F.fingerprint({"a": 1.0, "b": 2}) == F.fingerprint({"b": 2, "a": 1})


def test_rfc8785_appendix_example_numbers() -> None:
    # RFC 8785 §3.2.2.3 serializes numbers as ECMAScript does.
    assert canonical_json([333333333.33333329, 1e30, 4.50, 2e-3, 1e-27]) == (
        b"[333333333.3333333,1e+30,4.5,0.002,1e-27]"
    )


def test_non_json_values_are_refused() -> None:
    with pytest.raises(ValueError):
        canonical_json({"a": float("nan")})
    with pytest.raises(ValueError):
        canonical_json({"a": "\ud800"})  # a lone surrogate is not Unicode text
    with pytest.raises(ValueError):
        canonical_json({"a": 10**400})  # beyond a double: JavaScript cannot hold it either


def test_keyed_fingerprint_differs_by_secret() -> None:
    other = Fingerprinter(Secret(b"z" * 32))
    assert F.fingerprint({"a": 1}) != other.fingerprint({"a": 1})
    assert len(F.fingerprint({"a": 1})) == 64


def test_rotation_fingerprints_under_every_secret() -> None:
    old, new = Secret(b"o" * 32), Secret(b"n" * 32)
    f = Fingerprinter(new, [old])
    fps = f.fingerprints({"a": 1})
    assert fps == {
        new.id: f.fingerprint({"a": 1}),
        old.id: Fingerprinter(old).fingerprint({"a": 1}),
    }
    assert f.mac("m", old.id) == Fingerprinter(old).mac("m")
    assert f.key_hash("event", "a") != f.key_hash("subject", "a")


def test_secret_text_rules() -> None:
    with pytest.raises(ValueError):
        secret_from_text("too-short")
    assert "key" not in repr(secret_from_text("x" * 16))


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(JSON)
def test_canonical_json_is_stable_through_a_round_trip(value: object) -> None:
    import json

    once = canonical_json(value)
    assert canonical_json(json.loads(once)) == once


PLAIN_KEYS = st.text(st.characters(max_codepoint=0x7F), max_size=6)
PLAIN = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.text(st.characters(blacklist_categories=("Cs",))),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(PLAIN_KEYS, inner, max_size=4),
    max_leaves=20,
)


@given(PLAIN | JSON)
def test_the_standard_library_path_writes_rfc8785s_bytes(value: object) -> None:
    """ "Fingerprints and markers": values with no float and ASCII keys are written
    by ``json.dumps``; the bytes are the RFC 8785 library's."""
    import rfc8785

    from sidecar.canonical import _to_js_numbers

    assert canonical_json(value) == rfc8785.dumps(_to_js_numbers(value))


@given(st.binary(min_size=16, max_size=200), st.binary(max_size=300))
def test_secret_mac_is_rfc2104_hmac_sha256(key: bytes, message: bytes) -> None:
    """The MAC every fingerprint and key hash uses is HMAC-SHA256, keys longer
    than a block included."""
    import hashlib
    import hmac

    from sidecar.canonical import Secret

    assert Secret(key).hmac_hex(message) == hmac.new(key, message, hashlib.sha256).hexdigest()

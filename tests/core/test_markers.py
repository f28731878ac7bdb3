"""Markers are trusted only as issued: a property test over forgeries."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar import markers
from sidecar.canonical import Fingerprinter, Secret, canonical_json
from sidecar.core.chains import Marker

FP = Fingerprinter(Secret(b"marker-secret-0123456789"))
OTHER = Fingerprinter(Secret(b"another-secret-0123456789"))
CHAIN = st.text("0123456789abcdef", min_size=20, max_size=20).map(lambda h: "c" + h)
DEPTH = st.integers(0, 9999)


@given(CHAIN, DEPTH)
def test_an_issued_marker_verifies_as_itself(chain: str, depth: int) -> None:
    text = markers.encode(FP, "p", chain, depth)
    assert markers.verify(FP, "p", text) == Marker(chain, depth)
    assert markers.verify(FP, "p", f"  {text.upper()}  ") == Marker(chain, depth)


@given(CHAIN, CHAIN, DEPTH, st.integers(1, 60))
def test_forgeries_are_never_trusted(chain: str, other: str, depth: int, cut: int) -> None:
    text = markers.encode(FP, "p", chain, depth)
    prefix, chain_id, depth_text, signature = text.split(".")
    forgeries = [
        text[:-cut],  # truncated
        f"{prefix}.{other}.{depth_text}.{signature}",  # replayed with another chain
        f"{prefix}.{chain_id}.{depth + 1}.{signature}",  # deeper or shallower
        f"{prefix}.{chain_id}.{max(0, depth - 1)}.{signature}",
        f"{prefix}.{chain_id}.0{depth_text}.{signature}",  # another spelling of the depth
        text[:-1] + ("0" if text[-1] != "0" else "1"),  # one digit flipped
        markers.encode(OTHER, "p", chain, depth),  # another secret
        markers.encode(FP, "t", chain, depth),  # a test execution's marker
    ]
    forgeries = [f for f in forgeries if f != text]
    for forged in forgeries:
        assert markers.verify(FP, "p", forged) is None, forged
    found = markers.scan(FP, "p", {"cells": forgeries})
    assert found.valid == ()
    assert found.invalid == len(
        [f for f in forgeries if "ls1." in f]
    )  # "ls1" alone is no candidate


@given(st.text(max_size=200))
def test_arbitrary_text_is_never_a_valid_marker(text: str) -> None:
    assert markers.scan(FP, "p", {"x": text}).valid == ()


def test_only_ascii_lowers_into_a_marker_prefix() -> None:
    """The premise of ``markers.may_hold``: no other character's lower-case form
    holds ``l``, ``s``, ``1`` or ``.``."""
    lowering = [
        hex(c)
        for c in range(0x80, 0x110000)
        if not 0xD800 <= c <= 0xDFFF and any(x in chr(c).lower() for x in "ls1.")
    ]
    assert lowering == []


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@given(JSON, CHAIN, DEPTH)
def test_a_value_that_may_hold_no_marker_scans_to_nothing(
    value: object, chain: str, depth: int
) -> None:
    for item in (value, [value, markers.encode(FP, "p", chain, depth).upper()], {"ls1.x": value}):
        if not markers.may_hold(canonical_json(item)):
            assert markers.scan(FP, "p", item) == markers.NOTHING

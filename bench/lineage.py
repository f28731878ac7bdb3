"""Per-page cost of a cursor check's lineage after 1k and after 1M record ids.

    .venv/bin/python bench/lineage.py [--page 100] [--pages 2000] [--big 1000000]

Fills one lineage with 1,000 ids and one with ``--big`` ids (pages of
``--page`` ids through :func:`sidecar.core.check_verdicts.cursor_step`), then times
``--pages`` more pages on each, doing what a cursor check does in its
transaction: read the stored document (JSON text), fingerprint the page's
record ids (HMAC, as the service does), step the lineage, encode the new
document. Prints p50/p90/p99 microseconds per page, for the lineage alone
(decode, step, encode) and with the fingerprints, and the stored size; the
two lineages should cost the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from sidecar.canonical import Fingerprinter, canonical_json, secret_from_text
from sidecar.core.check_verdicts import cursor_step
from sidecar.core.lineage import Lineage
from sidecar.store.base import encode_doc


def fill(n: int, page: int) -> Lineage:
    lineage = Lineage()
    for start in range(0, n, page):
        ids = [f"fill-{i:x}" for i in range(start, min(n, start + page))]
        lineage, _ = cursor_step(lineage, f"cursor-{start}", ids)
    return lineage


def measure(
    stored: str, fp: Fingerprinter, page: int, pages: int
) -> tuple[list[float], list[float]]:
    """Microseconds per page: the whole store part, and the lineage alone
    (decode, step, encode; the fingerprints excluded)."""
    whole, alone = [], []
    for p in range(pages):
        ids = [{"id": f"new-{p}-{i}"} for i in range(page)]
        t0 = time.perf_counter()
        cursor_fp = fp.key_hash("cursor", canonical_json(f"c{p}").decode())
        id_fps = [fp.key_hash("record", canonical_json(i).decode()) for i in ids]
        t1 = time.perf_counter()
        lineage = Lineage.from_doc(json.loads(stored))
        new, result = cursor_step(lineage, cursor_fp, id_fps)
        stored = encode_doc(new.to_doc())
        t2 = time.perf_counter()
        whole.append((t2 - t0) * 1e6)
        alone.append((t2 - t1) * 1e6)
        assert result.passed
    return whole, alone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", type=int, default=100, help="record ids per page")
    ap.add_argument("--pages", type=int, default=2000, help="pages timed per lineage")
    ap.add_argument("--big", type=int, default=1_000_000)
    args = ap.parse_args()
    fp = Fingerprinter(secret_from_text("bench-secret-0123456789abcdef"))
    print(f"per-page cost, {args.page} ids a page, {args.pages} pages timed")
    for n in (1_000, args.big):
        t0 = time.perf_counter()
        stored = encode_doc(fill(n, args.page).to_doc())
        filled_s = time.perf_counter() - t0
        measure(stored, fp, args.page, 50)  # warm up
        whole, alone = measure(stored, fp, args.page, args.pages)
        print(f"  {n:>9,} ids seen, stored {len(stored):,} B (filled in {filled_s:.1f} s):")
        for label, us in (("lineage step", alone), ("with fingerprints", whole)):
            q = statistics.quantiles(us, n=100)
            print(f"    {label:<18} p50 {q[49]:7.1f} us  p90 {q[89]:7.1f} us  p99 {q[98]:7.1f} us")


if __name__ == "__main__":
    main()

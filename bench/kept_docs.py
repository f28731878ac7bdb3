"""What reading a task document back as the document this process wrote
(``sidecar.store.plan.WrittenText``) saves, against parsing its text, in one
process, alternated.

The sidecar (``create_app`` on a private redis-server, the decision log at
INFO to a discarded stream, prometheus in multiprocess mode, as under
``loopstop serve``) serves tool calls and their results (bench/parts.py's
driver, through the WSGI callable) on ``--tasks`` tasks whose histories are
full (their last 200 calls, about 44 KB a document). Then blocks of
``--requests`` requests alternate between keeping documents (as served) and
not keeping them (``KEEP_DOC_CHARS`` past any document: every read parses
the text, as before), and each block's CPU time per request is printed
(:func:`time.process_time`: this process only, the store's time not
counted). Alternating in one process cancels most of a noisy machine's
drift, which separate runs of two checkouts do not.

Run: ``.venv/bin/python bench/kept_docs.py [--tasks 16] [--requests 2000] [--blocks 8]``
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--requests", type=int, default=2000, help="requests per block")
    ap.add_argument("--blocks", type=int, default=8, help="blocks, alternating (even)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="loopstop-kept-"))
    (tmp / "prom").mkdir()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(tmp / "prom")
    import parts
    import run

    from sidecar.core.tasks.state import CALL_HISTORY
    from sidecar.store import plan

    kept_from = plan.KEEP_DOC_CHARS
    redis_proc, port, _client = run.start_redis(tmp)
    try:
        app, make_tasks = parts._sidecar(f"redis://127.0.0.1:{port}/0", tmp)
        driver = parts.Driver(parts.Parts(), app, run.TOKEN, "k")
        driver.tasks = make_tasks(args.tasks)
        driver.run("tool call+result", 2 * CALL_HISTORY * args.tasks + 200)  # full histories
        figures: dict[bool, list[float]] = {True: [], False: []}
        print(
            f"tool call + result, {args.tasks} tasks of {CALL_HISTORY} calls, "
            f"{args.requests} requests a block; load average {os.getloadavg()[0]:.2f} at the start"
        )
        for block in range(args.blocks):
            keep = block % 2 == 1
            plan.KEEP_DOC_CHARS = kept_from if keep else sys.maxsize
            gc.collect()
            started = time.process_time()
            driver.run("tool call+result", args.requests)
            us = (time.process_time() - started) / args.requests * 1e6
            figures[keep].append(us)
            shown = "kept" if keep else "parsed"
            print(f"  block {block + 1}: {shown:6} {us:7.0f} us CPU a request")
        parsed, kept = statistics.median(figures[False]), statistics.median(figures[True])
        print(
            f"median: parsed {parsed:.0f}, kept {kept:.0f} us CPU a request "
            f"({parsed - kept:.0f} saved); load average {os.getloadavg()[0]:.2f} at the end"
        )
    finally:
        plan.KEEP_DOC_CHARS = kept_from
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())

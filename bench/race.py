"""Many concurrent begins over a few operation ids against a served sidecar:
exactly one ``execute`` per id, whatever the interleaving.

    .venv/bin/python bench/race.py --url http://127.0.0.1:8765 --begins 10000 --ids 200

Prints the decision counts and exits 1 when any id got other than one execute.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import requests


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8765")
    ap.add_argument("--token", default=None)
    ap.add_argument("--begins", type=int, default=10_000)
    ap.add_argument("--ids", type=int, default=200)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--prefix", default=f"race-{int(time.time())}")
    args = ap.parse_args(argv)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    order = [i % args.ids for i in range(args.begins)]
    random.shuffle(order)
    local = threading.local()

    def begin(i: int) -> tuple[int, str]:
        if not hasattr(local, "session"):
            local.session = requests.Session()  # one connection pool per client thread
        session = local.session
        r = session.post(
            f"{args.url}/v1/operations/{args.prefix}-{i}/begin",
            headers=headers,
            json={"payload": {"id": i}},
            timeout=60,
        )
        r.raise_for_status()
        return i, str(r.json()["decision"])

    started = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        results = list(pool.map(begin, order))
    elapsed = time.perf_counter() - started
    decisions = Counter(d for _, d in results)
    executes = Counter(i for i, d in results if d == "execute")
    wrong = [i for i in range(args.ids) if executes[i] != 1]
    print(
        f"{args.begins} begins over {args.ids} ids with {args.clients} clients in "
        f"{elapsed:.1f} s: {dict(decisions)}; ids without exactly one execute: {len(wrong)}"
    )
    return 1 if wrong or decisions["execute"] != args.ids else 0


if __name__ == "__main__":
    sys.exit(main())

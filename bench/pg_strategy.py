"""PostgreSQL transaction strategies measured side by side: advisory key
locks (READ COMMITTED) against SERIALIZABLE with a bounded retry.

Three loads on one store, each with ``--threads`` threads for ``--seconds``:
``new`` (every transaction creates a key of its own: a first begin),
``hot`` (every transaction bumps one shared document: the race on one id)
and ``mixed`` (a key of its own plus a read of a shared one: a begin that
checks a workflow stop). Prints transactions/s, p50/p99 latency and how
many ended in a 503 (the deadline, or retries exhausted).

    python bench/pg_strategy.py --url postgresql://user@127.0.0.1:5432/db
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from itertools import count

from sidecar.errors import StoreUnavailable
from sidecar.store import Plan, Snapshot, Write
from sidecar.store.postgres import PostgresStore


def run(url: str, load: str, threads: int, seconds: float) -> dict[str, float]:
    store = PostgresStore(url + ("&" if "?" in url else "?") + f"pool_size={threads}")
    store.ensure_schema()
    ids = count()
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def one() -> None:
        n = next(ids)
        if load == "hot":
            keys = ["bench:hot"]

            def fn(snap: Snapshot) -> Plan[None]:
                doc = snap.get("bench:hot") or {"n": 0}
                return Plan(None, {"bench:hot": Write({"n": doc["n"] + 1})})
        else:
            own = f"bench:{load}:{time.time_ns()}:{n}"
            keys = [own] if load == "new" else [own, "bench:stop"]

            def fn(snap: Snapshot) -> Plan[None]:
                if load == "mixed" and snap.get("bench:stop") is not None:
                    return Plan(None)
                return Plan(None, {own: Write({"n": n}, ttl_s=600)})

        started = time.perf_counter()
        try:
            store.transact(keys, fn)
        except StoreUnavailable:
            with lock:
                failures[0] += 1
            return
        with lock:
            latencies.append(time.perf_counter() - started)

    def worker() -> None:
        while time.monotonic() < stop:
            one()

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    store.close()
    latencies.sort()
    return {
        "tps": len(latencies) / seconds,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else 0.0,
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else 0.0,
        "failed": failures[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    print(f"{'strategy':<14}{'load':<7}{'tx/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'503':>6}")
    for isolation in ("cas", "serializable"):
        sep = "&" if "?" in args.url else "?"
        url = f"{args.url}{sep}isolation={isolation}"
        for load in ("new", "mixed", "hot"):
            r = run(url, load, args.threads, args.seconds)
            print(
                f"{isolation:<14}{load:<7}{r['tps']:>8.0f}{r['p50_ms']:>9.1f}"
                f"{r['p99_ms']:>9.1f}{r['failed']:>6.0f}"
            )


if __name__ == "__main__":
    main()

"""Redis store: production and multi-instance (one primary).

Key layout (every key starts with the prefix, ``loopstop:`` by default;
the logical part after it is built by :mod:`sidecar.service.keys`, which
documents each pattern)::

    loopstop:schema_version                 string, the layout version
    loopstop:<ns>:op:<operation_id>         JSON document, TTL = retention once settled
    loopstop:<ns>:ix:<index name>           sorted set (score, member) for listings
    loopstop:<ns>:stop:wf:<workflow>        JSON document, a sticky workflow stop
    loopstop:<ns>:stop:chain:<chain_id>     JSON document, a sticky chain stop

A transaction costs two round trips when nothing else wrote in between:
``MGET`` of the declared keys, then the ``cas.lua`` compare-and-set, which
checks that every document read is unchanged and applies the plan. A
decision that writes nothing returns after the read. On a concurrent change
the script writes nothing and answers the documents' current values: the
transaction re-runs the (pure) function on them at once; on a second
conflict and after, it sleeps a short jittered back-off and reads again (an
answer is stale by the sleep), up to ``max_retries`` attempts.

A transaction on keys that are probably new (``absent_likely``: a first
``begin`` of an operation id) skips the ``MGET``: the function decides as if
every key were absent, and the compare-and-set checks exactly that. One
round trip when the guess holds; when it does not, the script's answer is
the read, so still two. A guess that times out (a write pause during a
failover blocks the script) is decided once more on a real read, so a
replay is still answered while writes wait.

redis-py's own retries are off: a command that timed out may or may not
have run, and a blind resend of a compare-and-set would misreport a
reservation this client itself made. Such a failure is a 503; the caller's
retry then sees the true state.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Any, cast
from urllib.parse import parse_qs, urlparse

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sidecar import metrics
from sidecar.errors import StoreUnavailable
from sidecar.store.base import Doc, Plan, Snapshot, Store, T, TxnFn, encode_doc

_CAS = resources.files("sidecar.store").joinpath("lua/cas.lua").read_text()

#: The longest TTL written (ten years): a longer retention is "forever" in practice.
MAX_TTL_MS = 10 * 365 * 86_400 * 1000


def _ttl_ms(ttl_s: float | None) -> str:
    """A TTL for the script: milliseconds as a decimal string ("0" keeps for ever).

    A string, because Lua would print a large number as 1e+18.
    """
    ttl_ms = 0 if ttl_s is None else max(1, math.ceil(ttl_s * 1000))
    return str(min(ttl_ms, MAX_TTL_MS))


class RedisStore(Store):
    """The store on a Redis primary.

    :param url: ``redis://[:password@]host:port/db`` (``rediss://`` for TLS);
        query parameters ``socket_timeout_s`` and ``connect_timeout_s``.
    :param prefix: namespace of every key.
    :param max_retries: compare-and-set attempts before giving up (503).
    :raises StoreUnavailable: never at construction (connections are lazy);
        from every method when Redis does not answer.
    """

    backend = "redis"

    def __init__(self, url: str, *, prefix: str = "loopstop:", max_retries: int = 64) -> None:
        query = parse_qs(urlparse(url).query)
        socket_timeout = float(query.pop("socket_timeout_s", ["2"])[0])
        connect_timeout = float(query.pop("connect_timeout_s", ["1"])[0])
        base = url.split("?", 1)[0]
        self.url_redacted = _redact(base)
        self.client: redis.Redis = redis.Redis.from_url(
            base,
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=30,
        )
        self.prefix = prefix
        self.max_retries = max_retries
        self._cas = self.client.register_script(_CAS)

    def _k(self, key: str) -> str:
        return self.prefix + key

    def transact(self, keys: Iterable[str], fn: TxnFn[T], *, absent_likely: bool = False) -> T:
        declared = list(dict.fromkeys(keys))
        # What the next attempt starts from without reading: every declared
        # key absent (a guess, when asked for), or the values a failed
        # compare-and-set returned (one consistent snapshot).
        seed: dict[str, str | None] | None = dict.fromkeys(declared) if absent_likely else None
        guessing = absent_likely
        conflicts = 0
        try:
            for _attempt in range(self.max_retries):
                reads = _Reads(self, seed, guessing)
                reads.load(declared)
                plan = _decide(fn, reads)
                if plan is None:  # not to be decided on a guess: read what is stored
                    seed, guessing = None, False
                    continue
                quiet = not (plan.writes or plan.index or plan.trims or plan.increments)
                if quiet and not guessing and reads.snapshots <= 1:
                    return plan.committed()  # read at one instant: consistent as it is
                try:
                    current = self._compare_and_set(reads.raw, plan)
                except redis.TimeoutError:
                    # The script may have run: if every write is in place, it did.
                    if self._landed(plan):
                        return plan.committed()
                    if not guessing:
                        raise
                    # A guess waits like any write (a failover's write pause):
                    # decide once more on a real read, which a replay needs
                    # no write for. If the script still runs, it compares
                    # against the guess and writes nothing over a record.
                    seed, guessing = None, False
                    continue
                if current is None:
                    return plan.committed()
                seed = current
                if guessing:
                    guessing = False  # a wrong guess costs no extra round trip
                    continue
                metrics.STORE_CONFLICTS.inc()
                conflicts += 1
                if conflicts > 1:
                    # Back off, then read afresh: values answered before a
                    # sleep are stale by the sleep and would lose again.
                    time.sleep(random.uniform(0, min(0.05, 0.001 * 2**conflicts)))
                    seed = None
        except redis.RedisError as exc:
            raise StoreUnavailable(f"redis store {self.url_redacted}: {exc}") from exc
        raise StoreUnavailable(
            f"redis store {self.url_redacted}: gave up after {self.max_retries} "
            "concurrent changes to the same keys"
        )

    @staticmethod
    def _serialized(plan: Plan[Any]) -> dict[str, str | None]:
        return {key: None if w.doc is None else encode_doc(w.doc) for key, w in plan.writes.items()}

    def _landed(self, plan: Plan[Any]) -> bool:
        """True when every document the plan writes holds exactly the planned value.

        Planned documents carry the decision's own timestamps and ids, so an
        exact match means this transaction's script ran. Any doubt answers False.
        """
        planned = self._serialized(plan)
        if not planned:
            return False
        try:
            now = self.client.mget([self._k(k) for k in planned])
        except redis.RedisError:
            return False
        return all(v == planned[k] for k, v in zip(planned, now, strict=True))

    def _compare_and_set(
        self, raw: dict[str, str | None], plan: Plan[Any]
    ) -> dict[str, str | None] | None:
        """Run ``cas.lua``: None when the plan was applied; otherwise nothing
        was written and the answer is the current raw value of every compared
        document (those ``raw`` holds, less the plan's unchecked keys)."""
        plan.check()
        doc_keys = [k for k in raw if k not in plan.unchecked]
        position = {k: i + 1 for i, k in enumerate(doc_keys)}
        serialized = self._serialized(plan)
        writes = []
        values: list[str] = []  # ARGV after the plan: the new documents
        first_value = len(doc_keys) + 3  # ARGV position of the first of them
        for key, write in plan.writes.items():
            if key not in position:
                raise RuntimeError(f"transaction wrote {key!r} without reading it")
            value = serialized[key]
            if value is None:
                writes.append([position[key], None, _ttl_ms(write.ttl_s)])
            else:
                writes.append([position[key], first_value + len(values), _ttl_ms(write.ttl_s)])
                values.append(value)
        index_keys = list(
            dict.fromkeys([*(e.index for e in plan.index), *(name for name, _ in plan.trims)])
        )
        ipos = {k: i + 1 for i, k in enumerate(index_keys)}
        index_ops = [
            [ipos[e.index], e.member, None if e.score is None else repr(float(e.score))]
            for e in plan.index
        ]
        trims = [[ipos[name], repr(float(below))] for name, below in plan.trims]
        incr_keys = list(plan.increments)
        first = len(doc_keys) + len(index_keys) + 1  # KEYS position of the first increment
        increments = [
            [first + i, inc.field, inc.delta, _ttl_ms(inc.ttl_s)]
            for i, inc in enumerate(plan.increments.values())
        ]
        metrics.STORE_ROUND_TRIPS.inc()
        result = self._cas(
            keys=[self._k(k) for k in [*doc_keys, *index_keys, *incr_keys]],
            args=[
                len(doc_keys),
                *[raw[k] or "" for k in doc_keys],
                json.dumps(
                    {"w": writes, "x": index_ops, "t": trims, "i": increments},
                    separators=(",", ":"),
                ),
                *values,
            ],
        )
        if result == 1:
            return None
        now = cast(list[str | None], result)[1:]
        return dict(zip(doc_keys, now, strict=True))

    def get_many(self, keys: Sequence[str]) -> dict[str, Doc | None]:
        unique = list(dict.fromkeys(keys))
        if not unique:
            return {}
        try:
            values = self.client.mget([self._k(k) for k in unique])
        except redis.RedisError as exc:
            raise StoreUnavailable(f"redis store {self.url_redacted}: {exc}") from exc
        pairs = zip(unique, values, strict=True)
        return {k: None if v is None else json.loads(v) for k, v in pairs}

    def index_page(
        self,
        index: str,
        *,
        min_score: float = float("-inf"),
        max_score: float = float("inf"),
        after: tuple[float, str] | None = None,
        limit: int = 50,
    ) -> list[tuple[str, float]]:
        lo = "-inf" if math.isinf(min_score) else repr(min_score)
        if after is not None and (math.isinf(min_score) or after[0] >= min_score):
            lo = repr(float(after[0]))
        hi = "+inf" if math.isinf(max_score) else repr(max_score)
        out: list[tuple[str, float]] = []
        offset = 0
        batch = max(limit, 50)
        try:
            while len(out) < limit:
                rows = cast(
                    list[tuple[str, float]],
                    self.client.zrange(
                        self._k(index),
                        lo,
                        hi,
                        byscore=True,
                        offset=offset,
                        num=batch,
                        withscores=True,
                    ),
                )
                for member, score in rows:
                    if after is not None and (score, member) <= (after[0], after[1]):
                        continue
                    out.append((member, score))
                    if len(out) == limit:
                        break
                if len(rows) < batch:
                    break
                offset += batch
        except redis.RedisError as exc:
            raise StoreUnavailable(f"redis store {self.url_redacted}: {exc}") from exc
        return out

    def index_count(
        self, index: str, *, min_score: float = float("-inf"), max_score: float = float("inf")
    ) -> int:
        lo = "-inf" if math.isinf(min_score) else repr(min_score)
        hi = "+inf" if math.isinf(max_score) else repr(max_score)
        try:
            return int(self.client.zcount(self._k(index), lo, hi))
        except redis.RedisError as exc:
            raise StoreUnavailable(f"redis store {self.url_redacted}: {exc}") from exc

    def ping(self) -> dict[str, Any]:
        try:
            self.client.ping()
            info = self.client.info("persistence")
            try:
                save = self.client.config_get("save").get("save", "")
            except redis.ResponseError:  # CONFIG disabled (managed Redis)
                save = None
        except redis.RedisError as exc:
            raise StoreUnavailable(f"redis store {self.url_redacted}: {exc}") from exc
        aof = bool(int(info.get("aof_enabled", 0)))
        rdb = bool(save) if save is not None else None
        warnings = []
        if not aof and rdb is False:
            warnings.append(
                "redis persistence is off (no AOF, no RDB save points): a restart "
                "forgets every committed operation"
            )
        elif not aof:
            warnings.append("redis AOF is off: a crash can lose the last writes (RDB only)")
        return {
            "backend": self.backend,
            "url": self.url_redacted,
            "aof_enabled": aof,
            "rdb_enabled": rdb,
            "warnings": warnings,
        }

    def _read_schema_version(self) -> int | None:
        try:
            value = self.client.get(self._k("schema_version"))
        except redis.RedisError as exc:
            raise StoreUnavailable(f"redis store {self.url_redacted}: {exc}") from exc
        return None if value is None else int(value)

    def _write_schema_version(self, version: int) -> None:
        try:
            self.client.set(self._k("schema_version"), str(version))
        except redis.RedisError as exc:
            raise StoreUnavailable(f"redis store {self.url_redacted}: {exc}") from exc

    def close(self) -> None:
        self.client.close()


def _decide(fn: TxnFn[T], reads: _Reads) -> Plan[T] | None:
    """``fn`` on what the attempt read; None when that was a guess the plan
    cannot stand on: ``fn`` raised on it (the error may not be the answer),
    or the plan reads keys unchecked (the compare-and-set never checks them).

    :raises Exception: what ``fn`` raised on values actually read.
    """
    try:
        plan = fn(Snapshot(reads.docs, reads.load))
    except Exception:
        if reads.guessing:
            return None
        raise
    return None if reads.guessing and plan.unchecked else plan


class _Reads:
    """The raw values one transaction attempt read, and how many instants they
    were read at (each ``MGET`` is one; a seed from a compare-and-set is one).

    :param seed: values known without reading (the attempt starts from them).
    :param guessing: the seed is a guess: keys not in it are assumed absent
        too, never read; the compare-and-set checks every one of them.
    """

    def __init__(
        self, store: RedisStore, seed: dict[str, str | None] | None, guessing: bool
    ) -> None:
        self.store = store
        self.guessing = guessing
        self.raw: dict[str, str | None] = {}
        self.docs: dict[str, Doc | None] = {}
        self.snapshots = 0
        if seed is not None:
            self.snapshots = 0 if guessing else 1
            self._keep(list(seed), list(seed.values()))

    def _keep(self, keys: list[str], values: list[str | None]) -> None:
        for k, v in zip(keys, values, strict=True):
            self.raw[k] = v
            self.docs[k] = None if v is None else json.loads(v)

    def load(self, keys: list[str]) -> None:
        fresh = [k for k in keys if k not in self.raw]
        if not fresh:
            return
        if self.guessing:
            self._keep(fresh, [None] * len(fresh))
            return
        self.snapshots += 1
        metrics.STORE_ROUND_TRIPS.inc()
        values = cast(list[str | None], self.store.client.mget([self.store._k(k) for k in fresh]))
        self._keep(fresh, values)


def _redact(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password:
        netloc = f"{parsed.username or ''}:***@{parsed.hostname}"
        if parsed.port:
            netloc += f":{parsed.port}"
        return parsed._replace(netloc=netloc).geturl()
    return url

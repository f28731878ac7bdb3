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

A transaction on keys this process probably saw last (``recent_likely``: a
commit after its begin, a tool call's result after its admission) skips the
``MGET`` the same way when every declared key is in the store object's map
of recent values (the raw text it last read or wrote per key, bounded by
:data:`RECENT_KEYS` and :data:`RECENT_CHARS`): the function decides on those
values and the compare-and-set checks them exactly. A guess never stands on
keys the plan leaves unchecked (counters that increments change): those
transactions read.

Every transaction also compares the store's identity (``loopstop:store_id``)
inside the same ``MGET`` or script, so a Redis restarted empty is refused
at the next decision. Every ``policy_check_s`` seconds (and at start) the
store reads ``maxmemory_policy`` from ``INFO memory``: anything but
``noeviction`` could evict ledger records, so every call answers 503 until
it is set back. A decision has one deadline (``timeout_s``): after a
timeout nothing more is tried once it has passed. With ``wait_replicas``
N > 0, a script that wrote answers only after ``WAIT`` saw N replicas take
it (sent in the script's round trip); fewer is a 503.

``redis+sentinel://host:port[,host:port]/<service>/<db>`` reaches the
primary through redis-py's :class:`~redis.sentinel.Sentinel`, which asks
the sentinels again after a failover.

redis-py's own retries are off: a command that timed out may or may not
have run, and a blind resend of a compare-and-set would misreport a
reservation this client itself made. Such a failure is a 503; the caller's
retry then sees the true state.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from typing import Any, NoReturn, cast
from urllib.parse import parse_qs, urlparse

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from sidecar import metrics
from sidecar.errors import StoreUnavailable
from sidecar.store.base import META_ID, Doc, Plan, Snapshot, Store, T, TxnFn, decode_doc, encode_doc
from sidecar.urls import redact_url

log = logging.getLogger("loopstop.store")

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
    """The store on a Redis primary (directly, or found through Sentinel).

    :param url: ``redis://[:password@]host:port/db`` (``rediss://`` for TLS)
        or ``redis+sentinel://[:password@]host:port[,host:port]/<service>/<db>``;
        query parameters ``socket_timeout_s`` and ``connect_timeout_s``.
    :param prefix: namespace of every key.
    :param max_retries: compare-and-set attempts before giving up (503).
    :param timeout_s: the deadline of one call (a decision), seconds; the
        socket timeout is never longer.
    :param wait_replicas: replicas that must acknowledge every write before
        it is answered (``WAIT``); 0 answers once the primary applied it.
    :param policy_check_s: seconds between checks of ``maxmemory-policy``.
    :raises StoreUnavailable: never at construction (connections are lazy);
        from every method when Redis does not answer.
    """

    backend = "redis"
    driver_errors = (redis.RedisError,)

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "loopstop:",
        max_retries: int = 64,
        timeout_s: float = 2.0,
        wait_replicas: int = 0,
        policy_check_s: float = 5.0,
    ) -> None:
        query = parse_qs(urlparse(url).query)
        socket_timeout = min(float(query.pop("socket_timeout_s", [str(timeout_s)])[0]), timeout_s)
        connect_timeout = min(float(query.pop("connect_timeout_s", ["1"])[0]), timeout_s)
        base = url.split("?", 1)[0]
        self.url_redacted = redact_url(base)
        options: dict[str, Any] = {
            "decode_responses": True,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
            "retry": Retry(NoBackoff(), 0),
            "health_check_interval": 30,
        }
        if urlparse(base).scheme == "redis+sentinel":
            hosts, service, db, password = parse_sentinel_url(base)
            self.sentinel: Sentinel | None = Sentinel(  # type: ignore[no-untyped-call]
                hosts,
                socket_timeout=socket_timeout,
                socket_connect_timeout=connect_timeout,
            )
            self.client: redis.Redis = self.sentinel.master_for(  # type: ignore[no-untyped-call]
                service, db=db, password=password, **options
            )
        else:
            self.sentinel = None
            self.client = redis.Redis.from_url(base, **options)
        self.prefix = prefix
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.wait_replicas = wait_replicas
        self.policy_check_s = policy_check_s
        self._policy_at = -math.inf
        self._policy_bad: str | None = None
        self._cas = self.client.register_script(_CAS)
        self._recent = _Recent()

    def _where(self) -> str:
        return self.url_redacted

    def _unavailable(self, exc: BaseException) -> NoReturn:
        """The 503 (:meth:`Store._unavailable`); a plan the script refused is
        the caller's error (as SQLite raises it), and under Sentinel the
        primary is asked for again."""
        if isinstance(exc, redis.ResponseError) and "not a JSON object" in str(exc):
            raise RuntimeError(str(exc).rsplit(": ", 1)[0]) from exc
        if self.sentinel is not None:
            # The server may no longer be the primary (a failover the old
            # one has not heard of yet: its writes reach no replica). Ask the
            # sentinels now: a new address drops the idle connections, and
            # connections to the old one as they come back to the pool.
            pool = cast(Any, self.client.connection_pool)
            with contextlib.suppress(redis.RedisError):
                pool.get_master_address()
            pool.disconnect(inuse_connections=False)
        super()._unavailable(exc)

    def _guard(self) -> None:
        """Refuse while the identity is lost or the eviction policy is unsafe.

        :raises StoreUnavailable: naming the policy when it is not ``noeviction``.
        """
        self._guard_identity()
        now = time.monotonic()
        if now - self._policy_at >= self.policy_check_s:
            with self._errors():
                policy = str(self.client.info("memory").get("maxmemory_policy", "noeviction"))
            self._policy_at = now
            if policy != "noeviction":
                if self._policy_bad != policy:
                    log.error(
                        "redis store %s: maxmemory-policy is %s: ledger records could be "
                        "evicted; refusing every decision until it is noeviction",
                        self.url_redacted,
                        policy,
                    )
                self._policy_bad = policy
            else:
                self._policy_bad = None
        if self._policy_bad is not None:
            raise StoreUnavailable(
                f"redis maxmemory-policy is {self._policy_bad}, not noeviction: it could "
                "evict committed records, so nothing is decided"
            )

    def _k(self, key: str) -> str:
        return self.prefix + key

    def transact(
        self,
        keys: Iterable[str],
        fn: TxnFn[T],
        *,
        absent_likely: bool = False,
        recent_likely: bool = False,
    ) -> T:
        self._guard()
        deadline = time.monotonic() + self.timeout_s
        declared = list(dict.fromkeys(keys))
        # What the next attempt starts from without reading: every declared
        # key absent, or as this process last saw it (a guess, when asked
        # for), or the values a failed compare-and-set returned (one
        # consistent snapshot).
        seed: dict[str, str | None] | None = None
        recall = None
        if absent_likely:
            seed = dict.fromkeys(declared)
        elif recent_likely and declared:
            seed = self._recent.recall(declared)
            recall = self._recent.get if seed is not None else None
        guessing = seed is not None
        conflicts = 0
        for _attempt in range(self.max_retries):
            if time.monotonic() >= deadline:
                raise redis.TimeoutError(f"no decision within {self.timeout_s} s")
            reads = _Reads(self, seed, guessing, recall)
            reads.load(declared)
            reads.check_identity()
            plan = _decide(fn, reads)
            if plan is None:  # not to be decided on a guess: read what is stored
                seed, guessing = None, False
                continue
            quiet = not (plan.writes or plan.index or plan.trims or plan.increments)
            if quiet and not guessing and reads.snapshots <= 1:
                return plan.committed()  # read at one instant: consistent as it is
            try:
                current = self._compare_and_set(reads.raw, plan, deadline)
                self._recent.after(reads.raw, plan, current, self._serialized)
            except redis.TimeoutError:
                if time.monotonic() >= deadline:
                    raise  # one deadline per decision: no second wait stacks on it
                # The script may have run: if every write is in place, it did.
                if self._landed(plan):
                    self._wait_for_replicas(deadline)
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
            if seed.get(META_ID) != self.identity:
                self._verify_identity(seed.get(META_ID))
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
        raise StoreUnavailable(
            f"redis store: gave up after {self.max_retries} concurrent changes to the same keys"
        )

    def _wait_for_replicas(self, deadline: float) -> None:
        """``WAIT`` for ``wait_replicas`` acknowledgements (a separate round trip).

        :raises redis.ResponseError: too few replicas took the write in time.
        """
        if self.wait_replicas <= 0:
            return
        acked = int(self.client.wait(self.wait_replicas, self._wait_ms(deadline)))
        self._check_acked(acked)

    def _wait_ms(self, deadline: float) -> int:
        return max(1, int((deadline - time.monotonic()) * 1000) - 100)

    def _check_acked(self, acked: int) -> None:
        if acked < self.wait_replicas:
            raise redis.ResponseError(
                f"WAIT: {acked} of {self.wait_replicas} replica(s) acknowledged the write"
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
        self, raw: dict[str, str | None], plan: Plan[Any], deadline: float
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
        script_keys = [self._k(k) for k in [*doc_keys, *index_keys, *incr_keys]]
        script_args: list[Any] = [
            len(doc_keys),
            *[raw[k] or "" for k in doc_keys],
            json.dumps(
                {"w": writes, "x": index_ops, "t": trims, "i": increments},
                separators=(",", ":"),
            ),
            *values,
        ]
        if self.wait_replicas > 0:
            result = self._cas_and_wait(script_keys, script_args, deadline)
        else:
            result = self._cas(keys=script_keys, args=script_args)
        if result == 1:
            return None
        now = cast(list[str | None], result)[1:]
        return dict(zip(doc_keys, now, strict=True))

    def _cas_and_wait(self, keys: list[str], args: list[Any], deadline: float) -> Any:
        """The script and ``WAIT`` in one round trip (a pipeline).

        A script that wrote nothing (a conflict) makes the ``WAIT`` moot.
        """
        for _ in range(2):
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(self._cas.sha, len(keys), *keys, *args)
            pipe.wait(self.wait_replicas, self._wait_ms(deadline))
            result, acked = pipe.execute(raise_on_error=False)
            if isinstance(result, redis.exceptions.NoScriptError):
                self.client.script_load(_CAS)  # the script never ran: load it, send again
                continue
            if isinstance(result, Exception):
                raise result
            if result == 1:
                if isinstance(acked, Exception):
                    raise acked
                self._check_acked(int(acked))
            return result
        raise redis.ResponseError("the compare-and-set script could not be loaded")

    def get_many(self, keys: Sequence[str]) -> dict[str, Doc | None]:
        self._guard()
        unique = list(dict.fromkeys(keys))
        if not unique:
            return {}
        values = self.client.mget([self._k(k) for k in [*unique, META_ID]])
        self._verify_identity(cast(str | None, values[-1]))
        pairs = zip(unique, values[:-1], strict=True)
        return {k: None if v is None else decode_doc(k, v) for k, v in pairs}

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
        self._guard()
        out: list[tuple[str, float]] = []
        offset = 0
        batch = max(limit, 50)
        while len(out) < limit:
            metrics.STORE_ROUND_TRIPS.inc()
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
        return out

    def index_count(
        self, index: str, *, min_score: float = float("-inf"), max_score: float = float("inf")
    ) -> int:
        lo = "-inf" if math.isinf(min_score) else repr(min_score)
        hi = "+inf" if math.isinf(max_score) else repr(max_score)
        self._guard()
        metrics.STORE_ROUND_TRIPS.inc()
        return int(self.client.zcount(self._k(index), lo, hi))

    def ping(self) -> dict[str, Any]:
        """Probe a write, the identity, the eviction policy and persistence."""
        self._policy_at = -math.inf  # readiness always looks afresh
        self._guard()
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self._k("ready_probe"), repr(time.time()))
        pipe.get(self._k(META_ID))
        pipe.info("persistence")
        _, found, info = pipe.execute()
        try:
            save = self.client.config_get("save").get("save", "")
        except redis.ResponseError:  # CONFIG disabled (managed Redis)
            save = None
        self._verify_identity(found)
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
            "aof_enabled": aof,
            "rdb_enabled": rdb,
            "wait_replicas": self.wait_replicas,
            "warnings": warnings,
        }

    def _read_meta(self, name: str) -> str | None:
        value = self.client.get(self._k(name))
        return None if value is None else str(value)

    def _write_meta(self, name: str, value: str, *, only_if_absent: bool = False) -> str:
        if only_if_absent:
            pipe = self.client.pipeline(transaction=True)
            pipe.set(self._k(name), value, nx=True)
            pipe.get(self._k(name))
            stored = pipe.execute()[1]
        else:
            self.client.set(self._k(name), value)
            stored = value
        if self.wait_replicas > 0:
            self.client.wait(self.wait_replicas, int(self.timeout_s * 1000))
        return str(stored)

    def ensure_schema(self, *args: Any, **kwargs: Any) -> int:
        """As :meth:`Store.ensure_schema`; also reads the eviction policy first."""
        self._policy_at = -math.inf
        try:
            self._guard()
        except StoreUnavailable:
            if self._policy_bad is None:
                raise  # not reachable: the server cannot start on it
        return super().ensure_schema(*args, **kwargs)

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
        (or, with ``recall``, as recalled) too, never read; the
        compare-and-set checks every one of them.
    :param recall: the guess for a key first read inside the function.
    """

    def __init__(
        self,
        store: RedisStore,
        seed: dict[str, str | None] | None,
        guessing: bool,
        recall: Callable[[str], str | None] | None = None,
    ) -> None:
        self.store = store
        self.guessing = guessing
        self.recall = recall
        self.raw: dict[str, str | None] = {}
        self.docs: dict[str, Doc | None] = {}
        self.snapshots = 0
        # The identity is compared like a document: read with the first
        # MGET, or (on a guess) taken as the one seen, which the
        # compare-and-set then checks.
        self._identity_pending = store.identity is not None and seed is None
        if seed is not None:
            self.snapshots = 0 if guessing else 1
            self._keep(list(seed), list(seed.values()))
            if store.identity is not None and META_ID not in self.raw:
                self.raw[META_ID] = store.identity

    def check_identity(self) -> None:
        """Refuse a store whose identity is not the one seen (read with the documents)."""
        if self.store.identity is not None and self.raw.get(META_ID) != self.store.identity:
            self.store._verify_identity(self.raw.get(META_ID))

    def _keep(self, keys: list[str], values: list[str | None]) -> None:
        for k, v in zip(keys, values, strict=True):
            self.raw[k] = v
            if k != META_ID:
                self.docs[k] = None if v is None else decode_doc(k, v)

    def load(self, keys: list[str]) -> None:
        fresh = [k for k in keys if k not in self.raw]
        if self._identity_pending:
            self._identity_pending = False
            fresh.append(META_ID)
        if not fresh:
            return
        if self.guessing:
            recall = self.recall
            self._keep(fresh, [None if recall is None else recall(k) for k in fresh])
            return
        self.snapshots += 1
        metrics.STORE_ROUND_TRIPS.inc()
        values = cast(list[str | None], self.store.client.mget([self.store._k(k) for k in fresh]))
        self._keep(fresh, values)
        self.store._recent.remember(zip(fresh, values, strict=True))


class _Recent:
    """What this process last read or wrote under each key (raw text, None:
    absent), for ``recent_likely`` guesses: at most :data:`RECENT_KEYS` keys
    and :data:`RECENT_CHARS` characters of documents, the least recently
    used forgotten first. A value here is only ever a guess: the
    compare-and-set checks it."""

    def __init__(self) -> None:
        self._values: OrderedDict[str, str | None] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        """The value last seen under ``key`` (None: absent or not known)."""
        with self._lock:
            return self._values.get(key)

    def recall(self, keys: list[str]) -> dict[str, str | None] | None:
        """The values last seen under every key of ``keys``; None unless all are known."""
        with self._lock:
            if not all(k in self._values for k in keys):
                return None
            for k in keys:
                self._values.move_to_end(k)
            return {k: self._values[k] for k in keys}

    def remember(self, pairs: Iterable[tuple[str, str | None]]) -> None:
        with self._lock:
            for key, value in pairs:
                if key == META_ID:
                    continue
                old = self._values.pop(key, None)
                self._chars -= len(old or "")
                if value is not None and len(value) > RECENT_CHARS // 16:
                    continue  # too large to keep: read it again next time
                self._values[key] = value
                self._chars += len(value or "")
            while len(self._values) > RECENT_KEYS or self._chars > RECENT_CHARS:
                _, dropped = self._values.popitem(last=False)
                self._chars -= len(dropped or "")

    def forget(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                self._chars -= len(self._values.pop(key, None) or "")

    def after(
        self,
        raw: dict[str, str | None],
        plan: Plan[Any],
        current: dict[str, str | None] | None,
        serialized: Callable[[Plan[Any]], dict[str, str | None]],
    ) -> None:
        """Keep what a compare-and-set left: the plan's documents when it
        applied (and the compared ones as read), else the values it answered."""
        self.forget([*plan.increments, *plan.unchecked])
        if current is not None:
            self.remember(current.items())
            return
        written = serialized(plan)
        compared = ((k, v) for k, v in raw.items() if k not in written and k not in plan.unchecked)
        self.remember([*compared, *written.items()])


#: Keys and characters of documents :class:`_Recent` keeps per store object.
RECENT_KEYS = 4096
RECENT_CHARS = 16_000_000


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, int, str | None]:
    """``redis+sentinel://[:pw@]h:p[,h:p]/<service>/<db>`` -> (hosts, service, db, password).

    :raises ValueError: a missing host, port, service or a bad db number.
    """
    rest = url.split("://", 1)[1]
    netloc, _, path = rest.partition("/")
    password = None
    if "@" in netloc:
        auth, netloc = netloc.rsplit("@", 1)
        password = auth.partition(":")[2] or None
    hosts: list[tuple[str, int]] = []
    for part in netloc.split(","):
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"sentinel address {part!r} is not host:port")
        hosts.append((host.strip("[]"), int(port)))
    service, _, db = path.strip("/").partition("/")
    if not service:
        raise ValueError("the URL names no service (redis+sentinel://host:port/<service>/<db>)")
    if db and not db.isdigit():
        raise ValueError(f"db {db!r} is not a number")
    return hosts, service, int(db or 0), password

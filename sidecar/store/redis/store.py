"""The Redis store: its transactions (read, decide, compare-and-set), reads,
listings, readiness and meta entries (the package's docstring tells how)."""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn, cast

import redis

from sidecar.errors import StoreUnavailable
from sidecar.store.base import (
    META_ID,
    Doc,
    Plan,
    ServerClock,
    Store,
    StoreEvents,
    StoreOptions,
    T,
    TxnFn,
    decode_doc,
)
from sidecar.store.recent import RecentValues
from sidecar.store.redis import connection
from sidecar.store.redis.attempt import Reads, decide
from sidecar.store.redis.connection import command
from sidecar.store.redis.script import CAS, FENCED, script_call, serialized

log = logging.getLogger("loopstop.store")


class _Fenced(Exception):
    """The compare-and-set ran past its fence and wrote nothing."""


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
    :param events: where round trips and conflicts are reported.
    :raises StoreUnavailable: never at construction (connections are lazy);
        from every method when Redis does not answer.
    """

    backend = "redis"
    driver_errors = (redis.RedisError,)
    schemes = ("redis", "rediss", "redis+sentinel")

    @classmethod
    def check_url(cls, url: str) -> None:
        connection.check_url(url)

    @classmethod
    def from_url(cls, url: str, options: StoreOptions) -> RedisStore:
        return cls(
            url,
            timeout_s=options.timeout_s,
            wait_replicas=options.wait_replicas,
            policy_check_s=options.policy_check_s,
            events=options.events,
        )

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "loopstop:",
        max_retries: int = 64,
        timeout_s: float = 2.0,
        wait_replicas: int = 0,
        policy_check_s: float = 5.0,
        events: StoreEvents | None = None,
    ) -> None:
        reached = connection.connect(url, timeout_s)
        self.client = reached.client
        self.sentinel = reached.sentinel
        self.url_redacted = reached.url_redacted
        self.socket_timeout_s = reached.socket_timeout_s
        self.prefix = prefix
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.wait_replicas = wait_replicas
        self.policy_check_s = policy_check_s
        #: The server's clock against this one: fences are given in server time.
        self.server_clock = ServerClock(policy_check_s)
        self._policy_at = -math.inf
        self._policy_bad: str | None = None
        self.events = events or StoreEvents()
        self._cas = self.client.register_script(CAS)
        #: What this process last read or wrote per key (``recent_likely`` guesses).
        self.recent = RecentValues()

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
        if now - self._policy_at >= self.policy_check_s or self.server_clock.due():
            with self._errors():
                pipe = self.client.pipeline(transaction=False)
                pipe.info("memory")
                pipe.time()
                sent = time.time()
                memory, (seconds, micros) = pipe.execute()
                answered = time.time()
            policy = str(memory.get("maxmemory_policy", "noeviction"))
            self._policy_at = now
            self.server_clock.read(seconds + micros / 1e6, sent, answered)
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

    def key(self, key: str) -> str:
        """The Redis key of a logical key (the prefix added)."""
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
        if absent_likely and recent_likely:
            seed = self.recent.guess(declared)
            recall = self.recent.get
        elif absent_likely:
            seed = dict.fromkeys(declared)
        elif recent_likely and declared:
            seed = self.recent.recall(declared)
            recall = self.recent.get if seed is not None else None
        guessing = seed is not None
        conflicts = 0
        for _attempt in range(self.max_retries):
            if time.monotonic() >= deadline:
                raise redis.TimeoutError(f"no decision within {self.timeout_s} s")
            reads = Reads(self, seed, guessing, recall)
            reads.load(declared)
            reads.check_identity()
            plan = decide(fn, reads)
            if plan is None:  # not to be decided on a guess: read what is stored
                seed, guessing = None, False
                continue
            quiet = not (plan.writes or plan.index or plan.trims or plan.increments)
            if quiet and not guessing and reads.snapshots <= 1:
                return plan.committed()  # read at one instant: consistent as it is
            try:
                current, texts = self._compare_and_set(reads.raw, plan, deadline, guessing)
                self.recent.after(reads.raw, plan, current, texts)
            except _Fenced:
                # Nothing written: the store ran the script past its fence (it
                # stalled, or the clocks moved). Compare them again, then read
                # afresh and decide once more while time is left.
                self.server_clock.stale()
                if time.monotonic() >= deadline:
                    raise redis.TimeoutError(f"no decision within {self.timeout_s} s") from None
                self._guard()
                seed, guessing = None, False
                continue
            except redis.TimeoutError:
                self.server_clock.stale()  # a stall: compare the clocks again next time
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
            self.events.conflict()
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

    def _landed(self, plan: Plan[Any]) -> bool:
        """True when every document the plan writes holds exactly the planned value.

        Planned documents carry the decision's own timestamps and ids, so an
        exact match means this transaction's script ran. Any doubt answers False.
        """
        planned = serialized(plan)
        if not planned:
            return False
        try:
            now = self.client.mget([self.key(k) for k in planned])
        except redis.RedisError:
            return False
        return all(v == planned[k] for k, v in zip(planned, now, strict=True))

    def _compare_and_set(
        self, raw: dict[str, str | None], plan: Plan[Any], deadline: float, guessed: bool
    ) -> tuple[dict[str, str | None] | None, dict[str, str | None]]:
        """Run ``cas.lua``: None when the plan was applied; otherwise nothing
        was written and the answer is the current raw value of every compared
        document (those ``raw`` holds, less the plan's unchecked keys unless
        ``raw`` was ``guessed``: a guess is compared whole). Beside it, the
        text of every document the plan writes (encoded once)."""
        call = script_call(
            raw, plan, self.prefix, compare_unchecked=guessed, fence_ms=self._fence()
        )
        self.events.round_trip()
        if self.wait_replicas > 0:
            result = self._cas_and_wait(call.keys, call.args, deadline)
        else:
            result = self._evalsha(call.keys, call.args)
        if result == 1:
            return None, call.texts
        if result == FENCED:
            raise _Fenced()
        now = cast(list[str | None], result)[1:]
        return dict(zip(call.doc_keys, now, strict=True)), call.texts

    def _fence(self) -> int | None:
        """The latest server time (epoch milliseconds) at which the
        compare-and-set about to be sent may still write: a margin
        (:func:`~sidecar.store.base.fence_margin`) before this process stops
        waiting for its answer (the socket timeout, counted from a moment
        after now). A store that
        pauses past it (a stall, a stopped process) and then runs the script
        writes nothing, so a decision answered 503 never lands later. None
        while the clocks were never compared (no fence)."""
        fence = self.server_clock.fence(self.socket_timeout_s)
        return None if fence is None else int(fence * 1000)

    def _evalsha(self, keys: list[bytes], args: list[bytes]) -> Any:
        """``EVALSHA`` of ``cas.lua`` as redis-py's ``Script`` sends it, less
        its per-call checks: on ``NOSCRIPT`` (a server that never loaded it,
        or flushed it) the script is loaded and sent again."""
        try:
            return command(self.client, "EVALSHA", self._cas.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            self._cas.sha = self.client.script_load(CAS)
            return command(self.client, "EVALSHA", self._cas.sha, len(keys), *keys, *args)

    def _cas_and_wait(self, keys: list[bytes], args: list[bytes], deadline: float) -> Any:
        """The script and ``WAIT`` in one round trip (a pipeline).

        A script that wrote nothing (a conflict) makes the ``WAIT`` moot.
        """
        for _ in range(2):
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(self._cas.sha, len(keys), *keys, *args)
            pipe.wait(self.wait_replicas, self._wait_ms(deadline))
            result, acked = pipe.execute(raise_on_error=False)
            if isinstance(result, redis.exceptions.NoScriptError):
                self.client.script_load(CAS)  # the script never ran: load it, send again
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
        values = command(self.client, "MGET", *[self.key(k) for k in [*unique, META_ID]])
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
            self.events.round_trip()
            rows = cast(
                list[tuple[str, float]],
                self.client.zrange(
                    self.key(index),
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
        self.events.round_trip()
        return int(self.client.zcount(self.key(index), lo, hi))

    def ping(self) -> dict[str, Any]:
        """Probe a write, the identity, the eviction policy and persistence."""
        self._policy_at = -math.inf  # readiness always looks afresh
        self._guard()
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.key("ready_probe"), repr(time.time()))
        pipe.get(self.key(META_ID))
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
        value = self.client.get(self.key(name))
        return None if value is None else str(value)

    def _write_meta(self, name: str, value: str, *, only_if_absent: bool = False) -> str:
        if only_if_absent:
            pipe = self.client.pipeline(transaction=True)
            pipe.set(self.key(name), value, nx=True)
            pipe.get(self.key(name))
            stored = pipe.execute()[1]
        else:
            self.client.set(self.key(name), value)
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

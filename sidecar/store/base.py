"""The store interface: an atomic read-modify-write of a few keyed documents.

A *document* is a JSON object stored under a string key, with an optional
time to live. A *transaction* reads some documents, hands them to a pure
function that returns a :class:`Plan` (the documents to write or delete and
the sorted-set index entries to add or remove), and applies the plan
atomically: either every write lands or none does, and no other
transaction changed what was read in between. Policy never lives here; the
function passed in decides. What a transaction reads and decides (the
snapshot, the plan and its parts, the stored JSON text) is in
:mod:`.plan`; this module re-exports it beside the interface.

Indexes are sorted sets of ``(score, member)`` used for bounded, paginated
listings (the reconciliation queue). TTLs are retention only: the policy
core checks every time limit itself against documents' own timestamps, so
an expiry that is late by a sweep interval changes no decision.

Method set (stated once, implemented by :mod:`.sqlite`, :mod:`.redis` and
:mod:`.postgres`): ``transact``, ``get_many``, ``index_page``,
``index_count``, ``ping``, ``ensure_schema``, ``close``; each backend also
opens itself from a URL (:meth:`Store.from_url`, chosen by scheme in
:mod:`sidecar.store`). A backend that deletes expired rows on demand is
:class:`Sweepable`, one whose file can shrink :class:`Compactable`
(``loopstop purge [--vacuum]``). A store reports its round trips and
conflicts to the callbacks it is built with (:class:`StoreEvents`); it
imports no metrics.

Every store carries an *identity*: a random id written once, when the store
is initialised, beside the schema version. A store object that has seen it
checks it on every transaction (inside the same round trip); a store found
without it or with another one (a Redis restarted empty, a database
swapped) is refused (503, not ready) until an operator accepts it with
``loopstop accept-store``: an emptied ledger would let every committed
write run again.
"""

from __future__ import annotations

import abc
import functools
import inspect
import logging
import math
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn, Protocol, runtime_checkable
from urllib.parse import parse_qs, urlparse

from sidecar.errors import ConfigError, SchemaMismatch, StoreUnavailable
from sidecar.store.plan import (
    Bound,
    Doc,
    Increment,
    IndexEntry,
    Plan,
    Snapshot,
    T,
    TxnFn,
    Write,
    decode_doc,
    encode_doc,
)

__all__ = [
    "CLOCK_CHECK_S",
    "CLOCK_RETRY_S",
    "FENCE_MARGIN_S",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Bound",
    "Compactable",
    "Doc",
    "Increment",
    "IndexEntry",
    "Migration",
    "Plan",
    "ServerClock",
    "Snapshot",
    "Store",
    "StoreEvents",
    "StoreOptions",
    "Sweepable",
    "T",
    "TxnFn",
    "Write",
    "check_parameters",
    "clock_offset",
    "decode_doc",
    "encode_doc",
    "fence_margin",
]

log = logging.getLogger("loopstop.store")

#: The layout version this code reads and writes. Bump it with a migration.
SCHEMA_VERSION = 1

#: Seconds kept, at most, between a write's fence (the latest time on the
#: store server's clock it may still apply at) and the moment its caller
#: stops waiting for the answer: an answer sent just before the fence still
#: arrives in time.
FENCE_MARGIN_S = 0.1
#: Seconds between two comparisons of a store server's clock with this host's.
CLOCK_CHECK_S = 5.0
#: Seconds before a comparison whose reading was too loose is made again.
CLOCK_RETRY_S = 0.5


def fence_margin(wait_s: float) -> float:
    """Seconds between a write's fence and the end of a wait of ``wait_s``
    seconds for its answer: :data:`FENCE_MARGIN_S`, or a quarter of a shorter wait."""
    return min(FENCE_MARGIN_S, wait_s / 4)


def clock_offset(server_s: float, sent_s: float, answered_s: float) -> float | None:
    """The store server's clock minus this host's (seconds), from the server's
    reading ``server_s`` and the local times the question left (``sent_s``)
    and its answer was seen (``answered_s``). The server read its clock before
    the answer was seen, so the offset is never overstated and a fence built
    on it falls early, never late. None when the two local times lie more
    than :data:`FENCE_MARGIN_S` apart (a stall, or this thread waiting for the
    interpreter): so loose a reading would set fences needlessly early."""
    if answered_s - sent_s > FENCE_MARGIN_S:
        return None
    return server_s - answered_s


class ServerClock:
    """A store server's clock compared with this host's, for fences
    (:func:`clock_offset`): compared again every ``every_s`` seconds, after
    :data:`CLOCK_RETRY_S` when a reading was too loose, and at the next
    chance once :meth:`stale` (a stall, a fenced write).

    :ivar offset_s: the server's clock minus this host's (None: never compared).
    """

    def __init__(self, every_s: float = CLOCK_CHECK_S) -> None:
        self.every_s = every_s
        self.offset_s: float | None = None
        self._due_at = -math.inf

    def due(self) -> bool:
        """Whether the clocks should be compared before the next write."""
        return time.monotonic() >= self._due_at

    def stale(self) -> None:
        """Compare the clocks at the next chance."""
        self._due_at = -math.inf

    def read(self, server_s: float, sent_s: float, answered_s: float) -> None:
        """Take a comparison (:func:`clock_offset`'s arguments); a loose one
        keeps the last offset and is made again soon."""
        offset = clock_offset(server_s, sent_s, answered_s)
        if offset is None:
            self._due_at = time.monotonic() + CLOCK_RETRY_S
        else:
            self.offset_s = offset
            self._due_at = time.monotonic() + self.every_s

    def fence(self, wait_s: float) -> float | None:
        """The latest server time (epoch seconds) at which a write sent now may
        still apply, when its caller waits ``wait_s`` seconds more for the
        answer: :func:`fence_margin` before that. None while never compared."""
        if self.offset_s is None:
            return None
        return time.time() + self.offset_s + wait_s - fence_margin(wait_s)


#: Meta entries every store keeps beside its documents.
META_SCHEMA = "schema_version"
META_ID = "store_id"
#: The store id an operator accepted with ``loopstop accept-store``.
META_ACCEPTED = "store_accepted"

#: ``{from_version: migrate(store)}``: each step brings a store one version up.
Migration = Callable[["Store"], None]
MIGRATIONS: dict[int, Migration] = {}


def _nothing() -> None:
    """No one listens."""


@dataclass(frozen=True)
class StoreEvents:
    """What a store reports while it works, to callbacks its builder gives (the
    app's metrics, a test's tally); each does nothing unless given.

    :ivar round_trip: called once per request sent to a networked store (Redis,
        PostgreSQL), a compare-and-set that lost included.
    :ivar conflict: called once per compare-and-set that found a document
        changed since it was read (the transaction then re-runs on the current
        documents).
    """

    round_trip: Callable[[], None] = _nothing
    conflict: Callable[[], None] = _nothing


@dataclass(frozen=True)
class StoreOptions:
    """What the configuration says about a store besides its URL; each backend
    reads what applies to it.

    :ivar timeout_s: the deadline of one call (a decision), seconds (Redis and
        PostgreSQL; SQLite waits its URL's ``busy_timeout_s`` for the lock).
    :ivar wait_replicas: Redis replicas that must acknowledge each write.
    :ivar policy_check_s: seconds between checks of Redis's eviction policy.
    :ivar events: where the store reports round trips and conflicts.
    """

    timeout_s: float = 2.0
    wait_replicas: int = 0
    policy_check_s: float = 5.0
    events: StoreEvents = field(default_factory=StoreEvents)


@runtime_checkable
class Sweepable(Protocol):
    """A store that keeps expired rows until they are deleted (SQLite,
    PostgreSQL); Redis expires keys by itself and is not one."""

    def sweep(self, limit: int = ...) -> int:
        """Delete up to ``limit`` expired documents now; returns how many went."""
        ...


@runtime_checkable
class Compactable(Protocol):
    """A store whose file can give the pages a sweep freed back to the disk (SQLite)."""

    def vacuum(self) -> None:
        """Rebuild the file now (blocks writers meanwhile)."""
        ...


def check_parameters(
    url: str, allowed: Iterable[str] | None, numeric: Iterable[str] | None = None
) -> dict[str, list[str]]:
    """The query parameters of a store URL, checked: each one ``allowed`` (None:
    any) and each of ``numeric`` (None: every one) a positive number.

    :returns: the parsed query (``parse_qs``).
    :raises ConfigError: an unknown parameter or one that is not a positive number.
    """
    parsed = urlparse(url)
    query = parse_qs(parsed.query)
    unknown = set() if allowed is None else set(query) - set(allowed)
    if unknown:
        raise ConfigError([("store", f"unknown {parsed.scheme} parameter(s): {sorted(unknown)}")])
    for name in query if numeric is None else set(numeric) & set(query):
        try:
            if float(query[name][-1]) <= 0:
                raise ValueError
        except ValueError:
            raise ConfigError([("store", f"{name} must be a positive number")]) from None
    return query


#: Methods of a backend that meet the driver (every public one, and the meta
#: hooks): :meth:`Store.__init_subclass__` wraps each so that a driver error
#: leaves it as :class:`StoreUnavailable`.
_PRIVATE_WRAPPED = frozenset({"_read_meta", "_write_meta"})


def _wrap_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except self.driver_errors as exc:
            self._unavailable(exc)

    wrapper.__wraps_errors__ = True  # type: ignore[attr-defined]
    return wrapper


class Store(abc.ABC):
    """One small interface over SQLite, Redis and PostgreSQL.

    Every method raises :class:`sidecar.errors.StoreUnavailable` when the
    backend cannot be reached or cannot commit; nothing else escapes from a
    driver. The translation is made once, here: a backend names its driver's
    exceptions in :attr:`driver_errors` and every public method it defines
    (and ``_read_meta`` / ``_write_meta``) is wrapped when the class is made
    (:meth:`__init_subclass__`, as the ``limits`` library wraps its storages).
    Exceptions raised by a transaction function abort the transaction
    (nothing is written) and propagate unchanged.

    Optimisation modes, which never change a result:

    - ``absent_likely`` (:meth:`transact`): decide on "every declared key is
      absent" without reading, and let the atomic compare check that guess
      (a first ``begin`` of an id). Redis saves its read round trip, and
      PostgreSQL its read pipeline (a replay is answered from the read that
      pipeline made first); SQLite reads in the same transaction anyway and
      ignores it.
    - ``recent_likely`` (:meth:`transact`): the same, on the values this
      process last read or wrote for the keys (Redis and PostgreSQL keep a
      bounded map of them); a commit after its begin, a result after its
      call. A guess is compared whole, the keys a plan leaves unchecked
      included, except those a :class:`Bound` of the plan covers: those are
      checked against it. Both hints together: the values last seen where
      this process knows them, absent elsewhere (a trigger's activation: a
      new event, and counters other decisions move).
    - :attr:`Plan.increments`: counters that many decisions share (a
      workflow's rate) are added at commit and never compared, so
      concurrent decisions do not conflict on them.
    - :attr:`Plan.unchecked`: keys read but left out of the compare (a
      decision tolerates them having changed); never written.
    - Keys declared up front are read in one round trip; a key first read
      inside the function costs one more (:class:`Snapshot`).
    - A transaction whose plan writes nothing commits nothing: Redis answers
      after its read, without the compare-and-set.
    """

    backend: str = "abstract"
    #: The driver's exceptions that mean "the store cannot answer".
    driver_errors: tuple[type[BaseException], ...] = ()
    #: The URL schemes this backend opens (:data:`sidecar.store.SCHEMES` maps
    #: each of them to this class).
    schemes: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def check_url(cls, url: str) -> None:
        """Validate a URL of this backend without opening anything.

        :raises ConfigError: a malformed URL or an unknown or bad parameter.
        """
        check_parameters(url, ())

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: str, options: StoreOptions) -> Store:
        """Open the store ``url`` names (:meth:`check_url` has accepted it).

        :raises StoreUnavailable: when a store that opens eagerly cannot be opened.
        """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, member in list(vars(cls).items()):
            wrapped = not name.startswith("_") or name in _PRIVATE_WRAPPED
            if wrapped and inspect.isfunction(member) and not hasattr(member, "__wraps_errors__"):
                setattr(cls, name, _wrap_errors(member))

    def _unavailable(self, exc: BaseException) -> NoReturn:
        """Log ``exc`` for the operator and raise the 503 that names neither
        the store's address nor the driver's words (the log has both)."""
        log.warning("%s store %s: %s: %s", self.backend, self._where(), type(exc).__name__, exc)
        raise StoreUnavailable(f"{self.backend} store unavailable ({type(exc).__name__})") from exc

    def _where(self) -> str:
        """The store's address for the operator log (no password)."""
        return ""

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Driver errors become :class:`StoreUnavailable` inside a narrower
        scope than a method (where a caller within the store must see the 503)."""
        try:
            yield
        except self.driver_errors as exc:
            self._unavailable(exc)

    @abc.abstractmethod
    def transact(
        self,
        keys: Iterable[str],
        fn: TxnFn[T],
        *,
        absent_likely: bool = False,
        recent_likely: bool = False,
    ) -> T:
        """Read ``keys``, call ``fn(snapshot)``, apply its plan atomically.

        ``fn`` may be called more than once (Redis retries on a concurrent
        change), so it must be pure.

        ``absent_likely`` is a hint that the keys probably do not exist yet
        (a new id). A store may then call ``fn`` on a snapshot where they are
        absent and let its atomic compare check that guess, saving a read;
        a wrong guess is detected and ``fn`` runs again on what is stored, so
        the hint never changes a result (an exception ``fn`` raises on a
        guess is dropped the same way).

        ``recent_likely`` is a hint that the keys probably still hold what
        this process last read or wrote there (a commit after its begin, a
        tool call's result after its admission). A store may then decide on
        those values without reading and let its compare check them, with
        the same guarantees as ``absent_likely``. Given both, a key this
        process knows is guessed as last seen, any other as absent.

        :returns: ``plan.result``.
        :raises StoreUnavailable: on a driver error or persistent contention.
        """

    @abc.abstractmethod
    def get_many(self, keys: Sequence[str]) -> dict[str, Doc | None]:
        """Read documents outside any transaction (a consistent read per key)."""

    def get(self, key: str) -> Doc | None:
        """Read one document outside any transaction."""
        return self.get_many([key])[key]

    @abc.abstractmethod
    def index_page(
        self,
        index: str,
        *,
        min_score: float = float("-inf"),
        max_score: float = float("inf"),
        after: tuple[float, str] | None = None,
        limit: int = 50,
    ) -> list[tuple[str, float]]:
        """Members of ``index`` ordered by ``(score, member)``, a page at a time.

        :param after: the last ``(score, member)`` of the previous page.
        :returns: up to ``limit`` ``(member, score)`` pairs with
            ``min_score <= score <= max_score``, strictly after ``after``.
        """

    @abc.abstractmethod
    def index_count(
        self, index: str, *, min_score: float = float("-inf"), max_score: float = float("inf")
    ) -> int:
        """How many members of ``index`` have ``min_score <= score <= max_score``."""

    @abc.abstractmethod
    def ping(self) -> dict[str, Any]:
        """Check the store answers; return facts for ``/readyz`` (``warnings`` list)."""

    @abc.abstractmethod
    def _read_meta(self, name: str) -> str | None:
        """A meta entry (schema version, identity), None when absent."""

    @abc.abstractmethod
    def _write_meta(self, name: str, value: str, *, only_if_absent: bool = False) -> str:
        """Set a meta entry; with ``only_if_absent`` keep an existing one.

        :returns: the value stored afterwards (the existing one when kept).
        """

    def _read_schema_version(self) -> int | None:
        """The stored layout version, None for an empty store."""
        value = self._read_meta(META_SCHEMA)
        return None if value is None else int(value)

    def _write_schema_version(self, version: int) -> None:
        """Record the layout version."""
        self._write_meta(META_SCHEMA, str(version))

    # -- identity ----------------------------------------------------------

    #: The identity this object has seen (None before :meth:`ensure_schema`).
    identity: str | None = None
    #: Why the store is refused (its identity went missing or changed), or None.
    identity_lost: str | None = None

    def _identity_refused(self) -> StoreUnavailable:
        return StoreUnavailable(
            "the store lost its identity (emptied or replaced): refusing every "
            "decision until an operator runs `loopstop accept-store`"
        )

    def _guard_identity(self) -> None:
        """Raise while the store is refused; look again whether it was accepted.

        :raises StoreUnavailable: while refused.
        """
        if self.identity_lost is None:
            return
        found, accepted = self._read_meta(META_ID), self._read_meta(META_ACCEPTED)
        if found is not None and accepted == found:
            log.warning("store %s accepted by an operator: serving again", found)
            self.identity, self.identity_lost = found, None
            return
        raise self._identity_refused()

    def _verify_identity(self, found: str | None) -> None:
        """Compare the identity read inside a transaction with the one seen.

        A different identity that an operator accepted is adopted; anything
        else refuses the store (and every later call) until accepted.

        :raises StoreUnavailable: when the store is not the one seen.
        """
        if self.identity is None or found == self.identity:
            return
        if found is not None and self._read_meta(META_ACCEPTED) == found:
            log.warning("store %s accepted by an operator: serving again", found)
            self.identity, self.identity_lost = found, None
            return
        self.identity_lost = "missing" if found is None else "changed"
        log.error(
            "store identity %s (seen %s): the store was emptied or replaced; every "
            "decision is refused until `loopstop accept-store`",
            self.identity_lost,
            self.identity,
        )
        raise self._identity_refused()

    def accept(self) -> tuple[str | None, str]:
        """Accept the store as it is now (``loopstop accept-store``).

        Stamps an empty store (schema and a new identity) and records its
        identity as accepted, so running workers that refused it serve again.

        :returns: ``(identity before, identity accepted)``.
        """
        before = self._read_meta(META_ID)
        if self._read_schema_version() is None:
            self._write_schema_version(SCHEMA_VERSION)
        current = self._write_meta(META_ID, secrets.token_hex(16), only_if_absent=True)
        self._write_meta(META_ACCEPTED, current)
        return before, current

    def ensure_schema(
        self,
        current: int = SCHEMA_VERSION,
        migrations: Mapping[int, Migration] | None = None,
        *,
        expected_identity: str | None = None,
    ) -> int:
        """Bring the store to ``current``: stamp a new one, migrate an older one.

        Also reads the store's identity (writing one, once, into a store that
        has none). With ``expected_identity`` (the identity the serving
        master saw), a store that is empty or carries another identity is
        not stamped: it is refused until accepted.

        :returns: the version found before (``current`` for a new store).
        :raises SchemaMismatch: when the store is newer than this server (a
            rollback after an upgrade); the server refuses to start.
        :raises ConfigError: when no migration path exists from the stored version.
        """
        steps = MIGRATIONS if migrations is None else migrations
        found = self._read_schema_version()
        if expected_identity is not None:
            self.identity = expected_identity
            try:
                self._verify_identity(self._read_meta(META_ID))
            except StoreUnavailable:
                return current if found is None else found  # refused, left as it is
        if found is None:
            self._write_schema_version(current)
            self._adopt_identity()
            return current
        if found > current:
            raise SchemaMismatch(
                [
                    (
                        "store",
                        f"schema version {found} is newer than this server's {current}; "
                        "upgrade loopstop instead of running an older one",
                    )
                ]
            )
        version = found
        while version < current:
            step = steps.get(version)
            if step is None:
                raise SchemaMismatch(
                    [("store", f"no migration from schema version {version} to {version + 1}")]
                )
            step(self)
            version += 1
            self._write_schema_version(version)
        self._adopt_identity()
        return found

    def _adopt_identity(self) -> None:
        """Read the identity (writing one, once, when the store has none)."""
        self.identity = self._write_meta(META_ID, secrets.token_hex(16), only_if_absent=True)

    def close(self) -> None:  # noqa: B027 - optional for backends without resources
        """Release connections."""

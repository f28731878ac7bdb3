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
values and the compare-and-set checks them exactly, the keys the plan
leaves unchecked included (counters that increments change, such as a
workflow's task totals): a guess stands only on what the script compared.
When one of them moved, the script's answer is the read and the function
runs again on it, with those keys unchecked as usual.

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

Modules: :mod:`.store` (:class:`RedisStore`: transactions, reads, listings,
readiness), :mod:`.attempt` (what one attempt read or guessed),
:mod:`.script` (``cas.lua``'s keys and arguments), :mod:`.recent` (the map
of recent values), :mod:`.connection` (the client, Sentinel, the URL).
"""

from sidecar.store.recent import RECENT_CHARS, RECENT_KEYS
from sidecar.store.redis.connection import parse_sentinel_url
from sidecar.store.redis.script import MAX_TTL_MS
from sidecar.store.redis.store import RedisStore

__all__ = ["MAX_TTL_MS", "RECENT_CHARS", "RECENT_KEYS", "RedisStore", "parse_sentinel_url"]

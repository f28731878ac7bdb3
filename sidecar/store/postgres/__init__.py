"""PostgreSQL store: durable multi-instance, on the database n8n already runs.

Layout (schema version 1; every name starts with ``loopstop_`` so the
tables can sit in n8n's own database)::

    loopstop_kv   (key TEXT PRIMARY KEY, doc TEXT JSON, expires_at FLOAT8 epoch s | NULL)
    loopstop_idx  (name TEXT, member TEXT, score FLOAT8, PRIMARY KEY (name, member))
                  + index (name, score, member) for listings and the queue
    loopstop_meta (key TEXT PRIMARY KEY, value TEXT)  -- schema_version, store_id, ...
    loopstop_increment(doc, field, delta)             -- an increment, in SQL

Documents are stored as JSON *text* (the exact bytes :func:`encode_doc`
wrote: integers past 64 bits and lone surrogates come back unchanged, which
``jsonb`` would refuse or reorder).

One transaction per decision, a compare-and-set like the Redis store's:
the documents are read by one statement (no lock held while the policy
decides), then one pipeline sends ``BEGIN``, transaction-scoped advisory
locks on every compared key (``pg_advisory_xact_lock``, keyed by a hash of
the key, in sorted order: a lock exists whether or not its row does, so two
first ``begin`` of one id cannot both insert), ``loopstop_check`` (every
compared document still as read, and the store identity unchanged; else it
raises and nothing is written), the writes and ``COMMIT``. A changed
document means the function runs again on fresh reads (a jittered back-off
from the second conflict on), within the deadline. Increments are
``INSERT ... ON CONFLICT DO UPDATE`` applied to the row's value at commit
and never compared. Locks are held only while that one pipeline runs on the
server, never across the client's decision: a slow or descheduled worker
thread never holds others up. ``?isolation=serializable`` (reads and writes
in one ``SERIALIZABLE`` transaction, serialization failures retried) is kept
for comparison; ``bench/pg_strategy.py`` measures the two side by side
(docs/deployment.md has its figures, and those of a third design, locks
held across the decision, measured before it was replaced, and why this one
is the default).

Round trips: two per decision (the read; the commit pipeline), one more
for a key first read inside the function; a decision that writes nothing
after one read needs no commit. A transaction on keys that are probably
new (``absent_likely``: a first ``begin``) or that probably hold what this
store object last read or wrote (``recent_likely``: a commit after its
begin, a tool call on a task this worker saw last; the map of
:mod:`sidecar.store.recent`) decides on that guess and sends the commit
pipeline at once (:mod:`.pipeline`), every key read compared (unchecked
ones too) after one statement that reads them: one round trip; when a key
differed, the pipeline wrote nothing and the decision is made again on
that read (a replay, which writes nothing, is then answered in that trip).

Every call has one deadline (``timeout_s``): a statement, a lock wait and
the wait for a connection from the pool all end with it, and so does every
wait on the connection's socket, so a server that stopped answering is a
503 at the deadline, not a hang (:mod:`.connection` says how, with
psycopg's public means only). A connection lost before ``COMMIT`` was answered
admits nothing: the server rolls back what it did not commit, and the
caller gets a 503 whose retry sees the true state. Expired rows are
invisible to reads at once and deleted by ``loopstop purge`` and by a
bounded sweep every ``sweep_interval_s``.

Modules: :mod:`.store` (:class:`PostgresStore`: transactions, reads,
listings, readiness, schema, sweeps), :mod:`.sql` (the tables, functions
and statements), :mod:`.connection` (the URL, the pool, the deadlines).
"""

from sidecar.store.postgres.connection import IDLE_CHECK_S, PARAMS
from sidecar.store.postgres.sql import LOCK_CLASS, SCHEMA_LOCK
from sidecar.store.postgres.store import SWEEP_BATCH, PostgresStore

__all__ = ["IDLE_CHECK_S", "LOCK_CLASS", "PARAMS", "SCHEMA_LOCK", "SWEEP_BATCH", "PostgresStore"]

"""The PostgreSQL store's tables, functions and statements (schema version 1),
and the statements that apply a plan."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import psycopg

from sidecar.store.base import Plan, encode_doc

DDL = """
CREATE TABLE IF NOT EXISTS loopstop_kv (
    key TEXT PRIMARY KEY,
    doc TEXT NOT NULL,
    expires_at DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS loopstop_kv_expiry ON loopstop_kv (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS loopstop_idx (
    name TEXT NOT NULL,
    member TEXT NOT NULL,
    score DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (name, member)
);
CREATE INDEX IF NOT EXISTS loopstop_idx_order ON loopstop_idx (name, score, member);
CREATE OR REPLACE FUNCTION loopstop_increment(doc TEXT, field TEXT, delta BIGINT)
RETURNS TEXT LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE d JSONB := doc::jsonb;
BEGIN
    IF jsonb_typeof(d) <> 'object' THEN
        RAISE EXCEPTION 'increment target is not a JSON object' USING ERRCODE = '22023';
    END IF;
    RETURN jsonb_set(d, ARRAY[field], to_jsonb(COALESCE((d ->> field)::numeric, 0) + delta))::text;
END
$fn$;
CREATE OR REPLACE FUNCTION loopstop_check(
    keys TEXT[], expected TEXT[], now DOUBLE PRECISION, store_id TEXT
) RETURNS VOID LANGUAGE plpgsql AS $fn$
DECLARE changed INT;
BEGIN
    IF store_id IS NOT NULL AND store_id IS DISTINCT FROM
            (SELECT value FROM loopstop_meta WHERE key = 'store_id') THEN
        RAISE EXCEPTION 'the store identity changed' USING ERRCODE = 'LS409';
    END IF;
    SELECT count(*) INTO changed FROM unnest(keys, expected) AS e(key, doc)
        LEFT JOIN loopstop_kv kv
            ON kv.key = e.key AND (kv.expires_at IS NULL OR kv.expires_at > now)
        WHERE kv.doc IS DISTINCT FROM e.doc;
    IF changed > 0 THEN
        RAISE EXCEPTION '% document(s) changed since read', changed USING ERRCODE = 'LS409';
    END IF;
END
$fn$;
CREATE OR REPLACE FUNCTION loopstop_bound(
    keys TEXT[], weights DOUBLE PRECISION[], field TEXT, below DOUBLE PRECISION,
    at_least DOUBLE PRECISION, now DOUBLE PRECISION
) RETURNS VOID LANGUAGE plpgsql AS $fn$
DECLARE total DOUBLE PRECISION := 0;
DECLARE entry RECORD;
DECLARE d JSONB;
DECLARE count NUMERIC;
BEGIN
    FOR entry IN SELECT e.weight, kv.doc FROM unnest(keys, weights) AS e(key, weight)
            LEFT JOIN loopstop_kv kv
                ON kv.key = e.key AND (kv.expires_at IS NULL OR kv.expires_at > now) LOOP
        CONTINUE WHEN entry.doc IS NULL;
        BEGIN
            d := entry.doc::jsonb;
        EXCEPTION WHEN others THEN
            d := NULL;
        END;
        IF d IS NULL OR jsonb_typeof(d) <> 'object' THEN
            RAISE EXCEPTION 'a counter is not a JSON object' USING ERRCODE = 'LS409';
        END IF;
        count := 0;
        IF d ? field THEN
            IF jsonb_typeof(d -> field) <> 'number' THEN
                RAISE EXCEPTION 'a counter holds no count' USING ERRCODE = 'LS409';
            END IF;
            count := (d ->> field)::numeric;
            IF count < 0 OR count > 9007199254740992 OR count <> trunc(count) THEN
                RAISE EXCEPTION 'a counter holds no count' USING ERRCODE = 'LS409';
            END IF;
        END IF;
        total := total + entry.weight * count::double precision;
    END LOOP;
    IF (below IS NOT NULL AND total >= below) OR (at_least IS NOT NULL AND total < at_least) THEN
        RAISE EXCEPTION 'counters moved past a bound' USING ERRCODE = 'LS409';
    END IF;
END
$fn$;
CREATE OR REPLACE FUNCTION loopstop_fence(not_after DOUBLE PRECISION)
RETURNS VOID LANGUAGE plpgsql AS $fn$
BEGIN
    IF extract(epoch FROM clock_timestamp()) > not_after THEN
        RAISE EXCEPTION 'the transaction ran past its fence' USING ERRCODE = 'LS408';
    END IF;
END
$fn$;
"""
META_DDL = "CREATE TABLE IF NOT EXISTS loopstop_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"

#: The advisory lock class of every key lock (two-integer form: other
#: applications' single-bigint advisory locks never meet ours).
LOCK_CLASS = 0x4C53
#: The lock taken while the schema is created or migrated.
SCHEMA_LOCK = 0x4C530001

SELECT = (
    "SELECT key, doc FROM loopstop_kv WHERE key = ANY(%s) "
    "AND (expires_at IS NULL OR expires_at > %s)"
)
IDENTITY = "SELECT value FROM loopstop_meta WHERE key = %s"
LOCKS = (
    "SELECT count(CASE WHEN l.x THEN pg_advisory_xact_lock(%(c)s, l.k) "
    "ELSE pg_advisory_xact_lock_shared(%(c)s, l.k) END) FROM ("
    "SELECT k, true AS x FROM unnest(%(x)s::int4[]) AS k UNION ALL "
    "SELECT k, false FROM unnest(%(s)s::int4[]) AS k ORDER BY k) AS l"
)
CHECK = "SELECT loopstop_check(%s::text[], %s::text[], %s, %s)"
FENCE = "SELECT loopstop_fence(%s)"
CLOCK = "SELECT extract(epoch FROM clock_timestamp())::float8"
BOUND = "SELECT loopstop_bound(%s::text[], %s::float8[], %s, %s, %s, %s)"
PUT = (
    "INSERT INTO loopstop_kv (key, doc, expires_at) VALUES (%s, %s, %s) "
    "ON CONFLICT (key) DO UPDATE SET doc = EXCLUDED.doc, expires_at = EXCLUDED.expires_at"
)
DELETE = "DELETE FROM loopstop_kv WHERE key = %s"
INCREMENT = (
    "INSERT INTO loopstop_kv AS kv (key, doc, expires_at) VALUES (%s, %s, %s) "
    "ON CONFLICT (key) DO UPDATE SET doc = CASE "
    "WHEN kv.expires_at IS NOT NULL AND kv.expires_at <= %s THEN EXCLUDED.doc "
    "ELSE loopstop_increment(kv.doc, %s, %s) END, expires_at = EXCLUDED.expires_at"
)
TRIM = "DELETE FROM loopstop_idx WHERE name = %s AND score < %s"
UNINDEX = "DELETE FROM loopstop_idx WHERE name = %s AND member = %s"
INDEX = (
    "INSERT INTO loopstop_idx (name, member, score) VALUES (%s, %s, %s) "
    "ON CONFLICT (name, member) DO UPDATE SET score = EXCLUDED.score"
)
SWEEP = (
    "DELETE FROM loopstop_kv WHERE key IN (SELECT key FROM loopstop_kv "
    "WHERE expires_at IS NOT NULL AND expires_at <= %s LIMIT %s)"
)


def lock_id(key: str) -> int:
    """A signed 32-bit hash of ``key`` (a collision only serializes two keys)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big", signed=True)


def apply(
    conn: psycopg.Connection[Any],
    plan: Plan[Any],
    now: float,
    texts: Mapping[str, str | None] | None = None,
) -> None:
    """Send the plan's writes (the documents' ``texts`` when given, else
    encoded here), increments, trims and index changes (inside the caller's
    transaction or pipeline)."""
    cur = conn.cursor()
    puts = [
        (
            k,
            str(texts[k]) if texts else encode_doc(w.doc),
            None if w.ttl_s is None else now + w.ttl_s,
        )
        for k, w in plan.writes.items()
        if w.doc is not None
    ]
    deletes = [(k,) for k, w in plan.writes.items() if w.doc is None]
    if puts:
        cur.executemany(PUT, puts)
    if deletes:
        cur.executemany(DELETE, deletes)
    if plan.increments:
        cur.executemany(
            INCREMENT,
            [
                (
                    key,
                    encode_doc({inc.field: inc.delta}),
                    None if inc.ttl_s is None else now + inc.ttl_s,
                    now,
                    inc.field,
                    inc.delta,
                )
                for key, inc in plan.increments.items()
            ],
        )
    if plan.trims:
        cur.executemany(TRIM, plan.trims)
    removed = [(e.index, e.member) for e in plan.index if e.score is None]
    added = [(e.index, e.member, e.score) for e in plan.index if e.score is not None]
    if removed:
        cur.executemany(UNINDEX, removed)
    if added:
        cur.executemany(INDEX, added)

"""The activation gate's records and decisions (DESIGN §2): chains, effects,
links, the dedupe and rate windows, markers and the event's field prints.
What each one holds, and how it reads from and writes to its document."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from sidecar.core import executions as n8n_executions
from sidecar.core.executions import ExecutionMode
from sidecar.core.frozen import shallow_doc

#: How many recent activations a chain keeps for its timeline.
RECENT_ACTIVATIONS = 50


class ActivationDecision(StrEnum):
    PROCEED = "proceed"
    DROP = "drop"


class ActivationReason(StrEnum):
    """Why an activation proceeded or was dropped (the six rules, first match wins)."""

    STOPPED = "stopped"
    DUPLICATE_EVENT = "duplicate_event"
    ECHO = "echo"
    CHAIN_DEPTH = "chain_depth"
    CHAIN_BUDGET = "chain_budget"
    ACTIVATION_RATE = "activation_rate"
    WORKFLOW_RATE = "workflow_rate"
    REENTRY = "reentry"
    EXTERNAL_CHANGE = "external_change"
    NEW_CHAIN = "new_chain"


class EffectDecision(StrEnum):
    """What ``POST /v1/effects`` logs: the effect is registered (it never refuses)."""

    REGISTERED = "registered"


@dataclass(frozen=True)
class ChainLimits:
    """A workflow's chain policy; windows and TTL in seconds."""

    max_depth: int = 3
    max_activations: int = 20
    rate_limit: int = 10
    rate_window_s: float = 3600
    workflow_rate_limit: int = 10_000
    workflow_rate_window_s: float = 3600
    dedupe_window_s: float = 3600
    chain_ttl_s: float = 86_400


@dataclass(frozen=True)
class Chain:
    """One causal chain of activations across executions.

    :ivar depth: the deepest hop that proceeded (0 for the first activation).
    :ivar activations: activations that proceeded (the chain budget counts these).
    :ivar drops: activations of this chain that were dropped.
    :ivar effects: effects registered in this chain.
    :ivar expires_at: the chain ends then; a marker of an expired chain counts as none.
    :ivar recent: the last :data:`RECENT_ACTIVATIONS` activations,
        ``{activation_id, at, decision, reason, depth}``.
    :ivar executions: the n8n executions that acted for the chain (an
        activation that proceeded, an effect), the most recent
        :data:`~sidecar.core.executions.REMEMBERED`:
        ``{execution_id, execution_mode, workflow, at}``; a chain stop stops
        these (those n8n runs for that workflow and mode).
    """

    chain_id: str
    workflow: str
    depth: int
    activations: int
    drops: int
    effects: int
    created_at: float
    updated_at: float
    expires_at: float
    recent: tuple[dict[str, Any], ...] = ()
    executions: tuple[dict[str, Any], ...] = ()

    @classmethod
    def fresh(cls, chain_id: str, workflow: str, now: float, ttl_s: float) -> Chain:
        """A chain that starts now at depth 0 and lives ``ttl_s`` seconds."""
        return cls(
            chain_id=chain_id,
            workflow=workflow,
            depth=0,
            activations=0,
            drops=0,
            effects=0,
            created_at=now,
            updated_at=now,
            expires_at=now + ttl_s,
        )

    def alive(self, now: float) -> bool:
        return now < self.expires_at

    def to_doc(self) -> dict[str, Any]:
        """The stored document. Shallow: the entries of ``recent`` are shared."""
        doc = shallow_doc(self)
        doc["recent"] = list(self.recent)
        doc["executions"] = list(self.executions)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> Chain | None:
        if doc is None:
            return None
        return cls(
            **{
                **doc,
                "recent": tuple(doc.get("recent", ())),
                "executions": tuple(doc.get("executions", ())),
            }
        )

    def with_execution(
        self, execution_id: str | None, mode: ExecutionMode, now: float, workflow: str
    ) -> Chain:
        """The chain remembering that ``execution_id`` acted for it (bounded), for
        ``workflow`` (the request's: a chain stop checks n8n's ``workflowId`` against it)."""
        remembered = n8n_executions.remember(
            self.executions, execution_id, mode, now, workflow=workflow
        )
        return self if remembered is None else replace(self, executions=remembered)


@dataclass(frozen=True)
class Effect:
    """What an execution wrote, keyed by the identities it has when it comes back.

    :ivar fields: field name -> fingerprint of the written value (normalized
        unless ``strict``).
    """

    effect_id: str
    workflow: str
    chain_id: str
    depth: int
    fields: dict[str, str]
    strict: bool
    created_at: float
    expires_at: float

    def alive(self, now: float) -> bool:
        return now < self.expires_at

    def to_doc(self) -> dict[str, Any]:
        doc = shallow_doc(self)
        doc["fields"] = dict(self.fields)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> Effect | None:
        return None if doc is None else cls(**doc)


@dataclass(frozen=True)
class Link:
    """Where a target key leads: the chain (and depth) of the last effect that
    wrote it, whatever workflow that was. Stored beside each effect."""

    workflow: str
    chain_id: str
    depth: int
    expires_at: float

    def alive(self, now: float) -> bool:
        return now < self.expires_at


@dataclass(frozen=True)
class Seen:
    """The last content seen for one event identity of one workflow."""

    fingerprint: str
    at: float


@dataclass(frozen=True)
class RateLog:
    """Times (s) of recent proceeded activations of one subject, oldest first."""

    times: tuple[float, ...] = ()

    def in_window(self, now: float, window_s: float) -> tuple[float, ...]:
        return tuple(t for t in self.times if now - t < window_s)


@dataclass(frozen=True)
class RateCounter:
    """A sliding-window counter: this fixed window's count and the previous one's.

    The estimate weights the previous window by how much of it still
    overlaps the sliding window (the approach of Cloudflare's and nginx's
    rate limiters); it holds two numbers however busy the workflow is.
    """

    window_start: float = 0.0
    count: int = 0
    previous: int = 0

    def rolled(self, now: float, window_s: float) -> RateCounter:
        """The counter with its windows moved up to ``now``."""
        if now < self.window_start + window_s:
            return self
        windows = int((now - self.window_start) // window_s)
        start = self.window_start + windows * window_s if self.window_start else now
        return RateCounter(start, 0, self.count if windows == 1 else 0)

    def previous_weight(self, now: float, window_s: float) -> float:
        """How much of the previous window the sliding window ending at ``now``
        still overlaps (0 to 1): the previous count's weight in :meth:`estimate`."""
        cur = self.rolled(now, window_s)
        return max(0.0, 1 - (now - cur.window_start) / window_s)

    def estimate(self, now: float, window_s: float) -> float:
        """Activations in the sliding window ending at ``now``: the previous
        count weighted by :meth:`previous_weight`, plus this window's."""
        cur = self.rolled(now, window_s)
        return cur.previous * cur.previous_weight(now, window_s) + cur.count

    def bound(self, now: float, window_s: float, limit: float, *, under: bool) -> RateBound:
        """Where the counts must stand for a decision made on this counter's
        :meth:`estimate` to hold: below ``limit`` (``under``: it was admitted)
        or at least ``limit`` (refused for the rate)."""
        weight = self.previous_weight(now, window_s)
        return RateBound(weight, limit, None) if under else RateBound(weight, None, limit)

    def add(self, now: float, window_s: float) -> RateCounter:
        cur = self.rolled(now, window_s)
        return RateCounter(cur.window_start, cur.count + 1, cur.previous)


@dataclass(frozen=True)
class RateBound:
    """A condition on a workflow's rate counts that a decision stood on:
    ``previous * previous_weight + count`` (the estimate at the decision's
    time) below ``below`` and at least ``at_least`` (each when given). A store
    checks it at commit when the counts were guessed, not read."""

    previous_weight: float
    below: float | None = None
    at_least: float | None = None


@dataclass(frozen=True)
class Marker:
    """A verified marker: the chain and the depth of the hop that wrote it."""

    chain_id: str
    depth: int


@dataclass(frozen=True)
class FieldPrints:
    """Fingerprints of the event's content fields, both ways.

    :ivar normal: field -> fingerprint of :func:`normalize_scalar` (value).
    :ivar strict: field -> fingerprint of the value as is.
    :ivar missing_normal: the fingerprint an absent field has (normalized null).
    :ivar missing_strict: the same, strict.
    """

    normal: Mapping[str, str]
    strict: Mapping[str, str]
    missing_normal: str
    missing_strict: str

    def matches(self, effect: Effect) -> bool:
        """True when every field the effect wrote has the same value in the event."""
        prints, missing = (
            (self.strict, self.missing_strict)
            if effect.strict
            else (self.normal, self.missing_normal)
        )
        return all(prints.get(name, missing) == fp for name, fp in effect.fields.items())

"""The activation gate (DESIGN §2): breaking self-triggering chains, as pure functions.

A trigger fires; the flow asks whether this *activation* is its own write
coming back, a re-delivery, one more hop of a chain it started, or new
work. Decided in this order, first match wins:

1. the workflow or the chain the activation belongs to is stopped -> ``drop``, ``stopped``;
2. the same event identity with the same content was seen inside the dedupe
   window -> ``drop``, ``duplicate_event``;
3. an unexpired effect of this workflow targets the event's identity and
   every field it wrote equals the event's field -> ``drop``, ``echo``; if a
   field differs, someone else changed the record: a new chain starts (a
   marker still in that record is stale and ignored) and rule 5 decides,
   with reason ``external_change``;
4. a valid marker of a live chain, or a related key (or the event identity
   itself, written by another workflow) that an effect targets -> the
   chain continues at depth + 1: past ``max_depth`` -> ``chain_depth``,
   past the chain's activation budget -> ``chain_budget``; else, once the
   rates of rule 5 pass, ``proceed``, ``reentry``;
5. too many activations of the same subject inside ``rate_window_s`` ->
   ``activation_rate``; too many of the workflow inside
   ``workflow_rate_window_s`` -> ``workflow_rate`` (a circuit breaker for
   every activation about to proceed, re-entries included: a loop that
   restarts its chain at every hop still ends);
6. else ``proceed``, ``new_chain`` at depth 0.

Both rates count activations that proceeded; dropped ones consume nothing.
Echo matching compares only the effect's fields, after
:func:`normalize_scalar` unless the effect is ``strict``.

Times are epoch seconds; every function takes ``now`` and does no I/O.
Values arrive as fingerprints (HMACs computed by the service), never raw.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from sidecar.core import executions as n8n_executions
from sidecar.core.executions import ExecutionMode
from sidecar.core.stops import Stop as Stop  # re-exported: the chains' stop
from sidecar.core.stops import covering

#: How many recent activations a chain keeps for its timeline.
RECENT_ACTIVATIONS = 50

#: A numeric string as a sheet or a form writes a number: no sign but "-", no
#: leading zeros, no exponent, at most 15 significant digits (what a double
#: holds exactly). Phone numbers, zip codes and long ids stay text.
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?")
_MAX_DIGITS = 15


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


def normalize_scalar(value: Any) -> Any:
    """The form a value takes for echo matching (DESIGN §2, "Field equality").

    Google Sheets returns ``""`` for empty, ``0`` and ``false`` cells, a text
    cell returns ``"42"`` where the flow wrote ``42``, and a form sends every
    value as a string. So: numbers and plain decimal strings compare by
    value (``5`` == ``5.0`` == ``" 5 "``; not ``"+49..."``, ``"01234"``,
    ``"1e3"`` or more than 15 digits, which stay text), strings are
    trimmed, ``"true"`` is
    ``true``, and ``""``, ``null``, ``0``, ``false`` and ``"false"`` are
    all the same empty value. Objects and lists are compared as they are.
    Dates are not converted.
    """
    if value is None or value is False:
        return None
    if value is True:
        return True
    if isinstance(value, int | float):
        return None if value == 0 else float(value)
    if isinstance(value, str):
        text = value.strip()
        lowered = text.lower()
        if text == "" or lowered == "false":
            return None
        if lowered == "true":
            return True
        if _NUMBER.fullmatch(text) and sum(c.isdigit() for c in text) <= _MAX_DIGITS:
            number = float(text)
            if math.isfinite(number):
                return None if number == 0 else number
        return text
    return value


# -- content ---------------------------------------------------------------------


def content_of(content: Any, event: Any) -> Any:
    """The part of an activation that counts for dedupe and echo matching.

    ``content`` when given; else the ``event``, except that an n8n Webhook
    item (``{headers, params, query, body}``) counts by its ``body`` (a
    provider's redelivery repeats the body, not its transport headers; an
    empty body, as a GET has, counts by its query and path parameters), and
    a Google Sheets "Include Both Versions" item by its ``current`` row.
    """
    if content is not None:
        return content
    if isinstance(event, dict):
        if "headers" in event and "body" in event and ("query" in event or "params" in event):
            if event["body"] not in ({}, None, ""):
                return event["body"]
            # A GET (or an empty POST): what identifies it is its query and path.
            return {"query": event.get("query"), "params": event.get("params")}
        if "current" in event and "previous" in event:
            return event["current"]
        return event
    return {} if event is None else event


# -- state ----------------------------------------------------------------------


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
        ``{execution_id, execution_mode, at}``; a chain stop stops these.
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

    def alive(self, now: float) -> bool:
        return now < self.expires_at

    def to_doc(self) -> dict[str, Any]:
        """The stored document. Shallow: the entries of ``recent`` are shared."""
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
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

    def with_execution(self, execution_id: str | None, mode: ExecutionMode, now: float) -> Chain:
        """The chain remembering that ``execution_id`` acted for it (bounded)."""
        remembered = n8n_executions.remember(self.executions, execution_id, mode, now)
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
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
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


def takes_over(held: Link | None, held_in_scope: bool, now: float) -> bool:
    """Whether a new effect on a target takes the target's link over.

    A link is taken over unless it is live and of a workflow outside the
    registering token's scope (``held_in_scope`` False): a scoped token
    never redirects another workflow's chain.
    """
    return held is None or held_in_scope or not held.alive(now)


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

    def estimate(self, now: float, window_s: float) -> float:
        cur = self.rolled(now, window_s)
        overlap = 1 - (now - cur.window_start) / window_s
        return cur.previous * max(0.0, overlap) + cur.count

    def add(self, now: float, window_s: float) -> RateCounter:
        cur = self.rolled(now, window_s)
        return replace(cur, count=cur.count + 1)


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


@dataclass(frozen=True)
class ActivationRequest:
    """An activation as the core sees it (identities already fingerprinted).

    :ivar new_chain_id: the id a new chain gets (made by the caller: the
        core draws no randomness).
    :ivar has_subject: False when neither ``subject_key`` nor ``event_key``
        was given: then no per-subject rate applies.
    """

    workflow: str
    activation_id: str
    new_chain_id: str
    content_fp: str
    fields: FieldPrints
    markers: tuple[Marker, ...]
    has_subject: bool
    execution_id: str | None = None
    execution_mode: ExecutionMode = "production"


@dataclass(frozen=True)
class ActivationState:
    """Everything an activation decision reads, from one store transaction.

    :ivar own_effect: this workflow's effect targeting the event's identity.
    :ivar links: where the event's identity (when another workflow wrote it)
        and its related keys lead.
    :ivar chains: the chains the markers and links name (only those the
        caller may act in).
    :ivar chain_stops: stops of those chains.
    """

    workflow_stop: Stop | None = None
    seen: Seen | None = None
    own_effect: Effect | None = None
    links: tuple[Link, ...] = ()
    chains: Mapping[str, Chain] = field(default_factory=dict)
    chain_stops: Mapping[str, Stop] = field(default_factory=dict)
    subject_rate: RateLog | None = None
    workflow_rate: RateCounter | None = None


@dataclass(frozen=True)
class ActivationChanges:
    """What to store after the decision (None: leave as is)."""

    seen: Seen | None = None
    chain: Chain | None = None
    subject_rate: RateLog | None = None
    workflow_rate: RateCounter | None = None


@dataclass(frozen=True)
class ActivationOutcome:
    """The answer: decision, reason, the chain and depth, and the counts."""

    decision: ActivationDecision
    reason: ActivationReason
    chain_id: str | None
    depth: int | None
    chain_activations: int
    subject_activations_in_window: int


def _link(state: ActivationState, req: ActivationRequest, now: float) -> tuple[Chain, int] | None:
    """The live chain this activation continues, and the depth it continues from.

    Every valid marker and every link is a candidate (a quoted, expired
    marker never hides a live one); the deepest live one wins.
    """
    candidates: list[tuple[Chain, int]] = []
    for marker in req.markers:
        chain = state.chains.get(marker.chain_id)
        if chain is not None and chain.alive(now):
            candidates.append((chain, marker.depth))
    for link in state.links:
        chain = state.chains.get(link.chain_id)
        if link.alive(now) and chain is not None and chain.alive(now):
            candidates.append((chain, link.depth))
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c[1], c[0].chain_id))


def decide_activation(
    state: ActivationState, req: ActivationRequest, limits: ChainLimits, now: float
) -> tuple[ActivationChanges, ActivationOutcome]:
    """Decide one activation (rules 1-6 of the module docstring).

    :returns: the changes to store and the outcome.
    """
    own = state.own_effect if state.own_effect and state.own_effect.alive(now) else None
    echo = own is not None and req.fields.matches(own)
    external = own is not None and not echo
    link = None if own is not None else _link(state, req, now)

    if echo and own is not None:
        chain_id: str | None = own.chain_id
    elif link is not None:
        chain_id = link[0].chain_id
    else:
        chain_id = None
    chain = state.chains.get(chain_id) if chain_id else None
    subject_times = (
        state.subject_rate.in_window(now, limits.rate_window_s)
        if state.subject_rate and req.has_subject
        else ()
    )

    def dropped(
        reason: ActivationReason, depth: int | None, seen: bool = True
    ) -> tuple[ActivationChanges, ActivationOutcome]:
        new_chain = None
        if chain is not None:
            new_chain = _record(chain, req, now, ActivationDecision.DROP, reason, depth)
        changes = ActivationChanges(
            seen=Seen(req.content_fp, now) if seen else None, chain=new_chain
        )
        return changes, ActivationOutcome(
            ActivationDecision.DROP,
            reason,
            chain_id,
            depth,
            chain.activations if chain else 0,
            len(subject_times),
        )

    # 1. stops
    chain_stop = state.chain_stops.get(chain_id) if chain_id else None
    if covering(state.workflow_stop, chain_stop) is not None:
        return dropped(ActivationReason.STOPPED, None, seen=False)
    # 2. a delivery seen before
    if (
        state.seen is not None
        and state.seen.fingerprint == req.content_fp
        and now - state.seen.at < limits.dedupe_window_s
    ):
        return dropped(ActivationReason.DUPLICATE_EVENT, None)
    # 3. our own write came back
    if echo and own is not None:
        return dropped(ActivationReason.ECHO, own.depth)
    # 4. one more hop of a live chain
    depth = 0
    if link is not None:
        depth = link[1] + 1
        if depth > limits.max_depth:
            return dropped(ActivationReason.CHAIN_DEPTH, depth)
        if link[0].activations + 1 > limits.max_activations:
            return dropped(ActivationReason.CHAIN_BUDGET, depth)
    # 5. rates: a circuit breaker for every activation about to proceed, so a
    #    loop that leaves no trace, or restarts its chain at every hop, still
    #    ends. An event refused for load is not marked seen: a redelivery counts.
    if req.has_subject and len(subject_times) >= limits.rate_limit:
        return dropped(ActivationReason.ACTIVATION_RATE, None, seen=False)
    counter = state.workflow_rate or RateCounter()
    if counter.estimate(now, limits.workflow_rate_window_s) >= limits.workflow_rate_limit:
        return dropped(ActivationReason.WORKFLOW_RATE, None, seen=False)
    if link is not None:
        return _proceed(
            state, req, limits, now, link[0], depth, ActivationReason.REENTRY, subject_times
        )
    # 6. new work
    fresh = Chain(
        chain_id=req.new_chain_id,
        workflow=req.workflow,
        depth=0,
        activations=0,
        drops=0,
        effects=0,
        created_at=now,
        updated_at=now,
        expires_at=now + limits.chain_ttl_s,
    )
    reason = ActivationReason.EXTERNAL_CHANGE if external else ActivationReason.NEW_CHAIN
    return _proceed(state, req, limits, now, fresh, 0, reason, subject_times)


def _record(
    chain: Chain,
    req: ActivationRequest,
    now: float,
    decision: ActivationDecision,
    reason: ActivationReason,
    depth: int | None,
) -> Chain:
    entry = {
        "activation_id": req.activation_id,
        "at": now,
        "decision": str(decision),
        "reason": str(reason),
        "depth": depth,
    }
    proceeded = decision is ActivationDecision.PROCEED
    return replace(
        chain,
        depth=max(chain.depth, depth or 0) if proceeded else chain.depth,
        activations=chain.activations + (1 if proceeded else 0),
        drops=chain.drops + (0 if proceeded else 1),
        updated_at=now,
        recent=(*chain.recent, entry)[-RECENT_ACTIVATIONS:],
    )


def _proceed(
    state: ActivationState,
    req: ActivationRequest,
    limits: ChainLimits,
    now: float,
    chain: Chain,
    depth: int,
    reason: ActivationReason,
    subject_times: tuple[float, ...],
) -> tuple[ActivationChanges, ActivationOutcome]:
    new_chain = _record(chain, req, now, ActivationDecision.PROCEED, reason, depth)
    new_chain = new_chain.with_execution(req.execution_id, req.execution_mode, now)
    times = (*subject_times, now) if req.has_subject else subject_times
    changes = ActivationChanges(
        seen=Seen(req.content_fp, now),
        chain=new_chain,
        subject_rate=RateLog(times[-limits.rate_limit :]) if req.has_subject else None,
        workflow_rate=(state.workflow_rate or RateCounter()).add(
            now, limits.workflow_rate_window_s
        ),
    )
    return changes, ActivationOutcome(
        ActivationDecision.PROCEED,
        reason,
        new_chain.chain_id,
        depth,
        new_chain.activations,
        len(times),
    )


# -- effects ----------------------------------------------------------------------


@dataclass(frozen=True)
class EffectRequest:
    """An effect as the core sees it (field values already fingerprinted)."""

    workflow: str
    effect_id: str
    new_chain_id: str
    fields: dict[str, str]
    strict: bool
    ttl_s: float | None
    execution_id: str | None = None
    execution_mode: ExecutionMode = "production"


def register_effect(
    chain: Chain | None, req: EffectRequest, limits: ChainLimits, now: float
) -> tuple[Chain, Effect]:
    """Register what an execution writes, in ``chain`` (or a new chain).

    The effect takes the chain's current depth and, unless ``ttl_s`` is
    given, lives as long as the chain. A new effect on a target replaces
    the old one (the caller stores it under every target key).

    :returns: the updated chain and the effect.
    """
    if chain is None or not chain.alive(now):
        chain = Chain(
            chain_id=req.new_chain_id,
            workflow=req.workflow,
            depth=0,
            activations=0,
            drops=0,
            effects=0,
            created_at=now,
            updated_at=now,
            expires_at=now + limits.chain_ttl_s,
        )
    chain = replace(chain, effects=chain.effects + 1, updated_at=now)
    chain = chain.with_execution(req.execution_id, req.execution_mode, now)
    expires_at = now + req.ttl_s if req.ttl_s is not None else chain.expires_at
    effect = Effect(
        effect_id=req.effect_id,
        workflow=req.workflow,
        chain_id=chain.chain_id,
        depth=chain.depth,
        fields=dict(req.fields),
        strict=req.strict,
        created_at=now,
        expires_at=expires_at,
    )
    return chain, effect

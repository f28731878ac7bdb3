"""Deciding one activation (DESIGN §2): rules 1-6 of :mod:`sidecar.core.chains`,
in order, first match wins."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from sidecar.core.chains.records import (
    RECENT_ACTIVATIONS,
    ActivationDecision,
    ActivationReason,
    Chain,
    ChainLimits,
    Effect,
    FieldPrints,
    Link,
    Marker,
    RateBound,
    RateCounter,
    RateLog,
    Seen,
)
from sidecar.core.executions import ExecutionMode
from sidecar.core.stops import Stop, covering


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
    """What to store after the decision (None: leave as is).

    :ivar rate_bound: where the workflow's rate counts must stand for the
        decision to hold (None: the rate did not decide it).
    """

    seen: Seen | None = None
    chain: Chain | None = None
    subject_rate: RateLog | None = None
    workflow_rate: RateCounter | None = None
    rate_bound: RateBound | None = None


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
        reason: ActivationReason,
        depth: int | None,
        seen: bool = True,
        rate_bound: RateBound | None = None,
    ) -> tuple[ActivationChanges, ActivationOutcome]:
        new_chain = None
        if chain is not None:
            new_chain = _record(chain, req, now, ActivationDecision.DROP, reason, depth)
        changes = ActivationChanges(
            seen=Seen(req.content_fp, now) if seen else None,
            chain=new_chain,
            rate_bound=rate_bound,
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
    window, limit = limits.workflow_rate_window_s, limits.workflow_rate_limit
    if counter.estimate(now, window) >= limit:
        held = counter.bound(now, window, limit, under=False)
        return dropped(ActivationReason.WORKFLOW_RATE, None, seen=False, rate_bound=held)
    under = counter.bound(now, window, limit, under=True)
    if link is not None:
        return _proceed(
            state, req, limits, now, link[0], depth, ActivationReason.REENTRY, subject_times, under
        )
    # 6. new work
    fresh = Chain.fresh(req.new_chain_id, req.workflow, now, limits.chain_ttl_s)
    reason = ActivationReason.EXTERNAL_CHANGE if external else ActivationReason.NEW_CHAIN
    return _proceed(state, req, limits, now, fresh, 0, reason, subject_times, under)


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
    rate_bound: RateBound,
) -> tuple[ActivationChanges, ActivationOutcome]:
    new_chain = _record(chain, req, now, ActivationDecision.PROCEED, reason, depth)
    new_chain = new_chain.with_execution(req.execution_id, req.execution_mode, now, req.workflow)
    times = (*subject_times, now) if req.has_subject else subject_times
    changes = ActivationChanges(
        seen=Seen(req.content_fp, now),
        chain=new_chain,
        subject_rate=RateLog(times[-limits.rate_limit :]) if req.has_subject else None,
        workflow_rate=(state.workflow_rate or RateCounter()).add(
            now, limits.workflow_rate_window_s
        ),
        rate_bound=rate_bound,
    )
    return changes, ActivationOutcome(
        ActivationDecision.PROCEED,
        reason,
        new_chain.chain_id,
        depth,
        new_chain.activations,
        len(times),
    )

"""Registering an effect (DESIGN §2): the chain and depth it takes, how long
it lives, and when a target's link is taken over."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sidecar.core.chains.records import Chain, ChainLimits, Effect, Link
from sidecar.core.executions import ExecutionMode


def takes_over(held: Link | None, held_in_scope: bool, now: float) -> bool:
    """Whether a new effect on a target takes the target's link over.

    A link is taken over unless it is live and of a workflow outside the
    registering token's scope (``held_in_scope`` False): a scoped token
    never redirects another workflow's chain.
    """
    return held is None or held_in_scope or not held.alive(now)


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
        chain = Chain.fresh(req.new_chain_id, req.workflow, now, limits.chain_ttl_s)
    chain = replace(chain, effects=chain.effects + 1, updated_at=now)
    chain = chain.with_execution(req.execution_id, req.execution_mode, now, req.workflow)
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

"""Request and response models of activations, effects, chains and stops (DESIGN §2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, Field, JsonValue, field_validator, model_validator

from sidecar.api.answer import built
from sidecar.api.models import Name, RequestBody, rfc3339
from sidecar.core.chains import ActivationDecision, ActivationReason, Chain, Effect
from sidecar.core.stops import Stop
from sidecar.markers import CHAIN_ID_PATTERN
from sidecar.service.chains import ActivationResult

Key = Annotated[str, Field(min_length=1, max_length=1000)]
ChainId = Annotated[str, Field(pattern=CHAIN_ID_PATTERN)]
MAX_RELATED_KEYS = 100
MAX_TARGET_KEYS = 20


class ActivationBody(RequestBody):
    """``POST /v1/activations``: right after a trigger fires."""

    workflow: Name
    trigger: Name | None = None
    event_key: Key | None = Field(
        default=None,
        description="Stable identity of the record that fired (a row key, a Message-ID, an id).",
    )
    related_keys: list[Key] = Field(
        default=[],
        max_length=MAX_RELATED_KEYS,
        description="Identities the event points back to (In-Reply-To, References, a parent).",
    )
    subject_key: Key | None = Field(
        default=None, description="What the rate limit counts (default: event_key)."
    )
    content: dict[str, JsonValue] | None = Field(
        default=None, description="The fields that matter (default: from event)."
    )
    event: dict[str, JsonValue] | None = Field(
        default=None, description="The trigger's item as n8n emits it."
    )
    marker: Annotated[str, Field(max_length=512)] | None = None

    @field_validator("related_keys", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        """Gmail's parsed ``references`` is a string for one id, an array for several."""
        if value is None:
            return []
        return [value] if isinstance(value, str) else value


class ActivationCounts(BaseModel):
    chain_activations: int
    subject_activations_in_window: int


class ActivationResponse(BaseModel):
    """Route on ``decision`` (``proceed`` / ``drop``); embed ``marker`` in what you write."""

    decision: ActivationDecision
    reason: ActivationReason
    chain_id: str | None
    depth: int | None
    activation_id: str
    marker: str | None
    counts: ActivationCounts
    invalid_markers: int

    @classmethod
    def of(cls, result: ActivationResult) -> ActivationResponse:
        """An activation's decision, the marker to embed, and what it counted."""
        out = result.outcome
        # The core's values, typed already: built, not validated again.
        return built(
            cls,
            decision=out.decision,
            reason=out.reason,
            chain_id=out.chain_id,
            depth=out.depth,
            activation_id=result.activation_id,
            marker=result.marker,
            counts=built(
                ActivationCounts,
                chain_activations=out.chain_activations,
                subject_activations_in_window=out.subject_activations_in_window,
            ),
            invalid_markers=result.invalid_markers,
        )


class EffectBody(RequestBody):
    """``POST /v1/effects``: what this execution is about to write (or just wrote)."""

    chain_id: ChainId | None = None
    workflow: Name | None = None
    target_keys: list[Key] | None = Field(default=None, min_length=1, max_length=MAX_TARGET_KEYS)
    target_key: Key | None = None
    content: dict[str, JsonValue] = Field(
        description="The record as written (the update node's output), field by field."
    )
    ttl_s: Annotated[float, Field(ge=1, le=30 * 86_400)] | None = None
    strict: bool = False

    @model_validator(mode="after")
    def _targets(self) -> EffectBody:
        if not self.target_keys and not self.target_key:
            raise ValueError("give target_keys (or one target_key)")
        return self

    def targets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*(self.target_keys or []), *filter(None, [self.target_key])]))


class EffectResponse(BaseModel):
    effect_id: str
    chain_id: str
    workflow: str
    depth: int
    target_count: int
    expires_at: str

    @classmethod
    def of(cls, chain: Chain, effect: Effect, target_count: int) -> EffectResponse:
        """A registered effect, in its chain, under ``target_count`` target keys."""
        return cls(
            effect_id=effect.effect_id,
            chain_id=chain.chain_id,
            workflow=effect.workflow,
            depth=effect.depth,
            target_count=target_count,
            expires_at=rfc3339(effect.expires_at) or "",
        )


class StopBody(RequestBody):
    reason: Annotated[str, Field(min_length=1, max_length=500)]


class ResumeBody(RequestBody):
    reason: Annotated[str, Field(max_length=500)] | None = None


class StopView(BaseModel):
    at: str
    reason: str
    actor: str

    @classmethod
    def of(cls, stop: Stop | None) -> StopView | None:
        if stop is None:
            return None
        return cls(at=rfc3339(stop.at) or "", reason=stop.reason, actor=stop.actor)


class ActivationEntry(BaseModel):
    activation_id: str
    at: str
    decision: str
    reason: str
    depth: int | None


class ChainView(BaseModel):
    chain_id: str
    workflow: str
    depth: int
    activations: int
    drops: int
    effects: int
    created_at: str
    updated_at: str
    expires_at: str
    alive: bool
    stopped: StopView | None
    recent: list[ActivationEntry]
    executions: list[dict[str, Any]] = Field(
        default=[], description="The n8n executions that acted for the chain (a stop stops them)."
    )

    @classmethod
    def of(cls, chain: Chain, stop: Stop | None, now: float) -> ChainView:
        return cls(
            chain_id=chain.chain_id,
            workflow=chain.workflow,
            depth=chain.depth,
            activations=chain.activations,
            drops=chain.drops,
            effects=chain.effects,
            created_at=rfc3339(chain.created_at) or "",
            updated_at=rfc3339(chain.updated_at) or "",
            expires_at=rfc3339(chain.expires_at) or "",
            alive=chain.alive(now),
            stopped=StopView.of(stop),
            recent=[ActivationEntry(**{**e, "at": rfc3339(e["at"])}) for e in chain.recent],
            executions=[{**e, "at": rfc3339(e.get("at"))} for e in chain.executions],
        )


class ExecutionStopView(BaseModel):
    """One n8n execution a stop asked n8n to stop (DESIGN §6).

    ``confirmed`` is true only when n8n reported a finished status;
    ``result`` is ``stopped`` (n8n answered ``canceled``), ``finished`` (it
    ended by itself meanwhile), ``already_finished``, ``unconfirmed`` or
    ``not_found`` or ``refused`` (an id that is not the chain's or task's own
    execution in n8n: another workflow's or mode's; never asked to stop).
    """

    execution_id: str
    status_before: str | None
    status_after: str | None
    confirmed: bool
    result: str
    error: str | None = None


class CancellationView(BaseModel):
    """What the last stop asked n8n and saw.

    ``state``: ``confirmed`` (every execution reported finished), ``partial``
    (some unconfirmed), ``failed`` (n8n unreachable or the key refused:
    ``error`` says why; loopstop's own stop still holds), ``not_configured``
    (no ``n8n`` section), ``nothing_to_stop``.
    """

    state: str
    at: str
    execution_mode: str
    error: str | None
    elapsed_s: float
    executions: list[ExecutionStopView]

    @classmethod
    def of(cls, doc: Mapping[str, Any] | None) -> CancellationView | None:
        if doc is None:
            return None
        return cls(**{**doc, "at": rfc3339(doc.get("at")) or ""})


def cancellation_view(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A stored cancellation record as JSON (None when there is none)."""
    view = CancellationView.of(doc)
    return None if view is None else view.model_dump(mode="json")


def outlier_view(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A task's outlier mark as JSON: ``{at, action, factor, exceeded: [...]}``."""
    if not doc:
        return None
    return {**doc, "at": rfc3339(doc.get("at"))}


class ChainResponse(BaseModel):
    chain: ChainView
    cancellation: CancellationView | None = None


class WorkflowResponse(BaseModel):
    workflow: str
    stopped: StopView | None
    cancellation: CancellationView | None = None

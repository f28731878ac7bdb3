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

Where each part lives:

- :mod:`~sidecar.core.chains.content`: which part of an item counts
  (:func:`content_of`) and echo normalisation (:func:`normalize_scalar`);
- :mod:`~sidecar.core.chains.records`: the records (chains, effects, links,
  windows, markers, field prints) and the decisions' enums;
- :mod:`~sidecar.core.chains.activation`: rules 1-6 (:func:`decide_activation`);
- :mod:`~sidecar.core.chains.effects`: registering an effect
  (:func:`register_effect`) and link takeover (:func:`takes_over`).

Every public name is importable from this package.
"""

from sidecar.core.chains.activation import (
    ActivationChanges,
    ActivationOutcome,
    ActivationRequest,
    ActivationState,
    decide_activation,
)
from sidecar.core.chains.content import content_of, normalize_scalar
from sidecar.core.chains.effects import EffectRequest, register_effect, takes_over
from sidecar.core.chains.records import (
    RECENT_ACTIVATIONS,
    ActivationDecision,
    ActivationReason,
    Chain,
    ChainLimits,
    Effect,
    EffectDecision,
    FieldPrints,
    Link,
    Marker,
    RateBound,
    RateCounter,
    RateLog,
    Seen,
)
from sidecar.core.stops import Stop  # the chains' stop

__all__ = [
    "RECENT_ACTIVATIONS",
    "ActivationChanges",
    "ActivationDecision",
    "ActivationOutcome",
    "ActivationReason",
    "ActivationRequest",
    "ActivationState",
    "Chain",
    "ChainLimits",
    "Effect",
    "EffectDecision",
    "EffectRequest",
    "FieldPrints",
    "Link",
    "Marker",
    "RateBound",
    "RateCounter",
    "RateLog",
    "Seen",
    "Stop",
    "content_of",
    "decide_activation",
    "normalize_scalar",
    "register_effect",
    "takes_over",
]

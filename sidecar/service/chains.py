"""The activation gate service: activations, effects, chains and stops
around :mod:`sidecar.core.chains`."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from sidecar import markers
from sidecar.auth import Principal
from sidecar.canonical import Fingerprinter
from sidecar.config import ChainsConfig
from sidecar.core import chains as core
from sidecar.core.chains import (
    ActivationOutcome,
    ActivationRequest,
    ActivationState,
    Chain,
    ChainLimits,
    Effect,
    EffectRequest,
    FieldPrints,
    Link,
    RateCounter,
    RateLog,
    Seen,
)
from sidecar.core.executions import ExecutionMode
from sidecar.core.stops import Stop, set_stop
from sidecar.errors import ValidationFailed
from sidecar.service import keys, mappers, records
from sidecar.service.mappers import EFFECTS, LINKS, STOPS, Chains, Plain
from sidecar.service.records import Txn
from sidecar.store import Bound, Increment, Store


def new_chain_id() -> str:
    """A fresh chain id: ``c`` + 20 hex digits (80 random bits)."""
    return "c" + secrets.token_hex(10)


@dataclass(frozen=True)
class ActivationInput:
    """The validated ``POST /v1/activations`` body."""

    workflow: str
    event_key: str | None
    related_keys: tuple[str, ...]
    subject_key: str | None
    content: Any
    event: Any
    marker: str | None
    execution_id: str | None = None
    execution_mode: ExecutionMode = "production"


@dataclass(frozen=True)
class ActivationResult:
    outcome: ActivationOutcome
    activation_id: str
    marker: str | None
    invalid_markers: int


@dataclass(frozen=True)
class EffectInput:
    """The validated ``POST /v1/effects`` body."""

    chain_id: str | None
    workflow: str | None
    target_keys: tuple[str, ...]
    content: Mapping[str, Any]
    ttl_s: float | None
    strict: bool
    execution_id: str | None = None
    execution_mode: ExecutionMode = "production"


class _Policy(NamedTuple):
    """A workflow's chain policy and the mappers of its dedupe and subject rate windows."""

    limits: ChainLimits
    seen: Plain[Seen]
    subject_rate: Plain[RateLog]

    @classmethod
    def of(cls, limits: ChainLimits) -> _Policy:
        return cls(
            limits,
            mappers.window(limits.dedupe_window_s),
            mappers.subject_rate(limits.rate_window_s),
        )


class LazyPrints(Mapping[str, str]):
    """Field -> fingerprint of a content's fields, each computed when first read.

    The core reads a field's print only to compare it with an effect that
    targets the event, and only the fields that effect wrote: most
    activations read none, so most make no HMAC here. The prints are those
    an eager ``{k: make(v) for k, v in fields.items()}`` holds.

    :param fields: the content's fields (not copied: the content is not changed
        while the activation is decided).
    :param make: the fingerprint of one field's value.
    """

    __slots__ = ("_fields", "_made", "_make")

    def __init__(self, fields: Mapping[str, Any], make: Callable[[Any], str]) -> None:
        self._fields = fields
        self._make = make
        self._made: dict[str, str] = {}

    def __getitem__(self, name: str) -> str:
        made = self._made.get(name)
        if made is None:
            made = self._made[name] = self._make(self._fields[name])
        return made

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


@dataclass(frozen=True)
class ChainInfo:
    chain: Chain
    stop: Stop | None


class ChainService:
    """Runs activation, effect and stop decisions as store transactions."""

    def __init__(
        self,
        store: Store,
        fingerprinter: Fingerprinter,
        chains: ChainsConfig,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.fp = fingerprinter
        self.config = chains
        self.clock = clock
        self.longest_chain_s = max(
            [chains.default.chain_ttl_s]
            + [o.chain_ttl_s for o in chains.workflows.values() if o.chain_ttl_s]
        )
        self.records = Chains(self.longest_chain_s)
        # Built once per worker: the policy of every configured workflow and the
        # default's (with the mappers of its dedupe and rate windows), and the
        # fingerprints an absent field has.
        self._policies = {
            name: _Policy.of(chains.for_workflow(name).to_core()) for name in chains.workflows
        }
        self._default_policy = _Policy.of(chains.default.to_core())
        self._missing = (
            fingerprinter.fingerprint(core.normalize_scalar(None)),
            fingerprinter.fingerprint(None),
        )

    def limits(self, workflow: str | None) -> ChainLimits:
        """The chain policy of ``workflow`` (defaults plus its overrides)."""
        return self._policy(workflow).limits

    def _policy(self, workflow: str | None) -> _Policy:
        return self._policies.get(workflow or "", self._default_policy)

    # -- fingerprints ------------------------------------------------------------

    def field_prints(self, content: Any) -> FieldPrints:
        """The content's field prints, each made when the core first compares it
        (:class:`LazyPrints`)."""
        fields = content if isinstance(content, dict) else {}
        return FieldPrints(
            normal=LazyPrints(fields, self._normal_print),
            strict=LazyPrints(fields, self.fp.fingerprint),
            missing_normal=self._missing[0],
            missing_strict=self._missing[1],
        )

    def _normal_print(self, value: Any) -> str:
        return self.fp.fingerprint(core.normalize_scalar(value))

    # -- activations -------------------------------------------------------------

    def activate(self, principal: Principal, ns: str, body: ActivationInput) -> ActivationResult:
        """Decide one activation atomically (DESIGN §2).

        Links and markers into chains of workflows outside the token's scope
        are ignored: a scoped token can neither probe nor spend another
        workflow's chains.

        :raises Forbidden: the token may not act for the workflow.
        :raises StoreUnavailable: fail closed.
        """
        principal.require(body.workflow)
        now = self.clock()
        wf = body.workflow
        limits, seen_records, subject_records = self._policy(wf)
        content = core.content_of(body.content, body.event)
        content_fp, content_json = self.fp.fingerprint_canonical(content)
        if body.marker is not None and body.marker.strip():
            found = markers.scan_given(self.fp, ns, body.marker)
        elif body.event is not None:
            found = markers.scan(self.fp, ns, body.event)
        elif markers.may_hold(content_json):
            found = markers.scan(self.fp, ns, content)
        else:
            found = markers.NOTHING
        candidates = found.candidates()
        subject = body.subject_key or body.event_key
        event_hash = (
            self.fp.key_hash("event", body.event_key) if body.event_key else "c" + content_fp[:32]
        )
        own_hash = self.fp.key_hash("target", body.event_key) if body.event_key else None
        own_key = keys.effect(ns, wf, own_hash) if own_hash else None
        own_link = keys.link(ns, own_hash) if own_hash else None
        related = [
            k
            for k in dict.fromkeys(
                keys.link(ns, self.fp.key_hash("target", r)) for r in body.related_keys
            )
            if k != own_link
        ]
        seen_key = keys.seen(ns, wf, event_hash)
        subject_key = keys.subject_rate(ns, wf, self.fp.key_hash("subject", subject or ""))
        # The workflow's rate: two fixed-window counters (this window and the
        # previous one), read without being compared and bumped by an
        # increment at commit, so concurrent activations of one workflow never
        # conflict on it. It may overshoot by the activations in flight at once.
        rate_window = limits.workflow_rate_window_s
        window_no = int(now // rate_window)
        wf_rate_key = keys.workflow_rate(ns, wf, window_no)
        wf_rate_prev = keys.workflow_rate(ns, wf, window_no - 1)
        # A worker whose clock is behind another's still counts what that one
        # already counted in the next window.
        wf_rate_next = keys.workflow_rate(ns, wf, window_no + 1)
        rate_keys = (wf_rate_prev, wf_rate_key, wf_rate_next)
        wf_stop_key = keys.workflow_stop(wf)
        fresh_chain = new_chain_id()
        req = ActivationRequest(
            workflow=wf,
            activation_id="a" + secrets.token_hex(8),
            new_chain_id=fresh_chain,
            content_fp=content_fp,
            fields=self.field_prints(content),
            markers=candidates,
            has_subject=subject is not None,
            execution_id=body.execution_id,
            execution_mode=body.execution_mode,
        )
        declared = [
            wf_stop_key,
            seen_key,
            subject_key,
            wf_rate_key,
            wf_rate_prev,
            wf_rate_next,
            keys.chain(ns, fresh_chain),
            *related,
        ]
        if own_key and own_link:
            declared += [own_key, own_link]
        for m in candidates:
            declared += [keys.chain(ns, m.chain_id), keys.chain_stop(ns, m.chain_id)]

        def step(txn: Txn) -> ActivationOutcome:
            own = txn.read(EFFECTS, own_key) if own_key else None
            links = [lk for k in related if (lk := txn.read(LINKS, k))]
            if own_link and (held := txn.read(LINKS, own_link)) and held.workflow != wf:
                links.append(held)  # another workflow wrote this record: a hop
            links = [lk for lk in links if principal.allows(lk.workflow)]
            chain_ids = {lk.chain_id for lk in links} | {m.chain_id for m in candidates}
            if own is not None:
                chain_ids.add(own.chain_id)
            chains: dict[str, Chain] = {}
            stops: dict[str, Stop] = {}
            if chain_ids:  # (most activations name no chain)
                # The chains and their stops, in one read (not one per step).
                ordered = sorted(chain_ids)
                txn.prefetch(
                    k for cid in ordered for k in (keys.chain(ns, cid), keys.chain_stop(ns, cid))
                )
                chains = {
                    cid: c
                    for cid in ordered
                    if (c := txn.read(self.records, keys.chain(ns, cid)))
                    and principal.allows(c.workflow)
                }
                stops = {
                    cid: st for cid in chains if (st := txn.read(STOPS, keys.chain_stop(ns, cid)))
                }
            counts = [txn.count(k, "count") for k in rate_keys]
            # Only increments change the rate counters: the decision tolerates them moving.
            txn.tolerate(rate_keys)
            state = ActivationState(
                workflow_stop=txn.read(STOPS, wf_stop_key),
                seen=txn.read(seen_records, seen_key),
                own_effect=own,
                links=tuple(links),
                chains=chains,
                chain_stops=stops,
                subject_rate=txn.read(subject_records, subject_key),
                workflow_rate=RateCounter(
                    window_no * rate_window, counts[1] + counts[2], counts[0]
                ),
            )
            changes, outcome = core.decide_activation(state, req, limits, txn.now)
            txn.save(seen_records, ns, seen_key, changes.seen)
            if changes.chain is not None:
                chain_key = keys.chain(ns, changes.chain.chain_id)
                txn.save(self.records, ns, chain_key, changes.chain)
            txn.save(subject_records, ns, subject_key, changes.subject_rate)
            if changes.workflow_rate is not None:
                txn.increment(wf_rate_key, Increment("count", 1, 2 * rate_window))
            if (bound := changes.rate_bound) is not None:
                # Decided on guessed counts, the decision holds while the
                # estimate stays on the same side of the limit.
                weights = (bound.previous_weight, 1.0, 1.0)
                txn.bound(Bound(rate_keys, weights, "count", bound.below, bound.at_least))
            return outcome

        # Guessed, not read: the keys this process knows as it last saw them,
        # the others absent (a new event, a new chain); the rate counters,
        # which other activations move, are checked against the decision's
        # bound. A wrong guess is decided again on what the store answers.
        outcome = records.run(
            self.store, declared, step, now, absent_likely=True, recent_likely=True
        )
        issued = None
        if outcome.decision is core.ActivationDecision.PROCEED and outcome.chain_id:
            issued = markers.encode(self.fp, ns, outcome.chain_id, outcome.depth or 0)
        return ActivationResult(outcome, req.activation_id, issued, found.invalid)

    # -- effects -------------------------------------------------------------------

    def register_effect(
        self, principal: Principal, ns: str, body: EffectInput
    ) -> tuple[Chain, Effect]:
        """Register what this execution writes under every target key.

        The effect is stored per workflow (only that workflow's trigger sees
        its echo); beside it a link records the target's chain for hops
        through other workflows. A link is never taken over from a workflow
        outside the token's scope.

        :raises Forbidden: the token may not act for the effect's workflow or
            for the named chain's.
        :raises ValidationFailed: only a ``chain_id`` was given and that chain
            is unknown or expired (name the workflow).
        :raises StoreUnavailable: fail closed.
        """
        now = self.clock()
        fresh_chain = new_chain_id()
        hashes = list(dict.fromkeys(self.fp.key_hash("target", t) for t in body.target_keys))
        prints = {
            k: self.fp.fingerprint(v if body.strict else core.normalize_scalar(v))
            for k, v in body.content.items()
        }
        links = [keys.link(ns, h) for h in hashes]
        declared = [keys.chain(ns, fresh_chain), *links]
        if body.workflow:
            declared += [keys.effect(ns, body.workflow, h) for h in hashes]
        if body.chain_id:
            declared.append(keys.chain(ns, body.chain_id))

        def step(txn: Txn) -> tuple[Chain, Effect]:
            chain = None
            if body.chain_id:
                chain = txn.read(self.records, keys.chain(ns, body.chain_id))
                if chain is not None:
                    principal.require(chain.workflow, of_record=True)
            workflow = body.workflow or (chain.workflow if chain else None)
            if workflow is None:
                raise ValidationFailed(
                    [
                        {
                            "loc": ["body", "chain_id"],
                            "msg": "no live chain with this id: name the workflow as well",
                        }
                    ]
                )
            principal.require(workflow)
            # The effect keys this step overwrites, learned from the chain when the
            # body named no workflow: read together (one round trip), not one by one.
            txn.prefetch(keys.effect(ns, workflow, h) for h in hashes)
            req = EffectRequest(
                workflow=workflow,
                effect_id="e" + secrets.token_hex(8),
                new_chain_id=fresh_chain,
                fields=prints,
                strict=body.strict,
                ttl_s=body.ttl_s,
                execution_id=body.execution_id,
                execution_mode=body.execution_mode,
            )
            new_chain, effect = core.register_effect(chain, req, self.limits(workflow), txn.now)
            txn.save(self.records, ns, keys.chain(ns, new_chain.chain_id), new_chain)
            link = Link(workflow, new_chain.chain_id, effect.depth, effect.expires_at)
            for h, link_key in zip(hashes, links, strict=True):
                txn.save(EFFECTS, ns, keys.effect(ns, workflow, h), effect)
                held = txn.read(LINKS, link_key)
                in_scope = held is not None and principal.allows(held.workflow)
                if core.takes_over(held, in_scope, txn.now):
                    txn.save(LINKS, ns, link_key, link)
            return new_chain, effect

        return records.run(self.store, declared, step, now)

    # -- chains and stops ----------------------------------------------------------

    def chain(self, principal: Principal, ns: str, chain_id: str) -> ChainInfo:
        """A chain and its stop.

        :raises NotFound: no such chain (or it expired and was collected).
        :raises Forbidden: the chain belongs to a workflow outside the scope.
        """
        docs = self.store.get_many([keys.chain(ns, chain_id), keys.chain_stop(ns, chain_id)])
        found = self.records.decode(docs[keys.chain(ns, chain_id)])
        chain = self.records.authorize(principal, found, chain_id)
        return ChainInfo(chain, STOPS.decode(docs[keys.chain_stop(ns, chain_id)]))

    def stop_chain(
        self, principal: Principal, ns: str, chain_id: str, reason: str, stopped: bool
    ) -> ChainInfo:
        """Stop (sticky) or resume a chain. Admin only.

        :raises Forbidden: not an admin token, or a chain of a workflow outside its scope.
        :raises NotFound: no such chain.
        """
        principal.require_admin()
        now = self.clock()
        chain_key, stop_key = keys.chain(ns, chain_id), keys.chain_stop(ns, chain_id)

        def step(txn: Txn) -> ChainInfo:
            chain = self.records.authorize(principal, txn.read(self.records, chain_key), chain_id)
            current = txn.read(STOPS, stop_key)
            if not stopped:
                if current is not None:
                    txn.delete(stop_key)
                return ChainInfo(chain, None)
            stop = set_stop(current, Stop(txn.now, reason, principal.name))
            txn.save(mappers.chain_stop(chain), ns, stop_key, stop, current)
            return ChainInfo(chain, stop)

        return records.run(self.store, [chain_key, stop_key], step, now)

    def workflow_stop(self, principal: Principal, ns: str, workflow: str) -> Stop | None:
        """The workflow's stop, if any.

        :raises Forbidden: the workflow is outside the token's scope.
        """
        principal.require(workflow)
        return STOPS.decode(self.store.get(keys.workflow_stop(workflow)))

    def stop_workflow(
        self, principal: Principal, ns: str, workflow: str, reason: str, stopped: bool
    ) -> Stop | None:
        """Stop (sticky, until resumed) or resume a workflow. Admin only.

        Every later activation, task admission and operation ``begin`` of the
        workflow is answered ``stopped``.

        :raises Forbidden: not an admin token, or outside its scope.
        """
        principal.require_admin()
        principal.require(workflow)
        now = self.clock()
        key = keys.workflow_stop(workflow)  # one stop for test and production alike

        def step(txn: Txn) -> Stop | None:
            current = txn.read(STOPS, key)
            if not stopped:
                if current is not None:
                    txn.delete(key)
                return None
            stop = set_stop(current, Stop(txn.now, reason, principal.name))
            txn.save(STOPS, ns, key, stop, current)
            return stop

        return records.run(self.store, [key], step, now)

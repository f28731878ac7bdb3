"""The activation gate service: activations, effects, chains and stops
around :mod:`sidecar.core.gate`."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sidecar import markers
from sidecar.auth import Principal
from sidecar.canonical import Fingerprinter
from sidecar.config import ChainsConfig
from sidecar.core import gate as core
from sidecar.core.executions import ExecutionMode
from sidecar.core.gate import (
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
    Stop,
)
from sidecar.errors import NotFound, ValidationFailed
from sidecar.service import keys
from sidecar.store import Increment, IndexEntry, Plan, Snapshot, Store, Write


def new_chain_id() -> str:
    """A fresh chain id: ``c`` + 20 hex digits (80 random bits)."""
    return "c" + secrets.token_hex(10)


def derive_content(content: Any, event: Any) -> Any:
    """The fields that matter for dedupe and echo matching.

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


def _ttl(until: float, now: float) -> float:
    return max(1.0, until - now)


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


@dataclass(frozen=True)
class ChainInfo:
    chain: Chain
    stop: Stop | None


def _stop(doc: Mapping[str, Any] | None) -> Stop | None:
    return None if doc is None else Stop(**doc)


class GateService:
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
        self.chains = chains
        self.clock = clock
        self.longest_chain_s = max(
            [chains.default.chain_ttl_s]
            + [o.chain_ttl_s for o in chains.workflows.values() if o.chain_ttl_s]
        )

    def _write_chain(self, plan: Plan[Any], ns: str, chain: Chain, now: float) -> None:
        """Store a chain and keep the index of live chains (for the operator page)."""
        plan.writes[keys.chain(ns, chain.chain_id)] = Write(
            chain.to_doc(), _ttl(chain.expires_at, now)
        )
        plan.index.append(IndexEntry(keys.recent_chains(ns), chain.chain_id, now))
        plan.trims.append((keys.recent_chains(ns), now - self.longest_chain_s))

    def limits(self, workflow: str | None) -> ChainLimits:
        """The chain policy of ``workflow`` (defaults plus its overrides)."""
        return ChainLimits(**self.chains.for_workflow(workflow).model_dump())

    # -- fingerprints ------------------------------------------------------------

    def field_prints(self, content: Any) -> FieldPrints:
        fields = content if isinstance(content, dict) else {}
        return FieldPrints(
            normal={k: self.fp.fingerprint(core.normalize_scalar(v)) for k, v in fields.items()},
            strict={k: self.fp.fingerprint(v) for k, v in fields.items()},
            missing_normal=self.fp.fingerprint(core.normalize_scalar(None)),
            missing_strict=self.fp.fingerprint(None),
        )

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
        limits = self.limits(wf)
        content = derive_content(body.content, body.event)
        content_fp = self.fp.fingerprint(content)
        if body.marker is not None and body.marker.strip():
            found = markers.scan_given(self.fp, ns, body.marker)
        else:
            found = markers.scan(self.fp, ns, body.event if body.event is not None else content)
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

        def decide(snap: Snapshot) -> Plan[ActivationOutcome]:
            own = Effect.from_doc(snap.get(own_key)) if own_key else None
            links = [Link(**d) for k in related if (d := snap.get(k))]
            if own_link and (d := snap.get(own_link)) and d["workflow"] != wf:
                links.append(Link(**d))  # another workflow wrote this record: a hop
            links = [lk for lk in links if principal.allows(lk.workflow)]
            chain_ids = {lk.chain_id for lk in links} | {m.chain_id for m in candidates}
            if own is not None:
                chain_ids.add(own.chain_id)
            # The chains and their stops, in one read (not one per step).
            snap.prefetch(
                k
                for cid in sorted(chain_ids)
                for k in (keys.chain(ns, cid), keys.chain_stop(ns, cid))
            )
            chains = {
                cid: c
                for cid in sorted(chain_ids)
                if (c := Chain.from_doc(snap.get(keys.chain(ns, cid))))
                and principal.allows(c.workflow)
            }
            stops = {cid: st for cid in chains if (st := _stop(snap.get(keys.chain_stop(ns, cid))))}
            seen_doc = snap.get(seen_key)
            subj_doc = snap.get(subject_key)
            counts = [
                int(doc["count"]) if (doc := snap.get(k)) else 0
                for k in (wf_rate_prev, wf_rate_key, wf_rate_next)
            ]
            workflow_rate = RateCounter(window_no * rate_window, counts[1] + counts[2], counts[0])
            state = ActivationState(
                workflow_stop=_stop(snap.get(wf_stop_key)),
                seen=Seen(**seen_doc) if seen_doc else None,
                own_effect=own,
                links=tuple(links),
                chains=chains,
                chain_stops=stops,
                subject_rate=RateLog(tuple(subj_doc["times"])) if subj_doc else None,
                workflow_rate=workflow_rate,
            )
            changes, outcome = core.decide_activation(state, req, limits, now)
            rate_keys = {wf_rate_prev, wf_rate_key, wf_rate_next}
            plan: Plan[ActivationOutcome] = Plan(outcome, unchecked=rate_keys)
            if changes.seen is not None:
                plan.writes[seen_key] = Write(asdict(changes.seen), limits.dedupe_window_s)
            if changes.chain is not None:
                chain_key = keys.chain(ns, changes.chain.chain_id)
                snap.get(chain_key)
                self._write_chain(plan, ns, changes.chain, now)
            if changes.subject_rate is not None:
                plan.writes[subject_key] = Write(
                    {"times": list(changes.subject_rate.times)}, limits.rate_window_s
                )
            if changes.workflow_rate is not None:
                plan.increments[wf_rate_key] = Increment("count", 1, 2 * rate_window)
            return plan

        outcome = self.store.transact(declared, decide)
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

        def decide(snap: Snapshot) -> Plan[tuple[Chain, Effect]]:
            chain = None
            if body.chain_id:
                chain = Chain.from_doc(snap.get(keys.chain(ns, body.chain_id)))
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
            new_chain, effect = core.register_effect(chain, req, self.limits(workflow), now)
            plan: Plan[tuple[Chain, Effect]] = Plan((new_chain, effect))
            self._write_chain(plan, ns, new_chain, now)
            ttl = _ttl(effect.expires_at, now)
            link = Link(workflow, new_chain.chain_id, effect.depth, effect.expires_at)
            for h, link_key in zip(hashes, links, strict=True):
                effect_key = keys.effect(ns, workflow, h)
                snap.get(effect_key)
                plan.writes[effect_key] = Write(effect.to_doc(), ttl)
                held = snap.get(link_key)
                if (
                    held is None
                    or principal.allows(held["workflow"])
                    or (held["expires_at"] <= now)
                ):
                    plan.writes[link_key] = Write(asdict(link), ttl)
            return plan

        return self.store.transact(declared, decide)

    # -- chains and stops ----------------------------------------------------------

    def chain(self, principal: Principal, ns: str, chain_id: str) -> ChainInfo:
        """A chain and its stop.

        :raises NotFound: no such chain (or it expired and was collected).
        :raises Forbidden: the chain belongs to a workflow outside the scope.
        """
        docs = self.store.get_many([keys.chain(ns, chain_id), keys.chain_stop(ns, chain_id)])
        chain = Chain.from_doc(docs[keys.chain(ns, chain_id)])
        if chain is None:
            raise NotFound(f"no chain {chain_id!r}")
        principal.require(chain.workflow, of_record=True)
        return ChainInfo(chain, _stop(docs[keys.chain_stop(ns, chain_id)]))

    def stop_chain(
        self, principal: Principal, ns: str, chain_id: str, reason: str, stopped: bool
    ) -> ChainInfo:
        """Stop (sticky) or resume a chain. Admin only.

        :raises Forbidden: not an admin token.
        :raises NotFound: no such chain.
        """
        principal.require_admin()
        now = self.clock()
        chain_key, stop_key = keys.chain(ns, chain_id), keys.chain_stop(ns, chain_id)

        def decide(snap: Snapshot) -> Plan[ChainInfo]:
            chain = Chain.from_doc(snap.get(chain_key))
            if chain is None:
                raise NotFound(f"no chain {chain_id!r}")
            current = _stop(snap.get(stop_key))
            if not stopped:
                plan: Plan[ChainInfo] = Plan(ChainInfo(chain, None))
                if current is not None:
                    plan.writes[stop_key] = Write(None)
                return plan
            stop = current or Stop(now, reason, principal.name)
            plan = Plan(ChainInfo(chain, stop))
            if current is None:
                plan.writes[stop_key] = Write(asdict(stop), _ttl(chain.expires_at, now))
            return plan

        return self.store.transact([chain_key, stop_key], decide)

    def workflow_stop(self, principal: Principal, ns: str, workflow: str) -> Stop | None:
        """The workflow's stop, if any.

        :raises Forbidden: the workflow is outside the token's scope.
        """
        principal.require(workflow)
        return _stop(self.store.get(keys.workflow_stop(workflow)))

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

        def decide(snap: Snapshot) -> Plan[Stop | None]:
            current = _stop(snap.get(key))
            if not stopped:
                return Plan(None, {key: Write(None)} if current else {})
            if current is not None:
                return Plan(current)
            stop = Stop(now, reason, principal.name)
            return Plan(stop, {key: Write(asdict(stop))})

        return self.store.transact([key], decide)

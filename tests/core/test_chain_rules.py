"""The activation gate's rules as pure functions: order, windows, depth, budgets."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sidecar.canonical import canonical_json
from sidecar.core.chains import (
    ActivationDecision,
    ActivationReason,
    ActivationRequest,
    ActivationState,
    Chain,
    ChainLimits,
    Effect,
    EffectRequest,
    FieldPrints,
    Link,
    Marker,
    RateBound,
    RateCounter,
    RateLog,
    Seen,
    Stop,
    decide_activation,
    normalize_scalar,
    register_effect,
)

NOW = 1_000_000.0
LIMITS = ChainLimits(
    max_depth=3,
    max_activations=5,
    rate_limit=3,
    rate_window_s=3600,
    workflow_rate_limit=100,
    workflow_rate_window_s=3600,
    dedupe_window_s=600,
    chain_ttl_s=86_400,
)
R = ActivationReason


def fp(value: Any) -> str:
    """A stand-in fingerprint: the RFC 8785 text itself (the service HMACs it)."""
    return canonical_json(value).decode()


def prints(content: dict[str, Any]) -> FieldPrints:
    return FieldPrints(
        normal={k: fp(normalize_scalar(v)) for k, v in content.items()},
        strict={k: fp(v) for k, v in content.items()},
        missing_normal=fp(None),
        missing_strict=fp(None),
    )


def request(
    content: dict[str, Any],
    marker: Marker | None = None,
    workflow: str = "wf",
    has_subject: bool = True,
    markers: tuple[Marker, ...] = (),
) -> ActivationRequest:
    found = markers or ((marker,) if marker else ())
    return ActivationRequest(
        workflow, "a1", "cnew", fp(content), prints(content), found, has_subject
    )


def link(
    chain_id: str = "c1", depth: int = 0, workflow: str = "wf", expires_at: float = NOW + 1000
) -> Link:
    return Link(workflow, chain_id, depth, expires_at)


def chain(
    chain_id: str = "c1",
    depth: int = 0,
    activations: int = 1,
    expires_at: float = NOW + 1000,
    workflow: str = "wf",
) -> Chain:
    return Chain(chain_id, workflow, depth, activations, 0, 0, NOW - 10, NOW - 10, expires_at)


def effect(
    fields: dict[str, Any],
    strict: bool = False,
    workflow: str = "wf",
    chain_id: str = "c1",
    depth: int = 0,
    expires_at: float = NOW + 1000,
) -> Effect:
    prints_ = {k: fp(v if strict else normalize_scalar(v)) for k, v in fields.items()}
    return Effect("e1", workflow, chain_id, depth, prints_, strict, NOW - 5, expires_at)


def decide(
    state: ActivationState, req: ActivationRequest, limits: ChainLimits = LIMITS, now: float = NOW
) -> tuple[Any, Any]:
    return decide_activation(state, req, limits, now)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (42, "42"),
        (42, 42.0),
        (" 42 ", 42),
        ("4.50", 4.5),
        ("", 0),
        ("", False),
        ("", None),
        (0, "0"),
        (False, "false"),
        (True, "TRUE"),
        ("  processed ", "processed"),
        ("-7", -7),
    ],
)
def test_normalization_equates(a: Any, b: Any) -> None:
    assert fp(normalize_scalar(a)) == fp(normalize_scalar(b))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (42, 43),
        ("42", "42a"),
        ("processed", "Processed"),
        (1, True),
        ("nan", "NaN "),
        ("2026-11-03", 46329),
        ({"a": 1}, {"a": "1"}),
        ("Infinity", "inf"),
        ("+4915112345678", "4915112345678"),
        ("01234", "1234"),
        ("1e3", 1000),
        ("12345678901234567890", "12345678901234567891"),
    ],
)
def test_normalization_keeps_apart(a: Any, b: Any) -> None:
    assert fp(normalize_scalar(a)) != fp(normalize_scalar(b))


def test_new_work_starts_a_chain_at_depth_zero() -> None:
    changes, out = decide(ActivationState(), request({"a": 1}))
    assert (out.decision, out.reason, out.depth, out.chain_id) == (
        ActivationDecision.PROCEED,
        R.NEW_CHAIN,
        0,
        "cnew",
    )
    assert changes.chain.activations == 1 and changes.chain.expires_at == NOW + 86_400
    assert changes.seen == Seen(fp({"a": 1}), NOW)
    assert changes.subject_rate == RateLog((NOW,))


def test_workflow_stop_comes_first() -> None:
    state = ActivationState(workflow_stop=Stop(NOW, "x", "op"), seen=Seen(fp({"a": 1}), NOW - 1))
    changes, out = decide(state, request({"a": 1}))
    assert out.reason is R.STOPPED and changes.seen is None


def test_chain_stop_applies_to_the_chain_joined() -> None:
    state = ActivationState(chains={"c1": chain()}, chain_stops={"c1": Stop(NOW, "x", "op")})
    _, out = decide(state, request({"a": 1}, Marker("c1", 0)))
    assert out.reason is R.STOPPED and out.chain_id == "c1"
    _, out = decide(state, request({"a": 1}))  # not in that chain
    assert out.reason is R.NEW_CHAIN


def test_duplicate_inside_window_only() -> None:
    state = ActivationState(seen=Seen(fp({"a": 1}), NOW - 599))
    _, out = decide(state, request({"a": 1}))
    assert out.reason is R.DUPLICATE_EVENT
    _, out = decide(replace(state, seen=Seen(fp({"a": 1}), NOW - 600)), request({"a": 1}))
    assert out.reason is R.NEW_CHAIN
    _, out = decide(state, request({"a": 2}))  # same event, new content
    assert out.reason is R.NEW_CHAIN


def test_duplicate_beats_echo_and_marker() -> None:
    state = ActivationState(
        seen=Seen(fp({"s": "done"}), NOW - 1),
        own_effect=effect({"s": "done"}),
        chains={"c1": chain()},
    )
    _, out = decide(state, request({"s": "done"}, Marker("c1", 0)))
    assert out.reason is R.DUPLICATE_EVENT


def test_echo_compares_only_the_effects_fields_normalized() -> None:
    state = ActivationState(
        own_effect=effect({"status": "processed", "score": 0}), chains={"c1": chain()}
    )
    changes, out = decide(state, request({"status": " processed", "score": "", "row": 5}))
    assert out.reason is R.ECHO and out.chain_id == "c1"
    assert changes.chain.drops == 1 and changes.chain.activations == 1
    assert changes.subject_rate is None and changes.workflow_rate is None


def test_strict_effect_needs_exact_values() -> None:
    state = ActivationState(own_effect=effect({"score": 42}, strict=True), chains={"c1": chain()})
    assert decide(state, request({"score": 42.0}))[1].reason is R.ECHO
    assert decide(state, request({"score": "42"}))[1].reason is R.EXTERNAL_CHANGE


def test_external_change_ignores_the_stale_marker_and_starts_a_new_chain() -> None:
    state = ActivationState(
        own_effect=effect({"notes": "a"}), chains={"c1": chain(depth=3, activations=5)}
    )
    _, out = decide(state, request({"notes": "b"}, Marker("c1", 3)))
    assert (out.decision, out.reason, out.depth, out.chain_id) == (
        ActivationDecision.PROCEED,
        R.EXTERNAL_CHANGE,
        0,
        "cnew",
    )


def test_external_change_is_still_rate_limited() -> None:
    state = ActivationState(
        own_effect=effect({"notes": "a"}), subject_rate=RateLog((NOW - 3, NOW - 2, NOW - 1))
    )
    _, out = decide(state, request({"notes": "b"}))
    assert out.reason is R.ACTIVATION_RATE


def test_expired_effect_is_ignored() -> None:
    state = ActivationState(own_effect=effect({"s": 1}, expires_at=NOW), chains={"c1": chain()})
    assert decide(state, request({"s": 1}))[1].reason is R.NEW_CHAIN


def test_marker_reentry_depth_and_budget() -> None:
    state = ActivationState(chains={"c1": chain(depth=1, activations=2)})
    changes, out = decide(state, request({"a": 1}, Marker("c1", 1)))
    assert (out.reason, out.depth, out.chain_id) == (R.REENTRY, 2, "c1")
    assert changes.chain.activations == 3 and changes.chain.depth == 2
    _, out = decide(state, request({"a": 1}, Marker("c1", 3)))
    assert (out.decision, out.reason, out.depth) == (ActivationDecision.DROP, R.CHAIN_DEPTH, 4)
    full = ActivationState(chains={"c1": chain(activations=5)})
    _, out = decide(full, request({"a": 1}, Marker("c1", 0)))
    assert out.reason is R.CHAIN_BUDGET


def test_marker_of_expired_or_unknown_chain_counts_as_none() -> None:
    expired = ActivationState(chains={"c1": chain(expires_at=NOW)})
    assert decide(expired, request({"a": 1}, Marker("c1", 2)))[1].reason is R.NEW_CHAIN
    assert decide(ActivationState(), request({"a": 1}, Marker("c9", 2)))[1].reason is R.NEW_CHAIN


def test_links_continue_the_chain() -> None:
    related = ActivationState(links=(link(depth=2),), chains={"c1": chain()})
    _, out = decide(related, request({"a": 1}))
    assert (out.reason, out.depth) == (R.REENTRY, 3)
    expired = ActivationState(links=(link(depth=2, expires_at=NOW),), chains={"c1": chain()})
    assert decide(expired, request({"a": 1}))[1].reason is R.NEW_CHAIN


def test_a_dead_deeper_marker_never_hides_a_live_one() -> None:
    state = ActivationState(chains={"c1": chain(depth=1)})
    _, out = decide(state, request({"a": 1}, markers=(Marker("cdead", 3), Marker("c1", 1))))
    assert (out.reason, out.chain_id, out.depth) == (R.REENTRY, "c1", 2)


def test_reentry_is_rate_limited_too() -> None:
    """A loop that restarts its chain at every hop (depth 1 forever) still ends."""
    log = RateLog((NOW - 3, NOW - 2, NOW - 1))
    state = ActivationState(links=(link(),), chains={"c1": chain()}, subject_rate=log)
    changes, out = decide(state, request({"a": 1}))
    assert out.reason is R.ACTIVATION_RATE and changes.seen is None


def test_deepest_link_wins() -> None:
    state = ActivationState(
        links=(link(depth=0),), chains={"c1": chain(), "c2": chain("c2", depth=2)}
    )
    _, out = decide(state, request({"a": 1}, Marker("c2", 2)))
    assert (out.chain_id, out.depth) == ("c2", 3)


def test_subject_rate_counts_only_proceeded_inside_window() -> None:
    log = RateLog((NOW - 3700, NOW - 30, NOW - 20))
    changes, out = decide(ActivationState(subject_rate=log), request({"a": 1}))
    assert out.reason is R.NEW_CHAIN and out.subject_activations_in_window == 3
    assert changes.subject_rate == RateLog((NOW - 30, NOW - 20, NOW))
    changes, out = decide(ActivationState(subject_rate=changes.subject_rate), request({"a": 2}))
    assert out.reason is R.ACTIVATION_RATE and changes.subject_rate is None
    assert changes.seen is None  # a redelivery after the window is judged anew


def test_no_subject_no_subject_rate() -> None:
    log = RateLog((NOW - 3, NOW - 2, NOW - 1))
    _, out = decide(ActivationState(subject_rate=log), request({"a": 1}, has_subject=False))
    assert out.reason is R.NEW_CHAIN


def test_workflow_rate_circuit_breaker() -> None:
    limits = replace(LIMITS, workflow_rate_limit=2)
    counter = RateCounter()
    reasons = []
    for i in range(4):
        changes, out = decide(
            ActivationState(workflow_rate=counter),
            request({"i": i}, has_subject=False),
            limits,
            NOW + i,
        )
        reasons.append(out.reason)
        counter = changes.workflow_rate or counter
    assert reasons == [R.NEW_CHAIN, R.NEW_CHAIN, R.WORKFLOW_RATE, R.WORKFLOW_RATE]


def test_rate_counter_slides() -> None:
    c = RateCounter()
    for t in range(10):
        c = c.add(NOW + t, 100)
    assert c.estimate(NOW + 50, 100) == 10
    assert c.estimate(NOW + 150, 100) == pytest.approx(5.0)  # half the old window overlaps
    assert c.estimate(NOW + 400, 100) == 0


def test_a_decision_names_the_side_of_the_workflow_rate_it_stood_on() -> None:
    """Admitted: the estimate was below the limit; refused for the rate: at or
    above it; refused before the rate was asked: the counts did not decide."""
    limits = replace(LIMITS, workflow_rate_limit=10, workflow_rate_window_s=100)
    start = 1_000_000.0  # a window's start: at +25, a quarter of it has passed
    counter = RateCounter(start, count=4, previous=6)  # 6 * 0.75 + 4 = 8.5
    changes, out = decide(
        ActivationState(workflow_rate=counter), request({"a": 1}), limits, start + 25
    )
    assert out.reason is R.NEW_CHAIN
    assert changes.rate_bound == RateBound(previous_weight=0.75, below=10)
    full = RateCounter(start, count=4, previous=8)  # 8 * 0.75 + 4 = 10
    changes, out = decide(
        ActivationState(workflow_rate=full), request({"a": 1}), limits, start + 25
    )
    assert out.reason is R.WORKFLOW_RATE
    assert changes.rate_bound == RateBound(previous_weight=0.75, at_least=10)
    seen = Seen(fp({"a": 1}), start)  # a duplicate: dropped before the rate counts
    changes, out = decide(
        ActivationState(workflow_rate=full, seen=seen), request({"a": 1}), limits, start + 25
    )
    assert out.reason is R.DUPLICATE_EVENT
    assert changes.rate_bound is None


def test_recent_timeline_is_bounded() -> None:
    state = ActivationState(chains={"c1": chain()})
    c = state.chains["c1"]
    for _ in range(60):
        changes, _ = decide(
            replace(state, chains={"c1": c}, links=(link(),)),
            request({"a": 1}),
            replace(LIMITS, max_activations=1000),
        )
        c = changes.chain
    assert len(c.recent) == 50 and c.activations == 61


def test_register_effect_takes_chain_depth_and_life() -> None:
    req = EffectRequest("wf", "e9", "cnew", {"s": "x"}, False, None)
    new_chain, eff = register_effect(chain(depth=2), req, LIMITS, NOW)
    assert (eff.chain_id, eff.depth, eff.expires_at) == ("c1", 2, NOW + 1000)
    assert new_chain.effects == 1
    _, eff = register_effect(chain(), replace(req, ttl_s=60), LIMITS, NOW)
    assert eff.expires_at == NOW + 60
    fresh, eff = register_effect(chain(expires_at=NOW), req, LIMITS, NOW)
    assert fresh.chain_id == "cnew" and eff.depth == 0 and fresh.effects == 1

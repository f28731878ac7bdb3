"""Prometheus metrics (``prometheus-client``), correct across gunicorn workers.

``loopstop serve`` points ``PROMETHEUS_MULTIPROC_DIR`` at a private folder
before the workers start; each worker writes its samples there and
``/metrics`` aggregates them (the library's multiprocess mode). Without that
variable (tests, a single process) the default registry is used.

Metric names (all prefixed ``loopstop_``):

======================================  ======================================
``decisions_total{route,decision,reason}``  every decision the sidecar made
``decision_seconds{route}``             decision latency (histogram)
``task_envelopes_total{status,reason}`` tasks ended, by terminal status/reason
``invalid_markers_total``               markers that did not verify
``store_errors_total``                  requests answered 503 (store unavailable)
``store_round_trips_total``             round trips to a Redis store
``store_conflicts_total``               compare-and-sets that found a change
``model_turns_total{decision}``         model-gate turns admitted / denied
``model_tokens_total``                  tokens the upstream model reported
``operations_awaiting_reconciliation``  open operations whose outcome is unknown
                                        (a gauge read from the store at scrape)
``operations_open``                     open operations (in progress or unknown),
                                        the count ``max_open_per_workflow`` bounds
``auth_failures_total{reason}``         requests refused before authentication
                                        succeeded (missing/unknown token, foreign
                                        origin or host, CSRF, not loopback)
``task_outliers_total{measure,action}`` running tasks flagged past the workflow's mean
``tasks_running_long``                  running tasks older than ``outliers.running_s``
                                        (a gauge read from the store at scrape)
``n8n_cancellations_total{kind,state}`` stops that asked n8n, by what n8n confirmed
``n8n_executions_stopped_total{result}`` executions a stop asked n8n about, by result
======================================  ======================================

Labels never carry ids (tasks, chains, operations) or payload values: their
number stays bounded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

DECISIONS = Counter(
    "loopstop_decisions_total",
    "Decisions made, by route, decision and reason.",
    ["route", "decision", "reason"],
)
LATENCY = Histogram(
    "loopstop_decision_seconds",
    "Time to decide, by route.",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
ENVELOPES = Counter(
    "loopstop_task_envelopes_total",
    "Tasks ended, by terminal status and reason.",
    ["status", "reason"],
)
INVALID_MARKERS = Counter(
    "loopstop_invalid_markers_total", "Markers found in events that did not verify."
)
STORE_ERRORS = Counter(
    "loopstop_store_errors_total", "Requests answered 503 because the store failed."
)
MODEL_TURNS = Counter(
    "loopstop_model_turns_total", "Model-gate turns, admitted or denied.", ["decision"]
)
STORE_ROUND_TRIPS = Counter(
    "loopstop_store_round_trips_total",
    "Requests sent to a Redis or PostgreSQL store (one per round trip).",
)
STORE_CONFLICTS = Counter(
    "loopstop_store_conflicts_total",
    "Compare-and-sets (Redis, PostgreSQL) that found a document changed since it was read "
    "(the transaction re-ran on the current documents).",
)
TASK_OUTLIERS = Counter(
    "loopstop_task_outliers_total",
    "Running tasks flagged as outliers (past outliers.factor x the workflow's mean), "
    "by measure and configured action.",
    ["measure", "action"],
)
N8N_CANCELLATIONS = Counter(
    "loopstop_n8n_cancellations_total",
    "Stops that asked n8n to stop executions, by stop kind and outcome "
    "(confirmed, partial, failed, not_configured, nothing_to_stop).",
    ["kind", "state"],
)
N8N_EXECUTIONS = Counter(
    "loopstop_n8n_executions_stopped_total",
    "Executions a stop asked n8n about, by result (stopped, finished, already_finished, "
    "unconfirmed, not_found).",
    ["result"],
)
MODEL_TOKENS = Counter(
    "loopstop_model_tokens_total", "Tokens the upstream model reported through the gate."
)

AUTH_FAILURES = Counter(
    "loopstop_auth_failures_total",
    "Requests refused for authentication: missing or unknown token, foreign "
    "origin or host, bad CSRF token, caller not on loopback.",
    ["reason"],
)

CONTENT_TYPE = CONTENT_TYPE_LATEST


def _known_reasons() -> frozenset[str]:
    """Every decision and reason the product names: the members of its enums."""
    from sidecar.auth import LoginDecision
    from sidecar.core import tasks
    from sidecar.core.chains import ActivationDecision, ActivationReason, EffectDecision
    from sidecar.core.check_verdicts import CheckDecision, CheckReason
    from sidecar.core.operations import (
        BeginDecision,
        BeginReason,
        FailOutcome,
        OperationState,
        ReconcileOutcome,
    )
    from sidecar.core.stops import StopDecision

    enums = (
        CheckDecision,
        CheckReason,
        ActivationDecision,
        ActivationReason,
        EffectDecision,
        StopDecision,
        LoginDecision,
        *tasks.DECISION_ENUMS,
        BeginDecision,
        BeginReason,
        FailOutcome,
        OperationState,
        ReconcileOutcome,
    )
    return frozenset(str(member) for enum in enums for member in enum)


_KNOWN: frozenset[str] | None = None


def label(value: str) -> str:
    """A decision or reason as a label value: one of the product's own names, else
    ``other`` (an operator's free-text stop reason must not become a series)."""
    global _KNOWN
    if _KNOWN is None:
        _KNOWN = _known_reasons() | {""}
    return value if value in _KNOWN else "other"


class _StoreGauge(Collector):
    """Reads a count from the store at scrape time."""

    def __init__(self, name: str, help_text: str, count: Callable[[], int]) -> None:
        self.name = name
        self.help_text = help_text
        self.count = count

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(self.name, self.help_text)
        try:
            gauge.add_metric([], float(self.count()))
        except Exception:
            gauge.add_metric([], float("nan"))
        yield gauge


def exposition(
    count_unknown: Callable[[], int],
    count_open: Callable[[], int] | None = None,
    count_long: Callable[[], int] | None = None,
) -> bytes:
    """The text exposition of every metric, aggregated over all workers."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        samples = generate_latest(registry)
    else:
        samples = generate_latest(REGISTRY)
    gauge = CollectorRegistry()
    gauge.register(
        _StoreGauge(
            "loopstop_operations_awaiting_reconciliation",
            "Open operations whose outcome is unknown (production namespace).",
            count_unknown,
        )
    )
    if count_open is not None:
        gauge.register(
            _StoreGauge(
                "loopstop_operations_open",
                "Open operations, in progress or unknown (production namespace).",
                count_open,
            )
        )
    if count_long is not None:
        gauge.register(
            _StoreGauge(
                "loopstop_tasks_running_long",
                "Running tasks older than outliers.running_s (production namespace).",
                count_long,
            )
        )
    return samples + generate_latest(gauge)

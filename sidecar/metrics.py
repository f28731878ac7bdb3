"""Prometheus metrics (``prometheus-client``), built per app and correct across
gunicorn workers.

:func:`sidecar.app.create_app` builds one :class:`Metrics` (its own
:class:`~prometheus_client.CollectorRegistry`) and passes it down: views read
it from the runtime, services get it at construction, and the store reports
its round trips and conflicts to two of its counters through the callbacks
it was built with (:class:`sidecar.store.StoreEvents`). Importing this module
creates no metric, so two apps in one process count apart and every test
gets fresh counters.

``loopstop serve`` points ``PROMETHEUS_MULTIPROC_DIR`` at a private folder
before it imports this module (prometheus-client reads the variable when it
is imported) and before the workers start; each worker writes its samples
there and ``/metrics`` aggregates them (the library's multiprocess mode).
Without that variable (tests, a single process) ``/metrics`` reads the
app's own registry.

Metric names (all prefixed ``loopstop_``):

======================================  ======================================
``decisions_total{route,decision,reason}``  every decision the sidecar made
``decision_seconds{route}``             decision latency (histogram)
``task_envelopes_total{status,reason}`` tasks ended, by terminal status/reason
``invalid_markers_total``               markers that did not verify
``store_errors_total``                  requests answered 503 (store unavailable)
``store_round_trips_total``             round trips to a Redis or PostgreSQL store
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
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

#: Where ``loopstop serve`` has its workers write their samples.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class Metrics:
    """Every counter and histogram of one app, on a registry of its own.

    :param known_labels: the decisions and reasons the product names (the
        members of its enums): :meth:`label` keeps them, anything else is
        counted as ``other``.

    With :data:`MULTIPROC_ENV` set in the process's environment (where
    prometheus-client itself reads it), ``/metrics`` aggregates the samples
    every worker wrote to that folder.
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, known_labels: Iterable[str] = ()) -> None:
        self.multiprocess_dir = os.environ.get(MULTIPROC_ENV) or None
        self.registry = CollectorRegistry()
        self._known = frozenset(known_labels) | {""}
        #: (route, decision, reason) label values -> the decision counter's and
        #: the latency histogram's children (:meth:`decided`).
        self._bound: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        r = self.registry
        self.decisions = Counter(
            "loopstop_decisions_total",
            "Decisions made, by route, decision and reason.",
            ["route", "decision", "reason"],
            registry=r,
        )
        self.decision_seconds = Histogram(
            "loopstop_decision_seconds",
            "Time to decide, by route.",
            ["route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=r,
        )
        self.task_envelopes = Counter(
            "loopstop_task_envelopes_total",
            "Tasks ended, by terminal status and reason.",
            ["status", "reason"],
            registry=r,
        )
        self.invalid_markers = Counter(
            "loopstop_invalid_markers_total",
            "Markers found in events that did not verify.",
            registry=r,
        )
        self.store_errors = Counter(
            "loopstop_store_errors_total",
            "Requests answered 503 because the store failed.",
            registry=r,
        )
        self.model_turns = Counter(
            "loopstop_model_turns_total",
            "Model-gate turns, admitted or denied.",
            ["decision"],
            registry=r,
        )
        self.store_round_trips = Counter(
            "loopstop_store_round_trips_total",
            "Requests sent to a Redis or PostgreSQL store (one per round trip).",
            registry=r,
        )
        self.store_conflicts = Counter(
            "loopstop_store_conflicts_total",
            "Compare-and-sets (Redis, PostgreSQL) that found a document changed since it was "
            "read (the transaction re-ran on the current documents).",
            registry=r,
        )
        self.task_outliers = Counter(
            "loopstop_task_outliers_total",
            "Running tasks flagged as outliers (past outliers.factor x the workflow's mean), "
            "by measure and configured action.",
            ["measure", "action"],
            registry=r,
        )
        self.n8n_cancellations = Counter(
            "loopstop_n8n_cancellations_total",
            "Stops that asked n8n to stop executions, by stop kind and outcome "
            "(confirmed, partial, failed, not_configured, nothing_to_stop).",
            ["kind", "state"],
            registry=r,
        )
        self.n8n_executions = Counter(
            "loopstop_n8n_executions_stopped_total",
            "Executions a stop asked n8n about, by result (stopped, finished, "
            "already_finished, unconfirmed, not_found).",
            ["result"],
            registry=r,
        )
        self.model_tokens = Counter(
            "loopstop_model_tokens_total",
            "Tokens the upstream model reported through the gate.",
            registry=r,
        )
        self.auth_failures = Counter(
            "loopstop_auth_failures_total",
            "Requests refused for authentication: missing or unknown token, foreign "
            "origin or host, bad CSRF token, caller not on loopback.",
            ["reason"],
            registry=r,
        )

    def decided(self, route: str, decision: str, reason: str, elapsed_s: float | None) -> None:
        """Count one decision (and observe its latency when known).

        The labelled children are looked up once per (route, decision,
        reason) label values and kept, so a decision costs one increment and
        one observation. The cache is bounded as the series are: the routes
        and the product's own names, anything else counted as ``other``.
        """
        key = (route, self.label(decision), self.label(reason))
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = (
                self.decisions.labels(*key),
                self.decision_seconds.labels(route),
            )
        if elapsed_s is not None:
            bound[1].observe(elapsed_s)
        bound[0].inc()

    def label(self, value: str) -> str:
        """A decision or reason as a label value: one of the product's own names, else
        ``other`` (an operator's free-text stop reason must not become a series)."""
        return value if value in self._known else "other"

    def exposition(
        self,
        count_unknown: Callable[[], int],
        count_open: Callable[[], int] | None = None,
        count_long: Callable[[], int] | None = None,
    ) -> bytes:
        """The text exposition of every metric (aggregated over all workers in
        multiprocess mode), and the gauges read from the store now."""
        if self.multiprocess_dir:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(  # type: ignore[no-untyped-call]
                registry, self.multiprocess_dir
            )
            samples = generate_latest(registry)
        else:
            samples = generate_latest(self.registry)
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

"""One structured JSON log line per decision (DESIGN "Observability"), the
decision counters and latency histogram of the app's :class:`~sidecar.metrics.Metrics`,
and the log line and counter of a refused authentication.

Never raw payloads, arguments, tokens or secrets: only ids, the decision,
its reason, fingerprint prefixes and the acting token's name.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from flask import g, request

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
from sidecar.errors import LoopstopError
from sidecar.runtime import runtime

log = logging.getLogger("loopstop.decisions")
auth_log = logging.getLogger("loopstop")

#: Every enum whose members the product answers or logs as a decision or a
#: reason: the label values of the decision counter (anything else, such as an
#: operator's free-text stop reason, is counted as ``other``).
LABEL_ENUMS: tuple[type[StrEnum], ...] = (
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


def label_values() -> frozenset[str]:
    """Every decision and reason the product names: the members of :data:`LABEL_ENUMS`."""
    return frozenset(str(member) for enum in LABEL_ENUMS for member in enum)


def log_decision(route: str, decision: Any, reason: Any, **fields: Any) -> None:
    """Count the decision and emit its log line (skipped, not built, below INFO)."""
    metrics = runtime().metrics
    started = getattr(g, "started", None)
    elapsed = None if started is None else time.perf_counter() - started
    if elapsed is not None:
        metrics.decision_seconds.labels(route).observe(elapsed)
    metrics.decisions.labels(
        route,
        metrics.label("" if decision is None else str(decision)),
        metrics.label("" if reason is None else str(reason)),
    ).inc()
    if not log.isEnabledFor(logging.INFO):
        return
    principal = getattr(g, "principal", None)
    line = {
        "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "event": "decision",
        "request_id": getattr(g, "request_id", None),
        "route": route,
        "decision": None if decision is None else str(decision),
        "reason": None if reason is None else str(reason),
        "token": principal.name if principal else None,
        "method": request.method,
        **{k: v for k, v in fields.items() if v is not None},
    }
    if elapsed is not None:
        line["latency_ms"] = round(elapsed * 1000, 3)
    log.info(json.dumps(line, separators=(",", ":"), default=str))


def auth_failure(exc: LoopstopError, route: str, client: str | None, token: str | None) -> None:
    """Log and count a refused authentication (the token's name when known, never its value)."""
    runtime().metrics.auth_failures.labels(exc.slug).inc()
    auth_log.warning(
        "authentication refused: %s (route %s, client %s%s)",
        exc.detail,
        route,
        client or "unknown",
        f", token {token!r}" if token else "",
    )

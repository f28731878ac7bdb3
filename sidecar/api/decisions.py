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

import orjson
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


#: What orjson would write its own way is given to ``default=str``, as
#: ``json.dumps`` wrote it (timestamps, dataclasses).
_AS_STR = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def log_decision(route: str, decision: Any, reason: Any, **fields: Any) -> None:
    """Count the decision and emit its log line (skipped, not built, below INFO).

    The line is one JSON document written by orjson (``json.dumps`` for what
    orjson refuses: an integer past 64 bits), built only when INFO is enabled;
    the metrics are :meth:`~sidecar.metrics.Metrics.decided`'s pre-bound children.
    """
    scope = g._get_current_object()
    started = getattr(scope, "started", None)
    elapsed = None if started is None else time.perf_counter() - started
    runtime().metrics.decided(
        route,
        "" if decision is None else str(decision),
        "" if reason is None else str(reason),
        elapsed,
    )
    if not log.isEnabledFor(logging.INFO):
        return
    principal = getattr(scope, "principal", None)
    line = {
        "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "event": "decision",
        "request_id": getattr(scope, "request_id", None),
        "route": route,
        "decision": None if decision is None else str(decision),
        "reason": None if reason is None else str(reason),
        "token": principal.name if principal else None,
        "method": request.method,
        **{k: v for k, v in fields.items() if v is not None},
    }
    if elapsed is not None:
        line["latency_ms"] = round(elapsed * 1000, 3)
    try:
        text = orjson.dumps(line, default=str, option=_AS_STR).decode()
    except TypeError:
        text = json.dumps(line, separators=(",", ":"), default=str)
    log.info(text)


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

"""One structured JSON log line per decision (DESIGN "Observability"), and
the decision counters and latency histogram of :mod:`sidecar.metrics`.

Never raw payloads, arguments, tokens or secrets: only ids, the decision,
its reason, fingerprint prefixes and the acting token's name.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from flask import g, request

from sidecar import metrics

log = logging.getLogger("loopstop.decisions")


def log_decision(route: str, decision: Any, reason: Any, **fields: Any) -> None:
    """Count the decision and emit its log line (skipped, not built, below INFO)."""
    started = getattr(g, "started", None)
    elapsed = None if started is None else time.perf_counter() - started
    if elapsed is not None:
        metrics.LATENCY.labels(route).observe(elapsed)
    metrics.DECISIONS.labels(
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

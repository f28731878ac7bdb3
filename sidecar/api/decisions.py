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
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

import orjson
from flask import g

from sidecar.auth import LoginDecision, Principal
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
from sidecar.runtime import Runtime, runtime

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


class Scope(Protocol):
    """What a decision knows of its request: Flask's ``g`` on the Flask path
    (set by the app's ``_authenticate`` hook), :class:`sidecar.api.hot.HotScope`
    on the hot path.

    :ivar started: :func:`time.perf_counter` when the request arrived (seconds).
    :ivar ns: the record namespace (``p`` production, ``t`` test) once a view set it.
    """

    request_id: str
    started: float
    principal: Principal
    method: str
    runtime: Runtime
    ns: str


#: The longest ``X-Request-Id`` taken as the caller sent it (characters).
MAX_REQUEST_ID = 200


def request_id(environ: Mapping[str, Any]) -> str:
    """A request's id: the ``X-Request-Id`` it sent (1 to :data:`MAX_REQUEST_ID`
    characters), else a new random one (32 hex digits)."""
    incoming: str = environ.get("HTTP_X_REQUEST_ID", "")
    return incoming if 0 < len(incoming) <= MAX_REQUEST_ID else uuid.uuid4().hex


def log_decision(route: str, decision: Any, reason: Any, **fields: Any) -> None:
    """:func:`record_decision` for the request of the current Flask context."""
    record_decision(g._get_current_object(), route, decision, reason, **fields)


def record_decision(scope: Scope, route: str, decision: Any, reason: Any, **fields: Any) -> None:
    """Count the decision and emit its log line (skipped, not built, below INFO).

    The line is one JSON document written by orjson (``json.dumps`` for what
    orjson refuses: an integer past 64 bits), built only when INFO is enabled;
    the metrics are :meth:`~sidecar.metrics.Metrics.decided`'s pre-bound children.
    """
    started = getattr(scope, "started", None)
    elapsed = None if started is None else time.perf_counter() - started
    scope.runtime.metrics.decided(
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
        "method": scope.method,
        **{k: v for k, v in fields.items() if v is not None},
    }
    if elapsed is not None:
        line["latency_ms"] = round(elapsed * 1000, 3)
    try:
        text = orjson.dumps(line, default=str, option=_AS_STR).decode()
    except TypeError:
        text = json.dumps(line, separators=(",", ":"), default=str)
    _emit(text)


#: The format a handler writes a decision line with, the line alone (``loopstop serve``'s).
_MESSAGE_ONLY = "%(message)s"


def _plain_handlers() -> list[logging.StreamHandler[Any]] | None:
    """The handlers a decision line goes to, when each would write the line
    itself and nothing else: a plain :class:`logging.StreamHandler` formatting
    ``%(message)s`` with no filter, on loggers with no filter (``loopstop
    serve`` sets one such handler). None otherwise (any other handler, format
    or filter, none at all, a disabled logger): the line then goes through
    :mod:`logging` as any record.
    """
    found: list[logging.StreamHandler[Any]] = []
    logger: logging.Logger | None = log
    while logger is not None:
        if logger.filters or logger.disabled:
            return None
        for handler in logger.handlers:
            fmt = handler.formatter
            if (
                type(handler) is not logging.StreamHandler
                or handler.filters
                or handler.level > logging.INFO
                or type(fmt) is not logging.Formatter
                or type(fmt._style) is not logging.PercentStyle
                or fmt._style._fmt != _MESSAGE_ONLY
            ):
                return None
            found.append(handler)
        logger = logger.parent if logger.propagate else None
    return found or None


def _emit(text: str) -> None:
    """Log ``text`` at INFO. To plain handlers (:func:`_plain_handlers`) the
    line is written as :meth:`logging.StreamHandler.emit` writes it (the text,
    the terminator, a flush, under the handler's lock), without the record,
    the caller look-up and the formatting the line does not use; otherwise,
    or when a write fails, through :mod:`logging`."""
    handlers = _plain_handlers()
    if handlers is None:
        log.info(text)
        return
    for handler in handlers:
        try:
            with handler.lock:  # type: ignore[union-attr]
                handler.stream.write(text + handler.terminator)
                handler.flush()
        except Exception:
            # As logging would: the handler reports the failure its own way.
            handler.handle(
                log.makeRecord(log.name, logging.INFO, "(unknown file)", 0, text, (), None)
            )


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

"""The one error family of loopstop.

Every failure the service reports is a subclass of :class:`LoopstopError`.
Each class says when it is raised and carries its HTTP status and the last
segment of its RFC 9457 problem ``type``; one Flask error handler
(:mod:`sidecar.api.problems`) renders all of them as
``application/problem+json``. Views never build error bodies.

Decisions (``execute``, ``replay``, ``drop``...) are not errors: they are
ordinary 200 answers. Errors are for requests that cannot be decided.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PROBLEM_TYPE_PREFIX = "urn:loopstop:problem:"


class LoopstopError(Exception):
    """Base of every loopstop error.

    :param detail: a sentence for the caller, never containing secrets or
        raw payloads.
    :param extra: further members of the problem document (RFC 9457 §3.2
        extension members), for example the current record on a conflict.
    """

    status: int = 500
    slug: str = "internal-error"
    title: str = "Internal error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra: dict[str, Any] = extra

    @property
    def type_uri(self) -> str:
        """The problem ``type`` URI, ending in :attr:`slug`."""
        return PROBLEM_TYPE_PREFIX + self.slug


class MalformedRequest(LoopstopError):
    """Raised when the body is not parseable JSON (or misses a required line)."""

    status = 400
    slug = "malformed-request"
    title = "Malformed request"


class Unauthenticated(LoopstopError):
    """Raised when the bearer token is missing or matches no configured token."""

    status = 401
    slug = "unauthenticated"
    title = "Authentication required"


class Forbidden(LoopstopError):
    """Raised when the token's scope does not cover the workflow or action."""

    status = 403
    slug = "forbidden"
    title = "Outside the token's scope"


class MisdirectedRequest(LoopstopError):
    """Raised when, without tokens, the ``Host`` is not a loopback name with the
    bound port (a foreign name resolving to 127.0.0.1: DNS rebinding; RFC 9110 §15.5.20)."""

    status = 421
    slug = "misdirected-request"
    title = "Misdirected request"


class ForeignOrigin(Forbidden):
    """Raised when a request's ``Origin`` is not the server's own (a web page of
    another site driving the sidecar: CSRF)."""

    slug = "foreign-origin"
    title = "Request from another origin"


class TooManyOpen(LoopstopError):
    """Raised when a workflow already holds ``operations.max_open_per_workflow``
    open operations: a new ``begin`` waits until some are settled."""

    status = 429
    slug = "too-many-open-operations"
    title = "Too many open operations"


class ChecksBusy(LoopstopError):
    """Raised when ``checks_concurrency`` outside calls are running and one more
    waited its turn in vain (fail closed: nothing is admitted on a guess)."""

    status = 503
    slug = "checks-busy"
    title = "Checks busy"


class NotFound(LoopstopError):
    """Raised when a named resource (operation, task, chain, check) does not exist."""

    status = 404
    slug = "not-found"
    title = "Not found"


class StateConflict(LoopstopError):
    """Raised when a request contradicts the record's state (RFC 9110 §15.5.10).

    The current record, when there is one, travels in ``extra["operation"]``
    (or the resource's own name) so the caller can see why.
    """

    status = 409
    slug = "state-conflict"
    title = "State conflict"


class StaleAttempt(StateConflict):
    """Raised when ``commit``/``fail`` carries an attempt that is no longer current.

    The attempt number is the fencing token returned by ``begin``: a late
    answer from an attempt that was superseded changes nothing.
    """

    slug = "stale-attempt"
    title = "Stale attempt"


class PayloadTooLarge(LoopstopError):
    """Raised when the body exceeds ``http.max_body_bytes``."""

    status = 413
    slug = "payload-too-large"
    title = "Payload too large"


class UnsupportedMediaType(LoopstopError):
    """Raised when a body is sent with a content type other than JSON."""

    status = 415
    slug = "unsupported-media-type"
    title = "Unsupported media type"


class ValidationFailed(LoopstopError):
    """Raised when fields are invalid; ``errors`` lists ``{loc, msg}`` per field.

    ``loc`` is a list starting with ``"body"``, ``"path"`` or ``"query"``.
    """

    status = 422
    slug = "validation-failed"
    title = "Invalid request fields"

    def __init__(self, errors: Sequence[Mapping[str, Any]], detail: str | None = None) -> None:
        errs = [{"loc": list(e["loc"]), "msg": str(e["msg"])} for e in errors]
        if detail is None:
            first = errs[0] if errs else {"loc": [], "msg": "invalid"}
            where = ".".join(str(p) for p in first["loc"]) or "request"
            detail = f"{where}: {first['msg']}"
            if len(errs) > 1:
                detail += f" (and {len(errs) - 1} more)"
        super().__init__(detail, errors=errs)
        self.errors = errs


class StoreUnavailable(LoopstopError):
    """Raised when the store cannot be reached or a transaction cannot commit.

    Fail closed: nothing is admitted without a committed reservation.
    Driver errors (``sqlite3.Error``, ``redis.RedisError``) are translated
    into this class at the store boundary (``raise ... from exc``).
    """

    status = 503
    slug = "store-unavailable"
    title = "Store unavailable"


class GateNotConfigured(LoopstopError):
    """Raised when the model gate is called but ``model_gate.upstream_url`` is not set."""

    status = 503
    slug = "model-gate-not-configured"
    title = "Model gate not configured"


class UpstreamError(LoopstopError):
    """Raised when the upstream model answered an error, garbage, or could not be reached.

    Rendered in the API's own error shape (``body``, made by the wire
    adapter: ``{"error": {...}}`` for OpenAI) with ``status``, which is what
    n8n's chat model nodes understand, not as problem+json.

    :param status: the HTTP status to answer (the upstream's own error status,
        504 for a timeout, 502 for an unreachable or unreadable upstream).
    :param reason: how reading the answer failed (``timeout``,
        ``upstream_stream_cut``), None when the upstream answered an error
        status or could not be reached.
    :param received: the bytes of the answer read before it failed.
    """

    status = 502
    slug = "upstream-error"
    title = "Upstream model error"

    def __init__(
        self, status: int, body: dict[str, Any], *, reason: str | None = None, received: int = 0
    ) -> None:
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        super().__init__(str(message or "upstream error"))
        self.status = status
        self.body = body
        self.reason = reason
        self.received = received
        #: the turn it ended, for the decision log (None: no turn was admitted);
        #: the gate service's ``TurnRecord``
        self.record: object | None = None


class ConfigError(LoopstopError):
    """Raised when the configuration (file or environment) is invalid.

    :param problems: ``(path, message)`` pairs, the path dotted
        (``tokens.0.env``), one per error.
    """

    status = 500
    slug = "configuration-error"
    title = "Configuration error"

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        lines = "; ".join(f"{p}: {m}" if p else m for p, m in self.problems)
        super().__init__(lines or "invalid configuration")


class SchemaMismatch(ConfigError):
    """Raised at start-up when the store's schema version is newer than this server's."""

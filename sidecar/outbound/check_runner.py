"""Running checks: the calls a check makes to the system of record (DESIGN §4).

A check answers whether a claim holds: the order is confirmed, the comment
exists, every page was read, every write committed. A model's ``done: true``
is never enough. Checks are named in the configuration and run by the
sidecar through an injected :class:`requests.Session`, never inside a store
transaction; the verdicts and the rules over them are
:mod:`sidecar.core.check_verdicts`, who may run a check is
:mod:`sidecar.core.check_scope`, and :mod:`sidecar.service.check_service`
runs checks for the routes, the tasks and the ledger.

A check never passes by default: a system of record that cannot answer
fails the check with ``unreachable``, ``timeout`` or ``bad_response``.

Kinds:

- ``http``: a request whose URL template is fixed in configuration;
  placeholders (``{order_id}``, or any JMESPath such as ``{result.id}``)
  are filled from the input and percent-encoded into the path and the query
  only, never the scheme or host (no SSRF); no redirects are followed;
  expected statuses; JMESPath assertions that must all be truthy; an
  optional JMESPath giving the integer revision. The answer is read by
  :mod:`sidecar.outbound.bounded_read` within ``timeout_s`` and
  :data:`MAX_RESPONSE_BYTES` (decompressed).
- ``json_schema``: the input (or a JMESPath into it) validates against a
  JSON Schema (draft 2020-12).
- ``cursor``: pagination lineage per task; pure store logic, see
  :func:`sidecar.core.check_verdicts.cursor_step`.
- ``operations``: every listed operation id is ``committed``.
- ``all`` / ``any``: combinations.

At most ``http.checks_concurrency`` outside calls run at once per worker;
one more waits ``http.checks_wait_s`` and then fails closed (503,
:class:`~sidecar.errors.ChecksBusy`).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import jmespath
import jsonschema
import requests

from sidecar.config_sections import (
    CheckConfig,
    CombinedCheck,
    CursorCheck,
    HttpCheck,
    JsonSchemaCheck,
    OperationsCheck,
)
from sidecar.core.check_verdicts import CheckReason, CheckResult, combine
from sidecar.errors import ChecksBusy
from sidecar.outbound.bounded_read import (
    BodyBroken,
    BodyTooLarge,
    BodyTooSlow,
    read_body,
    send_unread,
)

_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")

#: The largest answer a check reads from a system of record.
MAX_RESPONSE_BYTES = 1_048_576
#: Revisions are integers a double holds exactly (RFC 7493).
MAX_REVISION = 2**53 - 1


def fill_url(template: str, data: Any) -> str:
    """The URL of an ``http`` check, placeholders filled from ``data``.

    Placeholders stand only in the path and the query (the configuration is
    validated so). Each value is percent-encoded as one path segment (``/``,
    ``\\``, ``?``, ``#`` and ``@`` cannot escape it) or one query value; a
    value that is empty or only dots (``.``, ``..``) is refused.

    :raises KeyError: a placeholder finds no value in ``data``.
    """
    parts = urlsplit(template)

    def fill(text: str, encode: Callable[[str], str]) -> str:
        def one(match: re.Match[str]) -> str:
            value = jmespath.search(match.group(1).strip(), data)
            if value is None or isinstance(value, dict | list):
                raise KeyError(match.group(1))
            text_value = str(value).lower() if isinstance(value, bool) else str(value)
            if text_value.strip(".") == "":
                # "", "." and ".." would name the parent or the collection: an HTTP
                # client re-decodes %2E, so such a value is refused, not encoded.
                raise KeyError(match.group(1))
            return encode(text_value)

        return _PLACEHOLDER.sub(one, text)

    def path_segment(value: str) -> str:
        return quote(value, safe="")

    def query_value(value: str) -> str:
        return quote(value, safe="")

    return urlunsplit(
        (
            parts.scheme,
            parts.netloc,
            fill(parts.path, path_segment),
            fill(parts.query, query_value),
            "",
        )
    )


def _env_headers(cfg: HttpCheck, environ: Mapping[str, str]) -> dict[str, str]:
    headers = {}
    for name, value in cfg.headers.items():
        headers[name] = (
            value if isinstance(value, str) else value.prefix + environ.get(value.env, "")
        )
    return headers


def run_http(
    cfg: HttpCheck, data: Any, session: requests.Session, environ: Mapping[str, str]
) -> CheckResult:
    """Ask the system of record: one request, no redirects, the whole answer
    read within ``timeout_s`` and :data:`MAX_RESPONSE_BYTES`
    (:func:`~sidecar.outbound.bounded_read.read_body`)."""
    try:
        url = fill_url(cfg.url, data)
    except KeyError as exc:
        return CheckResult(
            False, CheckReason.MISSING_INPUT, evidence={"missing": str(exc).strip("'")}
        )
    evidence: dict[str, Any] = {"method": cfg.method, "url": url}
    started = time.perf_counter()
    deadline = started + cfg.timeout_s
    try:
        with send_unread(
            session,
            cfg.method,
            url,
            _env_headers(cfg, environ),
            (min(cfg.timeout_s, 3.0), cfg.timeout_s),
        ) as resp:
            status = resp.status_code
            raw = read_body(resp, deadline, MAX_RESPONSE_BYTES, time.perf_counter)
    except (requests.Timeout, BodyTooSlow):
        return CheckResult(
            False, CheckReason.TIMEOUT, evidence={**evidence, "timeout_s": cfg.timeout_s}
        )
    except BodyTooLarge as exc:
        evidence.update(status=status, error=str(exc))
        return CheckResult(False, CheckReason.BAD_RESPONSE, evidence=evidence)
    except BodyBroken as exc:  # a read timed out mid-body, or the body broke off
        reason = CheckReason.TIMEOUT if exc.timed_out else CheckReason.UNREACHABLE
        return CheckResult(False, reason, evidence={**evidence, "error": exc.error})
    except Exception as exc:  # requests', the socket's, anything else the transport raises
        return CheckResult(
            False, CheckReason.UNREACHABLE, evidence={**evidence, "error": type(exc).__name__}
        )
    evidence["status"] = status
    evidence["elapsed_ms"] = round((time.perf_counter() - started) * 1000, 1)
    if status not in cfg.expect_status:
        return CheckResult(False, CheckReason.UNEXPECTED_STATUS, evidence=evidence)
    if not cfg.assert_ and cfg.revision is None:
        return CheckResult(True, CheckReason.PASSED, evidence=evidence)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return CheckResult(
            False, CheckReason.BAD_RESPONSE, evidence={**evidence, "error": "the body is not JSON"}
        )
    results = []
    for expr in cfg.assert_:
        try:
            ok = bool(jmespath.search(expr, body))
        except (jmespath.exceptions.JMESPathError, RecursionError):
            ok = False
        results.append({"assert": expr, "ok": ok})
    evidence["assertions"] = results
    revision = None
    if cfg.revision is not None:
        value = jmespath.search(cfg.revision, body)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (isinstance(value, float) and (not math.isfinite(value) or value != int(value)))
            or not 0 <= value <= MAX_REVISION
        ):
            evidence["error"] = f"revision is not an integer in range: {cfg.revision}"
            return CheckResult(False, CheckReason.BAD_RESPONSE, evidence=evidence)
        revision = int(value)
    if not all(r["ok"] for r in results):
        return CheckResult(False, CheckReason.ASSERTION_FAILED, revision, evidence)
    return CheckResult(True, CheckReason.PASSED, revision, evidence)


def run_json_schema(cfg: JsonSchemaCheck, data: Any) -> CheckResult:
    """Validate the input (or ``path`` into it) against the schema (draft 2020-12)."""
    target = jmespath.search(cfg.path, data) if cfg.path else data
    validator = jsonschema.Draft202012Validator(cfg.schema_)
    errors = sorted(validator.iter_errors(target), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        return CheckResult(
            False,
            CheckReason.SCHEMA_INVALID,
            evidence={
                "errors": [{"path": list(e.absolute_path), "msg": e.message} for e in errors[:5]],
                "count": len(errors),
                "first": first.message,
            },
        )
    return CheckResult(True, CheckReason.PASSED)


StorePart = Callable[[str, Any], CheckResult]


class CheckRunner:
    """The configured checks, runnable by name.

    Running is two-phase so that no request is ever made inside a store
    transaction: :meth:`prefetch` runs the parts that ask the outside world
    (``http``, ``json_schema``), then :meth:`run` combines those results
    with the parts that read the store (``cursor``, ``operations``), which
    the caller runs inside its transaction.

    :param checks: the configuration's ``checks`` section.
    :param session: the HTTP session (tests inject theirs).
    :param environ: where header secrets are read.
    :param concurrency: outside calls running at once (per process).
    :param wait_s: how long one more call waits for its turn before
        :class:`~sidecar.errors.ChecksBusy`.
    """

    def __init__(
        self,
        checks: Mapping[str, CheckConfig],
        session: requests.Session,
        environ: Mapping[str, str],
        concurrency: int = 4,
        wait_s: float = 1.0,
    ) -> None:
        self.configs = dict(checks)
        self.session = session
        self.environ = environ
        self.concurrency = concurrency
        self.wait_s = wait_s
        self._slots = threading.BoundedSemaphore(concurrency)

    def _ask(self, cfg: HttpCheck, data: Any) -> CheckResult:
        """One outside call, within the concurrency bound.

        :raises ChecksBusy: every slot stayed taken for ``wait_s``.
        """
        if not self._slots.acquire(timeout=self.wait_s):
            raise ChecksBusy(
                f"{self.concurrency} checks are already asking systems of record; retry shortly"
            )
        try:
            return run_http(cfg, data, self.session, self.environ)
        finally:
            self._slots.release()

    def __contains__(self, name: object) -> bool:
        return name in self.configs

    def needs_store(self, name: str) -> bool:
        """True when the check (or a part of it) reads the store (cursor, operations)."""
        cfg = self.configs[name]
        if isinstance(cfg, CombinedCheck):
            return any(self.needs_store(n) for n in cfg.of)
        return isinstance(cfg, CursorCheck | OperationsCheck)

    def prefetch(self, name: str, data: Any) -> dict[str, CheckResult]:
        """Run every outside part of ``name`` now (outside any transaction)."""
        cfg = self.configs[name]
        if isinstance(cfg, CombinedCheck):
            out: dict[str, CheckResult] = {}
            for part in cfg.of:
                out.update(self.prefetch(part, data))
            return out
        if isinstance(cfg, HttpCheck):
            return {name: self._ask(cfg, data)}
        if isinstance(cfg, JsonSchemaCheck):
            return {name: run_json_schema(cfg, data)}
        return {}

    def run(
        self,
        name: str,
        data: Any,
        fetched: Mapping[str, CheckResult],
        store_part: StorePart | None = None,
    ) -> CheckResult:
        """The verdict of ``name`` from prefetched parts and store parts.

        :raises KeyError: a store part is needed and no ``store_part`` was given.
        """
        cfg = self.configs[name]
        if isinstance(cfg, CombinedCheck):
            return combine(cfg.kind, [self.run(p, data, fetched, store_part) for p in cfg.of])
        if name in fetched:
            return fetched[name]
        if store_part is None:
            raise KeyError(name)
        return store_part(name, data)

"""Check verdicts and the checks' pure rules (DESIGN §4): reasons, results,
a ``cursor`` check's page (its memory is :mod:`sidecar.core.lineage`) and
how ``all`` / ``any`` combine their parts. Who may run a check is
:mod:`sidecar.core.check_scope`; running one (HTTP, JSON Schema) is
:mod:`sidecar.outbound.check_runner`; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sidecar.core.lineage import Lineage, step_page


class CheckReason(StrEnum):
    """Why a check passed or failed (a closed set: metrics label values)."""

    PASSED = "passed"
    UNEXPECTED_STATUS = "unexpected_status"
    ASSERTION_FAILED = "assertion_failed"
    SCHEMA_INVALID = "schema_invalid"
    CYCLE = "cycle"
    NO_NEW_RECORDS = "no_new_records"
    NOT_COMMITTED = "not_committed"
    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    BAD_RESPONSE = "bad_response"
    MISSING_INPUT = "missing_input"


class CheckDecision(StrEnum):
    """What ``POST /v1/checks/{name}`` logs."""

    PASSED = "passed"
    FAILED = "failed"

    @classmethod
    def of(cls, passed: bool) -> CheckDecision:
        return cls.PASSED if passed else cls.FAILED


#: Reasons that mean the system of record could not answer (nothing was learned).
CANNOT_RUN = frozenset({CheckReason.UNREACHABLE, CheckReason.TIMEOUT, CheckReason.BAD_RESPONSE})


@dataclass(frozen=True)
class CheckResult:
    """A verdict: ``passed``, the ``reason``, an optional ``revision`` and evidence.

    ``evidence`` never holds secrets (no request headers).
    """

    passed: bool
    reason: CheckReason
    revision: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def cannot_run(self) -> bool:
        return self.reason in CANNOT_RUN

    def as_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reason": str(self.reason),
            "revision": self.revision,
            "evidence": self.evidence,
        }


def cursor_step(
    lineage: Lineage, cursor_fp: str | None, id_fps: Iterable[str]
) -> tuple[Lineage, CheckResult]:
    """One page of a pagination lineage (pure): the rule and its fixed-size
    memory are :func:`sidecar.core.lineage.step_page`'s, with the error rate
    stated there (it may take an old page for new, never a new page for old).

    A page with record ids not seen before passes, whatever its cursor (some
    APIs advance server-side behind a constant handle); a cursor seen before
    with no new ids fails ``cycle``; any other page with no new ids fails
    ``no_new_records``. The revision is the number of distinct ids seen.
    """
    new, page = step_page(lineage, cursor_fp, id_fps)
    evidence = {
        "new_records": page.new_records,
        "records_seen": page.records_seen,
        "cursor_seen_before": page.cursor_seen_before,
    }
    return new, CheckResult(page.passed, CheckReason(page.reason), page.records_seen, evidence)


def combine(kind: str, results: list[CheckResult]) -> CheckResult:
    """``all``: every part passes (the first failure's reason otherwise);
    ``any``: one part passes. Revision: the highest a part reported."""
    revisions = [r.revision for r in results if r.revision is not None]
    revision = max(revisions) if revisions else None
    evidence = {"parts": [r.as_dict() for r in results]}
    if kind == "all":
        failed = next((r for r in results if not r.passed), None)
        if failed is None:
            return CheckResult(True, CheckReason.PASSED, revision, evidence)
        return CheckResult(False, failed.reason, revision, evidence)
    passed = next((r for r in results if r.passed), None)
    if passed is not None:
        return CheckResult(True, CheckReason.PASSED, revision, evidence)
    reason = results[-1].reason if results else CheckReason.ASSERTION_FAILED
    return CheckResult(False, reason, revision, evidence)

"""Running checks for the routes, the tasks and the ledger (DESIGN §4): the
outside parts before a transaction (through :mod:`sidecar.outbound.check_runner`),
the store parts inside it, and who may run which check
(:func:`sidecar.core.check_scope.open_to`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import jmespath

from sidecar.auth import Principal
from sidecar.canonical import Fingerprinter, canonical_json
from sidecar.config_sections import CombinedCheck, CursorCheck, OperationsCheck
from sidecar.core.check_scope import CheckScope, open_to
from sidecar.core.check_verdicts import CheckReason, CheckResult, cursor_step
from sidecar.core.lineage import Lineage
from sidecar.core.operations import OperationPolicy, OperationState, observe
from sidecar.core.tasks import CheckVerdict, Task
from sidecar.errors import Forbidden, NotFound
from sidecar.outbound.check_runner import CheckRunner, StorePart
from sidecar.service import keys, mappers, records
from sidecar.service.records import Txn
from sidecar.store import Store

_OPERATION_ID = re.compile(r"(?!\.{1,2}\Z)[A-Za-z0-9._:@-]{1,200}")


def verdict(result: CheckResult) -> CheckVerdict:
    """The part of a check's result the task guard decides on."""
    return CheckVerdict(result.passed, str(result.reason), result.revision, result.cannot_run)


class CheckService:
    """Runs configured checks by name: for ``POST /v1/checks/{name}``, for the
    task service (tool and exit checks, inside its transaction) and for the
    ledger (reconcile checks, outside any transaction).

    :param runner: the configured checks and their outside calls.
    :param retention_s: how long a cursor check's lineage is kept.
    :param ledger_policy: the ledger's policy (an operations check reads its records).
    :ivar scopes: name -> what :func:`~sidecar.core.check_scope.open_to` reads.
    :ivar shapes: name -> ``(kind, parts)``, what the ledger's rules read
        (:func:`~sidecar.core.operations.asks_system_of_record`).
    """

    def __init__(
        self,
        store: Store,
        fingerprinter: Fingerprinter,
        runner: CheckRunner,
        retention_s: float,
        clock: Callable[[], float],
        ledger_policy: OperationPolicy,
    ) -> None:
        self.store = store
        self.fp = fingerprinter
        self.runner = runner
        self.retention_s = retention_s
        self.clock = clock
        self.lineages = mappers.lineages(retention_s)
        self.operations = mappers.Operations(ledger_policy)
        parts = {
            n: tuple(c.of) if isinstance(c, CombinedCheck) else ()
            for n, c in runner.configs.items()
        }
        self.scopes = {
            n: CheckScope(frozenset(c.workflows or ()), parts[n]) for n, c in runner.configs.items()
        }
        self.shapes = {n: (c.kind, parts[n]) for n, c in runner.configs.items()}

    def __contains__(self, name: object) -> bool:
        return name in self.runner

    def is_open(self, principal: Principal, name: str, workflow: str | None = None) -> bool:
        """True when ``principal`` may run ``name`` (for ``workflow``; None: any
        of its workflows); False for a check that does not exist."""
        return open_to(name, self.scopes, principal.workflows, workflow)

    def names(self, principal: Principal) -> list[tuple[str, str]]:
        """(name, kind) of every check ``principal`` may run, by name: a scoped
        token does not learn of checks outside its workflows."""
        return sorted(
            (name, cfg.kind)
            for name, cfg in self.runner.configs.items()
            if self.is_open(principal, name)
        )

    def needs_store(self, name: str) -> bool:
        """True when check ``name`` (or a part of it) reads the store."""
        return self.runner.needs_store(name)

    def prefetch(self, name: str, data: Any) -> dict[str, CheckResult]:
        """Run every outside part of ``name`` now: before the transaction that
        :meth:`run_in` runs in (see :meth:`.CheckRunner.prefetch`).

        :raises ChecksBusy: too many checks are asking systems of record.
        """
        return self.runner.prefetch(name, data)

    def run_outside(self, name: str, data: Any) -> CheckResult:
        """Run ``name``, a check that reads no store, now (outside any transaction).

        :raises KeyError: the check reads the store (see :meth:`needs_store`).
        :raises ChecksBusy: too many checks are asking systems of record.
        """
        return self.runner.run(name, data, self.runner.prefetch(name, data))

    def run_in(
        self,
        txn: Txn,
        principal: Principal,
        ns: str,
        task_id: str | None,
        name: str,
        data: Any,
        fetched: Any,
        scope: str = "",
    ) -> CheckResult:
        """Run check ``name`` inside ``txn``. A cursor lineage remembers the page
        only when the whole check passed: a page another part of an ``all`` refused
        was not accepted, and must not look old when it comes again corrected.

        :param scope: separates cursor lineages of one task (a tool's name:
            two tools sharing a cursor check page through different lists).
        """
        pages: list[tuple[str, Lineage]] = []
        result = self.runner.run(
            name, data, fetched, self.store_part(txn, principal, ns, task_id, scope, pages)
        )
        if result.passed:
            for key, lineage in pages:
                txn.refresh(self.lineages, ns, key, lineage)
        return result

    def store_part(
        self,
        txn: Txn,
        principal: Principal,
        ns: str,
        task_id: str | None,
        scope: str = "",
        pages: list[tuple[str, Lineage]] | None = None,
    ) -> StorePart:
        """The store-reading parts of checks, bound to one transaction.

        :param scope: separates cursor lineages of one task (a tool's name:
            two tools sharing a cursor check page through different lists).
        :param pages: where a cursor part puts the lineage it would write (the
            caller writes them); None: written at once.
        """

        def part(name: str, data: Any) -> CheckResult:
            cfg = self.runner.configs[name]
            if isinstance(cfg, OperationsCheck):
                workflow = None
                if task_id is not None:
                    task = Task.from_doc(txn.doc(keys.task(ns, task_id)))
                    workflow = task.workflow if task is not None else None
                elif principal.workflows is not None and len(principal.workflows) == 1:
                    (workflow,) = principal.workflows
                return self._operations(cfg, data, txn, principal, ns, workflow)
            assert isinstance(cfg, CursorCheck)
            if task_id is None:
                return CheckResult(
                    False, CheckReason.MISSING_INPUT, evidence={"missing": "task_id"}
                )
            key = keys.lineage(ns, task_id, f"{name}:{scope}" if scope else name)
            lineage = txn.read(self.lineages, key) or Lineage.from_doc(None)
            cursor = jmespath.search(cfg.cursor, data)
            records = jmespath.search(cfg.records, data)
            ids = records if isinstance(records, list) else []
            cursor_fp = (
                None
                if cursor is None
                else self.fp.key_hash("cursor", canonical_json(cursor).decode())
            )
            id_fps = [self.fp.key_hash("record", canonical_json(i).decode()) for i in ids]
            new, result = cursor_step(lineage, cursor_fp, id_fps)
            if pages is None:
                txn.refresh(self.lineages, ns, key, new)
            else:
                pages.append((key, new))
            return result

        return part

    def _operations(
        self,
        cfg: OperationsCheck,
        data: Any,
        txn: Txn,
        principal: Principal,
        ns: str,
        workflow: str | None,
    ) -> CheckResult:
        """Every listed id committed, each looked up in ``workflow``'s namespace."""
        ids = jmespath.search(cfg.operations, data)
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            return CheckResult(
                False, CheckReason.MISSING_INPUT, evidence={"missing": cfg.operations}
            )
        states: dict[str, str] = {}
        for oid in ids:
            if not isinstance(oid, str) or not _OPERATION_ID.fullmatch(oid):
                states[str(oid)[:200]] = "missing"
                continue
            _, op = self.operations.locate(txn, ns, (oid, workflow))
            if op is None or not principal.allows(op.workflow):
                states[oid] = "missing"
            else:
                states[oid] = str(observe(op, txn.now).state)
        committed = all(v == OperationState.COMMITTED for v in states.values())
        evidence = {"operations": states}
        if committed:
            return CheckResult(True, CheckReason.PASSED, evidence=evidence)
        return CheckResult(False, CheckReason.NOT_COMMITTED, evidence=evidence)

    def require_open(self, principal: Principal, name: str, workflow: str | None) -> None:
        """Before anything is fetched: the token may run ``name`` (for ``workflow``).

        :raises Forbidden: a scoped token outside the check's ``workflows``.
        """
        if not self.is_open(principal, name, workflow):
            raise Forbidden(
                f"check {name!r} is not open to token {principal.name!r}'s workflows "
                "(the check's workflows list)"
            )

    def run(
        self, principal: Principal, ns: str, name: str, data: Any, task_id: str | None
    ) -> CheckResult:
        """Run ``name`` on ``data``; ``task_id`` scopes a cursor lineage.

        :raises NotFound: no such check (to a token holding every workflow), or no
            such task.
        :raises Forbidden: the task belongs to a workflow outside the scope, or the
            check is not open to a scoped token (or absent: the same answer).
        """
        if name not in self:
            if principal.workflows is not None:  # a scoped token cannot tell absent from closed
                self.require_open(principal, name, None)
            raise NotFound(f"no check named {name!r}")
        workflow = None
        if task_id is not None:
            doc = self.store.get(keys.task(ns, task_id))
            if doc is None:
                raise NotFound(f"no task {task_id!r}")
            workflow = Task.from_doc(doc).workflow  # type: ignore[union-attr]
            principal.require(workflow, of_record=True)
        self.require_open(principal, name, workflow)
        if not self.needs_store(name):
            return self.run_outside(name, data)
        fetched = self.prefetch(name, data)
        now = self.clock()
        task_key = keys.task(ns, task_id) if task_id else None

        def step(txn: Txn) -> CheckResult:
            if task_key is not None:
                task = Task.from_doc(txn.doc(task_key))
                if task is None:
                    raise NotFound(f"no task {task_id!r}")
                principal.require(task.workflow, of_record=True)
            return self.run_in(txn, principal, ns, task_id, name, data, fetched)

        return records.run(self.store, [task_key] if task_key else [], step, now)


def check_input(result: Any, receipt: Any) -> Mapping[str, Any]:
    """What a tool's check sees: the result object, with ``receipt`` beside it."""
    data = dict(result) if isinstance(result, dict) else {"result": result}
    if receipt is not None:
        data.setdefault("receipt", receipt)
    return data

"""The logical key layout, written down once.

Every key starts with the namespace of the request's ``execution_mode``:
``p`` (production) or ``t`` (test, a run from the n8n editor), so that a
test run never consumes production dedupe windows, chains, budgets or
ledger entries. The store adds its own prefix (``loopstop:`` on Redis).

==============================  ==============================================
pattern                         what
==============================  ==============================================
``<ns>:op:<wf>/<operation_id>``  an operation in its workflow's namespace (JSON)
``<ns>:op:<operation_id>``      an operation in the shared namespace (``scope:
                                "shared"``, or a begin naming no workflow) (JSON)
``ui:revoked:<h(session)>``     a logged-out operator-page session, until its cookie ends
``stop:wf:<workflow>``          a sticky stop of a workflow, every namespace (JSON)
``<ns>:stop:chain:<chain_id>``  a sticky stop of a chain (JSON)
``<ns>:ix:ops-open``            index: open operations, score = lease end; a member
                                is the operation's address (``<wf>/<id>`` or ``<id>``)
``<ns>:ix:ops-open:wf:<wf>``    the same index for one workflow
``<ns>:chain:<chain_id>``       a chain of activations (JSON), TTL = its life
``<ns>:effect:<wf>:<h(target)>``  a workflow's effect, one copy per target (JSON)
``<ns>:link:<h(target)>``       the chain the last effect on a target belongs to
``<ns>:seen:<wf>:<h(event)>``   last content seen of an event (dedupe window)
``<ns>:rate:subj:<wf>:<h(s)>``  proceeded activations of a subject (rate window)
``<ns>:rate:wf:<wf>:<n>``       activations of a workflow in fixed window n
``<ns>:task:<task_id>``         a guarded agent task (JSON)
``<ns>:taskkey:<wf>:<h(key)>``  the task made under a ``task_key`` (JSON)
``<ns>:lineage:<task>:<check>``  pages a task read (cursor check) (JSON)
``<ns>:ix:chains``              index: live chains, score = last activity
``<ns>:ix:tasks``               index: tasks, score = last activity
``<ns>:ix:tasks-running``       index: running tasks, score = created_at
``<ns>:taskwatch:<task_id>``    n8n executions of a task, its outlier mark (JSON)
``<ns>:totals:<wf>:<measure>``  sums over a workflow's finished tasks (counter)
``<ns>:cancel:<kind>:<id>``     what the last stop asked n8n and saw (JSON)
``<ns>:ix:unconfirmed``         index: stops whose last cancellation left executions
                                unconfirmed, score = its time; member ``<kind>:<id>``
==============================  ==============================================

``h(...)`` is a keyed hash (:meth:`Fingerprinter.key_hash`): identities
such as Message-IDs and addresses never appear in keys.
"""

from __future__ import annotations

from typing import Literal

ExecutionMode = Literal["test", "production"]


def namespace(mode: ExecutionMode | None) -> str:
    """``t`` for n8n's ``test`` executions, ``p`` for everything else."""
    return "t" if mode == "test" else "p"


def operation(ns: str, operation_id: str, workflow: str | None) -> str:
    """An operation's key: in ``workflow``'s namespace, or the shared one (None).

    An operation id never holds ``/`` (its pattern), so ``<wf>/<id>`` splits
    at the last ``/`` and no workflow's key can be another's or a shared one.
    """
    return f"{ns}:op:{operation_address(operation_id, workflow)}"


def operation_address(operation_id: str, workflow: str | None) -> str:
    """The member an operation has in the open indexes (its key without ``<ns>:op:``)."""
    return operation_id if workflow is None else f"{workflow}/{operation_id}"


def operation_at(ns: str, address: str) -> str:
    """The key of the operation at ``address`` (an index member)."""
    return f"{ns}:op:{address}"


def ui_revoked(session_hash: str) -> str:
    return f"ui:revoked:{session_hash}"


def workflow_stop(workflow: str) -> str:
    """A workflow stop holds in test and production executions alike."""
    return f"stop:wf:{workflow}"


def chain_stop(ns: str, chain_id: str) -> str:
    return f"{ns}:stop:chain:{chain_id}"


def open_operations(ns: str, workflow: str | None = None) -> str:
    """The index of open operations, for all workflows or one."""
    base = f"{ns}:ix:ops-open"
    return base if workflow is None else f"{base}:wf:{workflow}"


def chain(ns: str, chain_id: str) -> str:
    return f"{ns}:chain:{chain_id}"


def effect(ns: str, workflow: str, target_hash: str) -> str:
    return f"{ns}:effect:{workflow}:{target_hash}"


def link(ns: str, target_hash: str) -> str:
    return f"{ns}:link:{target_hash}"


def seen(ns: str, workflow: str, event_hash: str) -> str:
    return f"{ns}:seen:{workflow}:{event_hash}"


def subject_rate(ns: str, workflow: str, subject_hash: str) -> str:
    return f"{ns}:rate:subj:{workflow}:{subject_hash}"


def workflow_rate(ns: str, workflow: str, window: int) -> str:
    """The count of a workflow's activations in fixed window number ``window``."""
    return f"{ns}:rate:wf:{workflow}:{window}"


def task(ns: str, task_id: str) -> str:
    return f"{ns}:task:{task_id}"


def task_key(ns: str, workflow: str | None, key_hash: str) -> str:
    return f"{ns}:taskkey:{workflow or ''}:{key_hash}"


def lineage(ns: str, task_id: str, check: str) -> str:
    return f"{ns}:lineage:{task_id}:{check}"


def recent_chains(ns: str) -> str:
    return f"{ns}:ix:chains"


def recent_tasks(ns: str) -> str:
    return f"{ns}:ix:tasks"


def running_tasks(ns: str) -> str:
    """Index of tasks without an envelope yet, scored by creation time."""
    return f"{ns}:ix:tasks-running"


def task_watch(ns: str, task_id: str) -> str:
    """The n8n executions that acted for a task, and its outlier mark."""
    return f"{ns}:taskwatch:{task_id}"


def task_totals(ns: str, workflow: str | None, measure: str) -> str:
    """A sum over the workflow's finished tasks (``tasks``, ``tokens``, ...)."""
    return f"{ns}:totals:{workflow or ''}:{measure}"


def cancellation(ns: str, kind: str, ident: str) -> str:
    """What the last stop of a ``workflow``, ``chain`` or ``task`` asked n8n and saw."""
    return f"{ns}:cancel:{kind}:{ident}"


def unconfirmed_cancellations(ns: str) -> str:
    """Index of the stops whose last cancellation left executions ``unconfirmed``."""
    return f"{ns}:ix:unconfirmed"

"""Sticky stops (DESIGN §2 "Stops", §1, §3): the one stop check the activation
gate, the ledger and the task guard share.

A stop is set by an admin on a workflow (every namespace) or on a chain and
holds until resumed. A request is covered by the stop of its workflow, else
by the stop of its chain; the workflow's is named first when both hold.
Each domain answers a covered request in its own words (an activation is
dropped ``stopped``; a ``begin`` is answered ``stopped`` with
``workflow_stopped`` / ``chain_stopped``; a task ends ``stopped`` with the
same reasons): those words are mapped from :class:`StopScope` in the
domain's core.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class Stop:
    """A sticky stop of a workflow or a chain.

    :ivar at: when it was set (epoch seconds).
    :ivar reason: the operator's words.
    :ivar actor: the token that set it.
    """

    at: float
    reason: str
    actor: str


class StopScope(StrEnum):
    """What a covering stop was set on."""

    WORKFLOW = "workflow"
    CHAIN = "chain"


class StopDecision(StrEnum):
    """What a stop or resume route logs."""

    STOPPED = "stopped"
    RESUMED = "resumed"


def covering(workflow_stop: Stop | None, chain_stop: Stop | None) -> StopScope | None:
    """Which stop covers a request: its workflow's, else its chain's, else none."""
    if workflow_stop is not None:
        return StopScope.WORKFLOW
    if chain_stop is not None:
        return StopScope.CHAIN
    return None


def set_stop(current: Stop | None, stop: Stop) -> Stop:
    """Stopping is idempotent: a stop already set is kept as it was (its time,
    reason and actor), a new one is ``stop``."""
    return current if current is not None else stop

"""The model gate's money and settles (DESIGN §3 ``max_cost``, §5): what a turn
reserves before it is forwarded, and its settle once it is over.

The reservation is a bound of what the request can cost
(:func:`sidecar.core.cost.worst_case`): its bytes, its output limit (the
configured default is sent as the limit of a priced request that sets none)
and its choices. Under a money budget a request whose cost its own bytes do
not bound is refused, naming the field, and so is a model with no price: by
the turn's admission, which reads the task anyway (no read of its own here).

A settle the store refuses (paused, failing over) is retried at once, then
kept in the worker and applied before its next turn, oldest first: a
reservation is never held for ever while the worker lives, and a turn's
tokens are never lost to a store that came back.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.config import ModelGateConfig
from sidecar.core import cost
from sidecar.core.tasks import Task
from sidecar.errors import NotFound, StoreUnavailable
from sidecar.gate.wire.base import WireAdapter, input_bound
from sidecar.service.tasks import TaskService

#: Waits (seconds) before the retries of a settle the store refused; then the
#: settle is kept and applied before the worker's next turn.
SETTLE_RETRIES_S = (0.05, 0.25)
#: The most settles a worker keeps for later (a store down for long).
SETTLES_KEPT = 10_000
#: Tokens reserved for the wrap-up note the gate may add to a request.
NOTE_TOKENS = 256


@dataclass(frozen=True)
class Reservation:
    """A turn's request as it will be forwarded, its model's price (None:
    unpriced) and the money it reserves (None: nothing).

    :ivar unbudgeted: what a task with a money budget refuses the turn with
        (a ``ValidationFailed`` entry: the model has no price, or the request
        does not bound its cost); None when the turn fits any budget. The
        turn's admission applies it (:meth:`TaskService.model_call`), with the
        task it reads anyway.
    """

    body: dict[str, Any]
    price: cost.Price | None = None
    amount: float | None = None
    unbudgeted: Mapping[str, Any] | None = None


class GateMoney:
    """Reservations and settles for one gate (see the module)."""

    def __init__(
        self,
        config: ModelGateConfig,
        tasks: TaskService,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self.tasks = tasks
        self.sleep = sleep
        self._kept: deque[Callable[[], object]] = deque(maxlen=SETTLES_KEPT)
        self._lock = threading.Lock()

    def reserve(self, adapter: WireAdapter, body: dict[str, Any], model: str) -> Reservation:
        """The turn's :class:`Reservation` (no store read: a task with a money
        budget refuses an unpriced or unbounded turn at its admission, through
        :attr:`Reservation.unbudgeted`)."""
        found = self.config.prices.get(model)
        spend = adapter.spend(body)
        unbudgeted = None
        if found is None or spend.unbounded is not None:
            unbudgeted = _refusal(model, found is None, spend.unbounded)
        if found is None:
            return Reservation(body, unbudgeted=unbudgeted)
        price = cost.Price(found.input_per_mtok, found.output_per_mtok)
        limit = adapter.max_output_tokens(body)
        if limit is None:
            limit = self.config.max_output_tokens
            body = adapter.with_output_limit(body, limit)
        sent = input_bound(adapter.forward_payload(body, model)) + NOTE_TOKENS
        amount = cost.worst_case(price, sent, limit, spend.choices)
        return Reservation(body, price, amount, unbudgeted)

    def settle(self, apply: Callable[[], Task]) -> Task | None:
        """``apply`` a turn's settle, retried while the store refuses it; kept
        for later (None) when it still does."""
        for wait_s in (*SETTLE_RETRIES_S, None):
            try:
                return apply()
            except StoreUnavailable:
                if wait_s is None:
                    break
                self.sleep(wait_s)
        with self._lock:
            self._kept.append(apply)
        return None

    def settle_kept(self) -> int:
        """Apply the settles the store refused earlier, oldest first, until it
        refuses again; returns how many are still kept."""
        while True:
            with self._lock:
                if not self._kept:
                    return 0
                apply = self._kept.popleft()
            try:
                apply()
            except StoreUnavailable:
                with self._lock:
                    self._kept.appendleft(apply)
                    return len(self._kept)
            except NotFound:
                continue  # the task expired meanwhile: nothing left to settle


def _refusal(model: str, unpriced: bool, field: str | None) -> Mapping[str, Any]:
    if unpriced or field is None:
        return {
            "loc": ["body", "model"],
            "msg": f"model {model!r} has no price in model_gate.prices, and the task has a "
            "money budget (max_cost)",
        }
    return {
        "loc": ["body", *field.split(".")],
        "msg": "its cost is not bounded by the request (context held upstream, media by URL "
        "or id, a hosted tool), and the task has a money budget (max_cost)",
    }

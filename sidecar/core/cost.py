"""Money for model turns (DESIGN §3 ``max_cost``, §5 the model gate), as pure functions.

A model's price is per million tokens, input and output apart, in the
configured currency (``model_gate.prices``). Before a turn is forwarded the
gate reserves a bound of what it can cost (:func:`worst_case`): its input
(at most one token per byte of the request the upstream is sent: a
byte-level tokenizer's token is never shorter than a byte) and every output
token it allows, once per choice it asks for (the request's own limit, or
the configured default, which the gate then sends as the request's limit);
the task refuses the turn when that reservation would pass ``max_cost``
(:func:`sidecar.core.tasks.admit_model_call`). A request whose cost its own
bytes do not bound (context held upstream, media by URL or id) is refused
under a money budget before that. After the turn, :func:`settled_cost` says
what to charge instead of the reservation:

1. the upstream answered an error (nothing was generated): nothing;
2. it reported its usage: that usage at the model's prices (more than the
   reservation when the upstream passed the limits: the task ends at that
   turn, :func:`sidecar.core.tasks.settle_model_call`);
3. it reported none (a stream cut short, an answer that is not one): the
   whole reservation, so a turn is never free.

Every amount is at most :data:`MAX_AMOUNT`, whatever numbers come in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Tokens in one priced unit (prices are per million tokens).
PER = 1_000_000
#: The largest amount of money one turn is counted at (in the currency): far
#: past any budget, and exact in the store's micro-units.
MAX_AMOUNT = 1e9


def _bounded(amount: float) -> float:
    return MAX_AMOUNT if math.isnan(amount) else min(max(0.0, amount), MAX_AMOUNT)


@dataclass(frozen=True)
class Price:
    """A model's price per million tokens (``input_per_mtok``, ``output_per_mtok``)."""

    input_per_mtok: float
    output_per_mtok: float

    def of(self, input_tokens: int, output_tokens: int) -> float:
        """The cost of a turn's tokens, in the price's currency (at most :data:`MAX_AMOUNT`)."""
        try:
            cost = (
                float(input_tokens) * self.input_per_mtok
                + float(output_tokens) * self.output_per_mtok
            ) / PER
        except OverflowError:  # a count past any float
            return MAX_AMOUNT
        return _bounded(cost)


def worst_case(price: Price, input_bound: int, max_output: int, choices: int = 1) -> float:
    """The reservation for a turn: its input bound (tokens) and all the output
    it allows (``max_output`` tokens for each of ``choices``)."""
    return price.of(max(0, input_bound), max(0, max_output) * max(1, choices))


def settled_cost(
    price: Price, reserved: float, split: tuple[int, int] | None, *, answered: bool
) -> float:
    """What a turn costs once it is over (rules 1-3 of this module).

    :param split: the ``(input, output)`` tokens the upstream reported (read
        by the wire adapter), None when it reported none.
    :param answered: False when the upstream answered an error status.
    """
    if not answered:
        return 0.0
    if split is None:
        return _bounded(reserved)
    return price.of(*split)

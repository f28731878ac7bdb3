"""Money for model turns (DESIGN §3 ``max_cost``, §5 the model gate), as pure functions.

A model's price is per million tokens, input and output apart, in the
configured currency (``model_gate.prices``). Before a turn is forwarded the
gate reserves its worst case: the request's input estimate plus every
output token it allows (as the request's wire format says, or the
configured default), at the model's prices; the task refuses the turn when
that reservation would pass ``max_cost`` (:func:`sidecar.core.tasks.admit_model_call`).
After the turn, :func:`settled_cost` says what to charge instead of the
reservation:

1. the upstream answered an error (nothing was generated): nothing;
2. it reported its usage: that usage at the model's prices;
3. it reported none (a stream cut short, an answer that is not one): the
   whole reservation, so a turn is never free.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Tokens in one priced unit (prices are per million tokens).
PER = 1_000_000


@dataclass(frozen=True)
class Price:
    """A model's price per million tokens (``input_per_mtok``, ``output_per_mtok``)."""

    input_per_mtok: float
    output_per_mtok: float

    def of(self, input_tokens: int, output_tokens: int) -> float:
        """The cost of a turn's tokens, in the price's currency."""
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / PER


def worst_case(price: Price, input_estimate: int, max_output: int) -> float:
    """The reservation for a turn: its input estimate and all the output it allows."""
    return price.of(max(0, input_estimate), max(0, max_output))


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
        return reserved
    return price.of(*split)

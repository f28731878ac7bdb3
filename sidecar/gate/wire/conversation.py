"""The writes primitives' common part (DESIGN §5.1): ``with_exchange``,
``with_kept`` and ``last_anchor`` over an adapter's ``conversation``,
``with_conversation``, ``item_anchor``, ``is_user_message`` and
``exchange_items``, with the one splice rule of
:func:`sidecar.core.gate_writes.splice`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sidecar.core.gate_writes import KeptExchange, last_anchor, splice
from sidecar.gate.wire.base import Proposal


class Conversation:
    """``with_exchange``, ``with_kept`` and ``last_anchor`` over an adapter's
    primitives (mixed into every adapter that has them)."""

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        raise NotImplementedError

    def with_conversation(self, body: Mapping[str, Any], items: list[Any]) -> dict[str, Any]:
        raise NotImplementedError

    def item_anchor(self, item: Any) -> str | None:
        raise NotImplementedError

    def is_user_message(self, item: Any) -> bool:
        raise NotImplementedError

    def exchange_items(self, proposal: Proposal, output_text: str) -> list[Any]:
        raise NotImplementedError

    def with_exchange(
        self, body: Mapping[str, Any], proposal: Proposal, output_text: str
    ) -> dict[str, Any]:
        """See :meth:`WireAdapter.with_exchange`."""
        items = [*self.conversation(body), *self.exchange_items(proposal, output_text)]
        return self.with_conversation(body, items)

    def with_kept(self, body: Mapping[str, Any], kept: Sequence[KeptExchange]) -> dict[str, Any]:
        """See :meth:`WireAdapter.with_kept`."""
        if not kept:
            return dict(body)
        items = splice(
            self.conversation(body),
            kept,
            self.item_anchor,
            self.is_user_message,
            lambda e: self.exchange_items(Proposal(e.call_id, e.tool, e.args), e.output),
        )
        return self.with_conversation(body, items)

    def last_anchor(self, body: Mapping[str, Any]) -> str | None:
        """See :meth:`WireAdapter.last_anchor`."""
        return last_anchor(self.conversation(body), self.item_anchor)

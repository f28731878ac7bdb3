"""Who may run a check (DESIGN §4, ``sidecar/core/check_scope.py``): a pure
rule over what the configuration says of each check; no app, no store."""

from __future__ import annotations

import pytest

from sidecar.core.check_scope import CheckScope, open_to

CHECKS = {
    "everyone": CheckScope(frozenset({"*"})),
    "orders": CheckScope(frozenset({"wf-orders"})),
    "orders_or_sheets": CheckScope(frozenset({"wf-orders", "wf-sheets"})),
    "unnamed": CheckScope(),
    "all_open": CheckScope(frozenset({"*"}), ("everyone", "orders")),
    "hides_a_closed_part": CheckScope(frozenset({"*"}), ("everyone", "unnamed")),
    "loops": CheckScope(frozenset({"*"}), ("loops",)),
}
ORDERS = frozenset({"wf-orders"})
SHEETS = frozenset({"wf-sheets"})


@pytest.mark.parametrize("name", [*CHECKS, "absent"])
def test_a_token_holding_every_workflow_may_run_any_name(name: str) -> None:
    assert open_to(name, CHECKS, None) is True


@pytest.mark.parametrize(
    ("name", "scope", "workflow", "opened"),
    [
        ("everyone", SHEETS, None, True),
        ("everyone", SHEETS, "wf-sheets", True),
        ("orders", ORDERS, None, True),
        ("orders", SHEETS, None, False),
        ("orders", frozenset({"wf-orders", "wf-sheets"}), "wf-sheets", False),
        ("orders", frozenset({"wf-orders", "wf-sheets"}), "wf-orders", True),
        ("orders_or_sheets", SHEETS, None, True),
        ("unnamed", ORDERS, None, False),  # names none: every workflow is needed
        ("absent", ORDERS, None, False),  # the same answer as a closed check
    ],
)
def test_a_scoped_token_may_run_a_check_naming_its_workflow(
    name: str, scope: frozenset[str], workflow: str | None, opened: bool
) -> None:
    assert open_to(name, CHECKS, scope, workflow) is opened


def test_a_combined_check_is_open_only_when_every_part_is() -> None:
    assert open_to("all_open", CHECKS, ORDERS) is True
    assert open_to("all_open", CHECKS, SHEETS) is False
    assert open_to("hides_a_closed_part", CHECKS, ORDERS) is False


def test_a_cycle_of_parts_ends_closed() -> None:
    assert open_to("loops", CHECKS, ORDERS) is False

"""A damaged stored lineage is read as an empty one (it forgets, never fails)."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.core.lineage import Lineage, step_page


@pytest.mark.parametrize("damaged", [[1, 2], "text", 5, 1.5, True])
def test_a_stored_lineage_that_is_not_an_object_reads_as_a_new_one(damaged: Any) -> None:
    """``Lineage.from_doc`` promises that damage errs toward "new"; a stored
    value that is not a JSON object (a list, a string, a number) raised
    AttributeError instead, and every later page of the task's cursor check
    answered 500 until the record expired."""
    lineage = Lineage.from_doc(damaged)
    _, verdict = step_page(lineage, "cursor-fp", ["id-fp"])
    assert verdict.passed

"""The views' side of the layering the import contract cannot see: a view
reaches the runtime's store attribute without importing ``sidecar.store``."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

API = REPO / "sidecar" / "api"


def _store_uses(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "store"
    ]


def test_no_view_reads_the_store() -> None:
    found = {p.name: lines for p in sorted(API.glob("*.py")) if (lines := _store_uses(p))}
    assert found == {}, f"views reading the store (file: lines): {found}"


def test_the_check_sees_a_view_reading_the_store(tmp_path: Path) -> None:
    view = tmp_path / "view.py"
    view.write_text("def index(rt):\n    return rt.store.get('k')\n")
    assert _store_uses(view) == [2]

"""The code's shape: no module of ``sidecar/`` past its length limit, no import
circle between its modules, and importing the CLI or the app does nothing (no
metric library loaded by the CLI, no metric created by any import)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from conftest import REPO

ROOT = REPO
SIDECAR = ROOT / "sidecar"

#: The longest a module of ``sidecar/`` may be: past it, a module is split along
#: its seams (as sidecar/core/tasks, sidecar/store/redis and sidecar/store/postgres are).
MODULE_MAX_LINES = 600


def test_no_module_is_over_the_limit() -> None:
    lengths = {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
        for p in SIDECAR.rglob("*.py")
    }
    over = {path: n for path, n in lengths.items() if n > MODULE_MAX_LINES}
    assert not over, f"modules over {MODULE_MAX_LINES} lines: {over}"


# -- import circles -----------------------------------------------------------------


def _modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, known: Mapping[str, Path]) -> Iterator[str]:
    """The modules of ``known`` that module ``name`` imports, wherever the import
    statement sits (module level, inside a function, under ``if TYPE_CHECKING``)."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]

    def owner(dotted: str) -> str | None:
        """The module a dotted name lives in (``a.b.C`` -> ``a.b`` when that is one)."""
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            # ``from package import module`` imports that module; ``from m import x``, m.
            targets = [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            module = owner(target)
            if module is not None and module != name:
                yield module


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    known = _modules(package)
    return {name: set(_imported(name, path, known)) for name, path in known.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and the
    modules that import themselves: every import circle, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_in_sidecar() -> None:
    circles = cycles(import_graph(SIDECAR))
    assert circles == [], f"modules importing each other, directly or around a circle: {circles}"


def test_the_circle_check_sees_circles_at_any_depth(tmp_path: Path) -> None:
    """A function-level import closes a circle as a module-level one does; relative
    imports and ``from package import module`` count; importing a submodule is not
    counted as importing its parent package (Python runs the parent first, but the
    parent importing its submodules is no circle)."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def late():\n    from pkg.c import thing\n")
    (pkg / "c.py").write_text("from . import a\nthing = 1\n")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.leaf import x\n")
    (pkg / "sub" / "leaf.py").write_text("x = 1\n")
    (pkg / "d.py").write_text("from pkg.sub import x\n")
    graph = import_graph(pkg)
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.sub"} and graph["pkg.sub"] == {"pkg.sub.leaf"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


# -- importing does nothing ----------------------------------------------------------

IMPORTS = """
import sys
import sidecar.cli
print("cli loads prometheus_client:", "prometheus_client" in sys.modules)
import sidecar.app
from prometheus_client import REGISTRY, generate_latest
print("import creates a metric:", b"loopstop_" in generate_latest(REGISTRY))
"""


@pytest.mark.slow  # a fresh interpreter
def test_importing_the_cli_or_the_app_creates_no_metric() -> None:
    """``loopstop serve`` sets the multiprocess folder before prometheus-client is
    imported: the CLI must not import it; and no import creates a metric (the app
    factory builds them on a registry of its own)."""
    out = subprocess.run(
        [sys.executable, "-c", IMPORTS],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.stdout.splitlines() == [
        "cli loads prometheus_client: False",
        "import creates a metric: False",
    ], out.stderr

"""The docs say what the code does: every problem type has its fix, links resolve."""

from __future__ import annotations

import inspect
import re

from conftest import REPO
from sidecar import errors
from sidecar.service import model_gate

ROOT = REPO
DOCS = ROOT / "docs"


def _problem_slugs() -> set[str]:
    classes = [
        c
        for module in (errors, model_gate)
        for _, c in inspect.getmembers(module, inspect.isclass)
        if issubclass(c, errors.LoopstopError) and c is not errors.LoopstopError
    ]
    return {c.slug for c in classes}


def test_every_problem_type_has_a_troubleshooting_entry() -> None:
    page = (DOCS / "troubleshooting.md").read_text()
    headed = set(re.findall(r"^### `([a-z0-9-]+)`$", page, flags=re.M))
    missing = _problem_slugs() - headed
    assert not missing, f"docs/troubleshooting.md has no section for {sorted(missing)}"


def test_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert targets, "the README links into the docs"
    for target in targets:
        assert (ROOT / target).exists(), f"README links to a missing file: {target}"


def test_every_docs_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    missing = {p for p in pages if p not in nav}
    assert not missing, f"pages missing from mkdocs.yml nav: {sorted(missing)}"


def test_the_design_table_of_rules_names_every_core_module_and_only_real_files() -> None:
    page = (DOCS / "design.md").read_text()
    table = page[page.index("### Where each rule is decided") :]
    named = set(re.findall(r"`(sidecar/[\w/]+\.py)`", table))
    missing = {path for path in named if not (ROOT / path).is_file()}
    assert not missing, f"docs/design.md names files that do not exist: {sorted(missing)}"
    core = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "sidecar" / "core").rglob("*.py")
        if p.name != "__init__.py"
    }
    unnamed = core - named
    assert not unnamed, f"docs/design.md's table does not name {sorted(unnamed)}"

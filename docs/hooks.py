"""MkDocs hooks: the reference pages are generated from the code at build time.

A page holds a placeholder comment; :func:`on_page_markdown` replaces it:

- `<!-- generated: configuration -->`: every configuration key, from the
  pydantic models of :mod:`sidecar.config` (their JSON Schema);
- `<!-- generated: http -->`: every route, from the OpenAPI document the
  server serves (:func:`sidecar.api.openapi.document`);
- `<!-- generated: problems -->`: every problem type, from
  :mod:`sidecar.errors`.

So the reference cannot drift from the code: a key or route added to the
code appears in the docs, and one removed disappears. The build also writes
`openapi.json` beside the site. Needs the project installed in the Python
that runs `mkdocs` (`pip install -e . -r docs/requirements.txt`).
"""

from __future__ import annotations

import inspect
import json
import tempfile
from pathlib import Path
from typing import Any

_CACHE: dict[str, Any] = {}


def _openapi() -> dict[str, Any]:
    if "openapi" not in _CACHE:
        from sidecar.app import create_app

        with tempfile.TemporaryDirectory() as tmp:
            app = create_app(
                {"store": f"sqlite:///{tmp}/docs.db"},
                environ={"LOOPSTOP_SECRET": "docs-build-secret-not-used-for-anything"},
                announce=False,
            )
            _CACHE["openapi"] = app.test_client().get("/openapi.json").get_json()
    return _CACHE["openapi"]


# -- JSON Schema to Markdown ------------------------------------------------------


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return f"`{_ref_name(schema['$ref'])}`"
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " \\| ".join(_type(s) for s in schema[key])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of name to {_type(schema['additionalProperties'])}"
    return f"{kind}"


_CONSTRAINTS = {
    "minimum": ">= {}",
    "exclusiveMinimum": "> {}",
    "maximum": "<= {}",
    "exclusiveMaximum": "< {}",
    "minLength": "at least {} characters",
    "maxLength": "at most {} characters",
    "minItems": "at least {} items",
    "pattern": "matches `{}`",
}


def _constraints(schema: dict[str, Any]) -> str:
    found: list[str] = []
    for sub in [schema, *schema.get("anyOf", [])]:
        for key, fmt in _CONSTRAINTS.items():
            if key in sub:
                found.append(fmt.format(sub[key]).replace("|", "\\|"))
    return ", ".join(found)


def _default(schema: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in schema:
        return ""
    value = schema["default"]
    if isinstance(value, dict) and len(json.dumps(value)) > 40:
        return "see its table"
    return f"`{json.dumps(value)}`"


def _table(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties", {})
    if not props:
        return []
    required = set(schema.get("required", []))
    rows = ["| key | type | default | constraints |", "| --- | --- | --- | --- |"]
    for name, sub in props.items():
        rows.append(
            f"| `{name}` | {_type(sub)} | {_default(sub, name in required)} | {_constraints(sub)} |"
        )
    return rows


def _doc(schema: dict[str, Any]) -> str:
    return " ".join(schema.get("description", "").split()).replace("``", "`")


def configuration_reference() -> str:
    """Every section and key of the YAML file, one table per model."""
    from sidecar.config import Settings

    schema = Settings.model_json_schema(by_alias=True)
    defs: dict[str, Any] = schema.get("$defs", {})
    out = ["### The file's top level", "", *_table(schema), ""]
    for name in sorted(defs):
        sub = defs[name]
        if "properties" not in sub:
            continue
        out += [f"### `{name}`", ""]
        if _doc(sub):
            out += [_doc(sub), ""]
        out += [*_table(sub), ""]
    return "\n".join(out)


def http_reference() -> str:
    """Every route of the OpenAPI document: method, path, summary, body and answer."""
    doc = _openapi()
    out: list[str] = [
        f"Generated from the OpenAPI {doc.get('openapi', '')} document of loopstop "
        f"{doc.get('info', {}).get('version', '')}, also served at `/openapi.json` "
        "and published beside this site as `openapi.json` (at the site root).",
        "",
        "| method | path | what | body | answer | errors |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for path, methods in doc.get("paths", {}).items():
        for method, op in methods.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            body_type = _type(body.get("schema", {})) if body else ""
            answers = [
                f"{code}: {_type(r.get('content', {}).get('application/json', {}).get('schema', {}))}"
                for code, r in op.get("responses", {}).items()
                if code.startswith("2") and r.get("content")
            ]
            errors = ", ".join(c for c in op.get("responses", {}) if not c.startswith("2"))
            out.append(
                f"| {method.upper()} | `{path}` | {op.get('summary', '')} | {body_type} "
                f"| {'; '.join(answers)} | {errors} |"
            )
    out += ["", "### Schemas", ""]
    for name, sub in sorted(doc.get("components", {}).get("schemas", {}).items()):
        if "properties" not in sub:
            continue
        out += [f"#### `{name}`", ""]
        if _doc(sub):
            out += [_doc(sub), ""]
        out += [*_table(sub), ""]
    return "\n".join(out)


def problem_reference() -> str:
    """Every problem type: its `type` suffix, status, title and when it is raised."""
    from sidecar import errors

    rows = ["| `type` ends in | status | title | raised when |", "| --- | --- | --- | --- |"]
    classes = [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.LoopstopError) and c.__module__ == errors.__name__
    ]
    for cls in sorted(classes, key=lambda c: (c.status, c.slug)):
        first = " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split()).replace("``", "`")
        rows.append(f"| `{cls.slug}` | {cls.status} | {cls.title} | {first} |")
    return "\n".join(rows)


_GENERATORS = {
    "<!-- generated: configuration -->": configuration_reference,
    "<!-- generated: http -->": http_reference,
    "<!-- generated: problems -->": problem_reference,
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each placeholder with what its generator renders."""
    for marker, generate in _GENERATORS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown


def on_post_build(config: Any) -> None:
    """Publish the OpenAPI document beside the site."""
    Path(config["site_dir"], "openapi.json").write_text(json.dumps(_openapi(), indent=2))

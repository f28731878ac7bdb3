"""The decisions and reasons the sidecar answers on each route the Loop Stop node branches on.

The node package's unit tests (``n8n-nodes/test/routing.test.mjs``) read
``n8n-nodes/test/contract.json``: every answer their fixtures route must use
a decision and a reason listed there, and every listed decision must land on
a named output. ``tests/project/test_node_contract.py`` checks that the file is what
this module builds from ``/openapi.json`` (the routes whose answers carry
their decision and reason as enums) and from the core's enums (the reasons
the tool-call, complete and check answers carry as plain strings), so a
decision or reason renamed in the sidecar fails a test on both sides.

Run ``python tests/node_contract.py`` to write the file anew.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "n8n-nodes" / "test" / "contract.json"


def _openapi() -> dict[str, Any]:
    from sidecar.app import create_app

    with tempfile.TemporaryDirectory() as tmp:
        app = create_app(
            {"store": f"sqlite:///{tmp}/contract.db"},
            environ={"LOOPSTOP_SECRET": "contract-secret-0123456789"},
            announce=False,
        )
        doc: dict[str, Any] = app.test_client().get("/openapi.json").get_json()
        app.extensions["loopstop"].store.close()
    return doc


def _enum(schemas: dict[str, Any], name: str) -> list[str]:
    values: list[str] = schemas[name]["enum"]
    return sorted(values)


def build() -> dict[str, Any]:
    """The contract: per node operation (``resource.operation``), its decisions and reasons."""
    from sidecar.core.check_verdicts import CheckReason
    from sidecar.core.tasks import CompleteReason, DenyReason, EndReason

    schemas = _openapi()["components"]["schemas"]
    ended = {str(r) for r in EndReason}
    return {
        "activation.checkTrigger": {
            "decisions": _enum(schemas, "ActivationDecision"),
            "reasons": _enum(schemas, "ActivationReason"),
        },
        "operation.begin": {
            "decisions": _enum(schemas, "BeginDecision"),
            "reasons": _enum(schemas, "BeginReason"),
        },
        "task.admitToolCall": {
            "decisions": _enum(schemas, "ToolDecision"),
            "reasons": sorted(ended | {str(r) for r in DenyReason}),
        },
        "task.complete": {
            "decisions": _enum(schemas, "CompleteDecision"),
            "reasons": sorted(ended | {str(r) for r in CompleteReason}),
        },
        "check.run": {
            "passed": [True, False],
            "reasons": sorted(str(r) for r in CheckReason),
        },
    }


def render(contract: dict[str, Any]) -> str:
    """The file's text: sorted keys, tab-indented as the node package's JSON is."""
    return json.dumps(contract, indent="\t", sort_keys=True) + "\n"


if __name__ == "__main__":
    CONTRACT.write_text(render(build()))
    print(f"wrote {CONTRACT.relative_to(ROOT)}", file=sys.stderr)

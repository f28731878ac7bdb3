"""The node package's routing fixtures speak the sidecar's own decisions and reasons.

``n8n-nodes/test/contract.json`` is what ``tests/node_contract.py`` builds
from ``/openapi.json`` and the core's enums; the node's unit tests check
their fixtures against it. A decision or reason renamed here makes this
test fail until the file is written anew, and then the node's tests fail
on every fixture that still uses the old name.
"""

from __future__ import annotations

import node_contract


def test_the_node_contract_file_is_the_sidecars_current_contract() -> None:
    want = node_contract.render(node_contract.build())
    have = node_contract.CONTRACT.read_text()
    assert have == want, "n8n-nodes/test/contract.json is stale: run python tests/node_contract.py"


def test_the_contract_holds_every_decision_the_begin_route_answers() -> None:
    begin = node_contract.build()["operation.begin"]
    assert set(begin["decisions"]) == {
        "execute",
        "replay",
        "in_progress",
        "reconcile",
        "conflict",
        "stopped",
        "exhausted",
    }
    assert "lease_held" in begin["reasons"] and "leased" not in begin["reasons"]

"""The ``loopstop-*`` lines of an AI Agent's System Message (DESIGN §5 "Which task").

``loopstop-task: <task_id>`` names a task; ``loopstop-task-key: <key>``
(with optional ``loopstop-workflow``, ``loopstop-policy`` and
``loopstop-execution`` lines) creates or continues one by key. The lines
are read from the System Message only (the adapter says where it stands),
values in Unicode NFC (UAX #15) as the API's names are.

A line may stand more than once with the same value; a kind given two
different values is refused: a value interpolated into the message that
holds a newline can add lines, and no added line may choose the task, its
workflow or its policy.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from sidecar.core.executions import EXECUTION_ID_PATTERN
from sidecar.errors import MalformedRequest

TASK_LINE = re.compile(r"loopstop-task:\s*(t[0-9a-f]{20})\b")
_LINE = r"^[ \t]*loopstop-{}:[ \t]*([^\r\n]*?)[ \t]*$"
KEY_LINE = re.compile(_LINE.format("task-key"), re.MULTILINE)
WORKFLOW_LINE = re.compile(_LINE.format("workflow"), re.MULTILINE)
POLICY_LINE = re.compile(_LINE.format("policy"), re.MULTILINE)
EXECUTION_LINE = re.compile(_LINE.format("execution"), re.MULTILINE)
#: How long a ``loopstop-*`` line's value may be (as ``POST /v1/tasks``'s fields).
MAX_LINE_VALUE = 200
_EXECUTION_ID = re.compile(EXECUTION_ID_PATTERN)

_VALUED = (
    ("task_key", KEY_LINE),
    ("workflow", WORKFLOW_LINE),
    ("policy", POLICY_LINE),
    ("execution", EXECUTION_LINE),
)


@dataclass(frozen=True)
class TaskLines:
    """What the ``loopstop-*`` lines of a request name."""

    task_id: str | None = None
    task_key: str | None = None
    workflow: str | None = None
    policy: str | None = None
    execution: str | None = None

    @property
    def named(self) -> bool:
        """Whether a task is named (by id or by key)."""
        return self.task_id is not None or self.task_key is not None


def _line(name: str) -> str:
    return "loopstop-task" if name == "task_id" else "loopstop-" + name.replace("_", "-")


def _refused(name: str, detail: str, msg: str) -> MalformedRequest:
    line = _line(name)
    return MalformedRequest(
        f"the {line} line {detail}",
        errors=[{"loc": ["body", "system", line], "msg": msg}],
    )


def _checked(name: str, raw: str) -> str:
    # Names in NFC, as POST /v1/tasks reads them ("Cafe\u0301" is "Caf\u00e9"),
    # checked after: NFC may lengthen a name.
    value = unicodedata.normalize("NFC", raw)
    if name == "execution":
        if not _EXECUTION_ID.fullmatch(value):
            raise _refused(
                name, "needs n8n's execution id (1 to 64 of A-Z a-z 0-9 _ -)", "invalid value"
            )
    elif not value or len(value) > MAX_LINE_VALUE or not value.isprintable():
        raise _refused(
            name, f"needs a value of 1 to {MAX_LINE_VALUE} printable characters", "invalid value"
        )
    return value


def task_lines(texts: Iterable[str]) -> TaskLines:
    """Read the ``loopstop-*`` lines of the System Message's ``texts``.

    :raises MalformedRequest: a line's value is empty, too long or holds
        control characters; a ``loopstop-execution`` value is not an
        execution id (:data:`sidecar.core.executions.EXECUTION_ID_PATTERN`); or
        one kind of line stands twice with different values. Each names the line
        (``loc: ["body", "system", "loopstop-..."]``).
    """
    found: dict[str, str] = {}

    def put(name: str, value: str) -> None:
        if found.setdefault(name, value) != value:
            raise _refused(
                name, "stands more than once with different values", "conflicting values"
            )

    for text in texts:
        for task_id in TASK_LINE.findall(text):
            put("task_id", task_id)
        for name, pattern in _VALUED:
            for raw in pattern.findall(text):
                put(name, _checked(name, raw))
    return TaskLines(**found)

"""The frozen-record helpers (sidecar/core/frozen.py) make exactly what
dataclasses would: the same records, the same documents, key for key in order."""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest

from sidecar.core.frozen import build, evolve, known_items, shallow_doc
from sidecar.core.operations import Operation, OperationState
from sidecar.core.tasks import CallKind, CallRecord, CallStatus, Task, TaskLimits, Used


def _task() -> Task:
    calls = tuple(
        CallRecord(
            f"k{i:016x}", "search", CallKind.READ, f"{i:016x}", 0, CallStatus.OK, 1.0 + i
        ).to_doc()
        for i in range(5)
    )
    return Task(
        task_id="t" + "0" * 20,
        task_key="key",
        workflow="wf",
        chain_id=None,
        policy=None,
        attempt=1,
        limits=TaskLimits(per_tool={"search": 9}),
        allowed_tools=("search",),
        created_at=1.0,
        updated_at=2.0,
        used=Used(tool_calls=5, per_tool={"search": 5}),
        calls=calls,
        identical_calls={"search|00@0": 1},
        results_seen=("ab",),
    )


def _op() -> Operation:
    return Operation("op-1", OperationState.IN_PROGRESS, 1, "fp", "s1", "wf", None, None, 1.0, 1.0)


@pytest.mark.parametrize("record", [_task(), _task().used, _task().limits, _op()])
def test_shallow_doc_is_every_field_in_definition_order(record: object) -> None:
    names = [f.name for f in dataclasses.fields(record)]  # type: ignore[arg-type]
    doc = shallow_doc(record)
    assert list(doc) == names
    assert all(doc[n] is getattr(record, n) for n in names)


def test_evolve_is_replace() -> None:
    task = _task()
    changes = {"updated_at": 3.0, "attempt": 2, "results_seen": ("cd",)}
    new, old = evolve(task, **changes), dataclasses.replace(task, **changes)
    assert new == old
    assert list(vars(new)) == list(vars(old))
    assert task.updated_at == 2.0  # the original is untouched
    with pytest.raises(TypeError):
        evolve(task, no_such_field=1)


def test_build_is_the_constructor_in_any_key_order() -> None:
    task = _task()
    doc = task.to_doc()
    assert Task.from_doc(doc) == task
    shuffled = dict(reversed(list(doc.items())))  # as PostgreSQL's jsonb may return it
    back = Task.from_doc(shuffled)
    assert back == task
    assert json.dumps(back.to_doc()) == json.dumps(doc)
    values = dataclasses.asdict(task.used)
    assert build(Used, dict(reversed(list(values.items())))) == Used(**values)
    with pytest.raises(TypeError):
        build(Used, {**values, "no_such_field": 1})


def test_a_document_missing_or_adding_fields_reads_as_before() -> None:
    doc = _task().to_doc()
    del doc["exchanges"]  # written before the field existed
    doc["dropped_field"] = 1  # written by a version that had it
    assert "dropped_field" not in known_items(Task, doc)
    task = Task.from_doc(doc)
    assert task is not None and task.exchanges == ()
    assert list(task.to_doc()) == [f.name for f in dataclasses.fields(Task)]


@dataclasses.dataclass(frozen=True)
class _Cached:
    n: int

    @functools.cached_property
    def double(self) -> int:
        return 2 * self.n


def test_a_record_with_a_cached_property_is_changed_by_dataclasses() -> None:
    record = _Cached(1)
    assert record.double == 2
    changed = evolve(record, n=5)
    assert changed.double == 10
    assert shallow_doc(changed) == {"n": 5}

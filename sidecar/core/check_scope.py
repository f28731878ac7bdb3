"""Which checks a token may run, and for which workflows (DESIGN §4).

A check runs with the system of record's credentials, so opening it is said
in the configuration: a check names the workflows that may run it
(``workflows: [...]``, ``["*"]`` for all); a check that names none is open
only to tokens holding every workflow. An ``all`` / ``any`` check is open
only when every part of it is. A scoped token outside the list is refused
before anything is fetched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: How deep ``all`` / ``any`` parts are followed (the configuration refuses cycles).
MAX_DEPTH = 32


@dataclass(frozen=True)
class CheckScope:
    """What the scope rule reads of one configured check.

    :ivar workflows: the workflows that may run it (``"*"``: all); empty when
        the check names none (then only a token holding every workflow may).
    :ivar parts: the checks an ``all`` / ``any`` combines (empty otherwise).
    """

    workflows: frozenset[str] = frozenset()
    parts: tuple[str, ...] = ()


def open_to(
    name: str,
    checks: Mapping[str, CheckScope],
    scope: frozenset[str] | None,
    workflow: str | None = None,
    _depth: int = 0,
) -> bool:
    """True when a token of ``scope`` may run check ``name`` and every part of it.

    :param checks: name -> :class:`CheckScope` of every configured check.
    :param scope: the token's workflows; None: every workflow (always open).
    :param workflow: the workflow the run acts for (a task's, a begin's);
        None: any workflow of ``scope``.
    :returns: False too for a check that is not configured (a scoped token
        cannot tell an absent check from a closed one).
    """
    if scope is None:
        return True
    check = checks.get(name)
    if check is None or _depth > MAX_DEPTH:
        return False
    if "*" not in check.workflows:
        wanted = {workflow} if workflow is not None else set(scope)
        if not wanted & check.workflows:
            return False
    return all(open_to(p, checks, scope, workflow, _depth + 1) for p in check.parts)

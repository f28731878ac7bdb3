"""One n8n for the real-n8n tier, and one build of the node package.

``n8n_home`` is the session's n8n 2.41.1: headless, SQLite, a user folder
under the session's temp folder, free loopback ports, the node package
(``n8n-nodes/``, built once: ``node_package``) installed in it. ``n8n`` is
the same n8n, started: on first use, and again after a module stopped it to
run n8n's CLI on its folder (``test_n8n_compose_files.py`` does, as the
Compose walk-through does before its restart).

Every module adds what it drives to the running n8n over n8n's REST API, as
its owner (:meth:`~e2e.n8n_runtime.N8n.add_credentials`,
:meth:`~e2e.n8n_runtime.N8n.add_workflows`): no CLI boot and no restart per
module. Each module keeps its own sidecar (``loopstop serve`` on a
configuration of its own, pointed at by credentials of its own), fake
upstream and recorder (``shared.py``): they start in a second or less, and
their state (a mode, counters, what was posted) stays with the module. The
workflow ids and webhook paths of each module are its own: n8n refuses a
workflow under an id it has, and a webhook on a path another one has.

``test_n8n_queue.py`` runs n8n in queue mode on its own stack (a main, two
workers, PostgreSQL and Redis); it installs the same package build, and the
session's n8n is stopped before it starts.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import free_port

from .n8n_runtime import Install, N8n, build_node_package

#: The session's n8n, to stop before the queue-mode stack starts.
_SESSION: list[N8n] = []


@pytest.fixture(scope="session")
def n8n_install() -> Install:
    """n8n 2.41.1 and its Node 24 in the cache folder (installed on first use)."""
    return Install().ensure()


@pytest.fixture(scope="session")
def node_package(n8n_install: Install) -> Path:
    """``n8n-nodes/``, built once for the session on the install's Node (``npm ci``
    when its lockfile changed, then ``npm run build``)."""
    return build_node_package(n8n_install)


@pytest.fixture(scope="session")
def n8n_home(
    tmp_path_factory: pytest.TempPathFactory, n8n_install: Install, node_package: Path
) -> Iterator[N8n]:
    """The session's n8n with the node package installed, not started yet."""
    home = tmp_path_factory.mktemp("n8n-session")
    n8n = N8n(n8n_install, home, free_port(), free_port())
    n8n.install_node_package(node_package)
    _SESSION.append(n8n)
    yield n8n
    n8n.stop()
    _SESSION.remove(n8n)


@pytest.fixture(scope="module")
def n8n(n8n_home: N8n) -> N8n:
    """The session's n8n, running."""
    return n8n_home.start()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the session's n8n once no test is left to use it: the queue-mode stack
    (sorted last among the n8n tests by ``tests/conftest.py``) starts three n8n
    processes of its own, and under pytest-xdist the worker that ran the n8n group
    goes on with other modules."""
    if (
        nextitem is None
        or nextitem.get_closest_marker("n8n") is None
        or "queue" in getattr(nextitem, "fixturenames", ())
    ):
        for n8n in _SESSION:
            n8n.stop()

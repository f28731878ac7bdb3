"""Shared fixtures: a real redis-server and PostgreSQL on free ports, every store, app factories.

The store matrix runs where the store matters: a test (or a module, by
``pytestmark``) marked ``all_stores`` runs on ``sqlite`` (a temp file),
``redis`` (a ``redis-server`` this session starts; never the machine's 6379)
and ``postgres`` (a private cluster made with ``initdb`` in a temp folder and
started on a free port; never the machine's 5432); every other test that
uses a store (``store_url``, ``store``, ``make_app``, ``api``) runs on SQLite
alone. Each generated item carries the marker of its store (``-m redis``).

Tiers: ``quick`` is given here to every test that starts no process (not
``slow``, no ``n8n``, no served sidecar) and touches neither Redis nor
PostgreSQL: the rule and API tests a contributor runs on every change.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import socketserver
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import Client

from sidecar.app import create_app
from sidecar.store import Store, plan, store_from_url

#: the repository's root, and the tests' own folder (modules in any subfolder use these)
REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

SECRET = "test-secret-0123456789abcdef"
N8N_TOKEN = "tok-n8n-0123456789"
ADMIN_TOKEN = "tok-admin-0123456789"
SCOPED_TOKEN = "tok-scoped-0123456789"

TOKENS_CONFIG = [
    {"name": "n8n", "env": "LOOPSTOP_TOKEN_N8N", "workflows": ["*"]},
    {"name": "operator", "env": "LOOPSTOP_TOKEN_ADMIN", "workflows": ["*"], "admin": True},
    {"name": "sheets-only", "env": "LOOPSTOP_TOKEN_SCOPED", "workflows": ["wf-sheets"]},
]
TOKENS_ENV = {
    "LOOPSTOP_SECRET": SECRET,
    "LOOPSTOP_TOKEN_N8N": N8N_TOKEN,
    "LOOPSTOP_TOKEN_ADMIN": ADMIN_TOKEN,
    "LOOPSTOP_TOKEN_SCOPED": SCOPED_TOKEN,
}


#: How often the tests' in-process HTTP servers (the fake n8n, upstream models,
#: systems of record; http.server and Werkzeug alike) look for ``shutdown()``.
#: The standard library's 0.5 s made every such test's teardown wait half a second.
SERVER_POLL_S = 0.01
_serve_forever = socketserver.BaseServer.serve_forever


def _serve_forever_polling_fast(self: socketserver.BaseServer, poll_interval: float = 0.5) -> None:
    _serve_forever(self, min(poll_interval, SERVER_POLL_S))


socketserver.BaseServer.serve_forever = _serve_forever_polling_fast  # type: ignore[method-assign]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = 15.0) -> None:
    """Poll ``condition`` every 10 ms until it is true (a wait for something observable,
    not a guessed sleep); fail the test naming ``what`` after ``timeout_s`` real seconds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:g} s for {what}")
        time.sleep(0.01)


def redis_server_binary() -> str:
    """``LOOPSTOP_TEST_REDIS_SERVER`` or ``redis-server`` on PATH; fail loudly otherwise."""
    found = os.environ.get("LOOPSTOP_TEST_REDIS_SERVER") or shutil.which("redis-server")
    if not found:
        pytest.fail(
            "redis-server is not installed: the Redis conformance tests need it "
            "(scripts/test installs it; or set LOOPSTOP_TEST_REDIS_SERVER)"
        )
    return found


class RedisServer:
    """A private redis-server process on a free loopback port."""

    def __init__(self, workdir: Path, *extra: str) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--protected-mode",
                "no",
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis_lib.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis_lib.RedisError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)
        client.close()
        return self

    def stop(self, sig: str = "term") -> None:
        if self.proc and self.proc.poll() is None:
            if sig == "kill":
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(10)

    def client(self) -> redis_lib.Redis:
        return redis_lib.Redis(port=self.port, decode_responses=True)


def postgres_bin(name: str) -> str:
    """A PostgreSQL program: ``LOOPSTOP_TEST_PG_BIN``, PATH, or /usr/lib/postgresql/*/bin."""
    folder = os.environ.get("LOOPSTOP_TEST_PG_BIN")
    candidates = [os.path.join(folder, name)] if folder else []
    candidates += sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    on_path = shutil.which(name)
    if on_path:
        candidates.append(on_path)
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(
        f"PostgreSQL's {name} is not installed: the postgres store tests need it "
        "(scripts/test installs the postgresql package; or set LOOPSTOP_TEST_PG_BIN)"
    )


def _as_user() -> str | None:
    """The user PostgreSQL runs as: itself when not root (initdb refuses root), else nobody."""
    return "nobody" if os.geteuid() == 0 else None


class PostgresServer:
    """A private PostgreSQL cluster (initdb into a temp folder) on a free loopback port.

    As root, the cluster belongs to ``nobody`` and the server runs as that
    user. ``fsync`` stays on, as in production (``/readyz`` warns without it).
    """

    def __init__(self, *, fsync: bool = True) -> None:
        self.port = free_port()
        self.user = _as_user()
        self.root = Path(tempfile.mkdtemp(prefix="loopstop-pg-"))
        self.data = self.root / "data"
        self.fsync = fsync
        self.proc: subprocess.Popen[bytes] | None = None
        if self.user:
            os.chmod(self.root, 0o755)
            shutil.chown(self.root, self.user)
        subprocess.run(
            [
                postgres_bin("initdb"),
                "-D",
                str(self.data),
                "-U",
                "loopstop",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self.user,
        )
        self.url = f"postgresql://loopstop@127.0.0.1:{self.port}/postgres"

    def start(self) -> PostgresServer:
        self.proc = subprocess.Popen(
            [
                postgres_bin("postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self.root}",
                "-c",
                f"fsync={'on' if self.fsync else 'off'}",
                "-c",
                "max_connections=400",
                "-c",
                "idle_session_timeout=60s",
                "-c",
                "shared_buffers=32MB",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self.user,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    pass
                import psycopg

                with psycopg.connect(self.url, connect_timeout=1):
                    break
            except (OSError, Exception):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("postgres did not start") from None
                time.sleep(0.05)
        return self

    def stop(self, sig: str = "term") -> None:
        if self.proc and self.proc.poll() is None:
            if sig == "kill":
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(10)
                # The backends of a killed postmaster exit on their own; wait for the port.
                subprocess.run(["pkill", "-KILL", "-P", str(self.proc.pid)], check=False)
            else:
                self.proc.send_signal(signal.SIGINT)  # fast shutdown
                self.proc.wait(30)
            stale = self.data / "postmaster.pid"
            if sig == "kill" and stale.exists():
                stale.unlink()

    def reset(self) -> None:
        """An empty store: empty loopstop's tables (one ``TRUNCATE``), keeping the schema.

        The next ``ensure_schema`` finds the tables and stamps the version and a new
        store identity, as on a fresh database; a database without loopstop's
        tables (the first test, or a test that dropped one) is dropped clean
        instead. ``drop`` gives a fresh database every time.
        """
        import psycopg
        from psycopg import errors as pgerrors

        with psycopg.connect(self.url, autocommit=True) as conn:
            try:
                conn.execute("TRUNCATE loopstop_kv, loopstop_idx, loopstop_meta")
            except pgerrors.UndefinedTable:
                self.drop()

    def drop(self) -> None:
        """A fresh database: drop loopstop's tables and functions."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "DROP TABLE IF EXISTS loopstop_kv, loopstop_idx, loopstop_meta CASCADE; "
                "DROP FUNCTION IF EXISTS loopstop_increment, loopstop_check"
            )

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def store_server_pids(store_url: str, request: pytest.FixtureRequest) -> list[int]:
    """The processes of the session's server behind ``store_url`` (Redis's, or
    PostgreSQL's postmaster and its backends): what a test pauses with SIGSTOP
    to make the store stop answering."""
    if store_url.startswith("redis"):
        server: RedisServer = request.getfixturevalue("redis_server")
        assert server.proc is not None
        return [server.proc.pid]
    pg: PostgresServer = request.getfixturevalue("postgres_server")
    assert pg.proc is not None
    children = subprocess.run(
        ["pgrep", "-P", str(pg.proc.pid)], capture_output=True, text=True, check=False
    )
    return [pg.proc.pid, *map(int, children.stdout.split())]


def sql_rows(store_url: str, table: str) -> list[tuple[Any, ...]]:
    """Every row of a SQL store's table, sorted: ``kv`` (key, doc, expires_at)
    or ``idx`` (name, member, score), on SQLite or PostgreSQL."""
    columns = {"kv": "key, doc, expires_at", "idx": "name, member, score"}[table]
    if store_url.startswith("sqlite"):
        import sqlite3

        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            return sorted(conn.execute(f"SELECT {columns} FROM {table}"))
    import psycopg

    with psycopg.connect(store_url) as pg:
        return sorted(pg.execute(f"SELECT {columns} FROM loopstop_{table}").fetchall())


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    yield server
    server.cleanup()


class SentinelCluster:
    """A Redis primary, its replicas (one by default) and three sentinels, on free
    loopback ports."""

    SERVICE = "loopstop"

    def __init__(self, workdir: Path, replicas: int = 1) -> None:
        self.workdir = workdir
        self.primary = RedisServer(workdir / "primary")
        self.replicas = replicas
        self.replica: RedisServer | None = None
        self.others: list[RedisServer] = []
        self.sentinels: list[subprocess.Popen[bytes]] = []
        self.sentinel_ports: list[int] = []

    def start(self) -> SentinelCluster:
        """Start the primary, its replicas and three sentinels; a cluster that
        fails to come up is stopped whole (no server outlives the failure)."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> SentinelCluster:
        self.primary.start()
        self.replica = RedisServer(
            self.workdir / "replica", "--replicaof", "127.0.0.1", str(self.primary.port)
        ).start()
        for n in range(1, self.replicas):
            self.others.append(
                RedisServer(
                    self.workdir / f"replica-{n}",
                    "--replicaof",
                    "127.0.0.1",
                    str(self.primary.port),
                ).start()
            )
        self.wait_replica_synced(self.primary)
        for i in range(3):
            port = free_port()
            folder = self.workdir / f"sentinel-{i}"
            folder.mkdir(parents=True, exist_ok=True)
            conf = folder / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {folder}\n"
                f"sentinel monitor {self.SERVICE} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.SERVICE} 1000\n"
                f"sentinel failover-timeout {self.SERVICE} 4000\n"
            )
            self.sentinels.append(
                subprocess.Popen(
                    [redis_server_binary(), str(conf), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            self.sentinel_ports.append(port)
        # Sentinels learn replicas from the primary's INFO every 10 s: allow a few
        # periods on a loaded machine.
        deadline = time.monotonic() + 60
        for port in self.sentinel_ports:  # every sentinel knows the replica and its peers
            client = redis_lib.Redis(port=port, decode_responses=True, socket_timeout=1)
            while True:
                try:
                    replicas = client.execute_command("SENTINEL", "REPLICAS", self.SERVICE)
                    peers = client.execute_command("SENTINEL", "SENTINELS", self.SERVICE)
                    if len(replicas) == self.replicas and len(peers) == 2:
                        break
                except redis_lib.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("sentinels did not discover the replica")
                time.sleep(0.1)
            client.close()
        return self

    def wait_replica_synced(self, primary: RedisServer) -> None:
        client = primary.client()
        deadline = time.monotonic() + 20
        while any(
            (client.info("replication").get(f"slave{n}") or {}).get("state") != "online"
            for n in range(self.replicas)
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not sync")
            time.sleep(0.05)
        client.close()

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.SERVICE}/0"

    def primary_port(self) -> int:
        client = redis_lib.Redis(port=self.sentinel_ports[0], decode_responses=True)
        _host, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.SERVICE)
        client.close()
        return int(port)

    def failover(self) -> None:
        """A failover the sentinels carry out (the replica is promoted)."""
        client = redis_lib.Redis(port=self.sentinel_ports[0], decode_responses=True)
        client.execute_command("SENTINEL", "FAILOVER", self.SERVICE)
        client.close()

    def stop(self) -> None:
        for proc in self.sentinels:
            proc.terminate()
            proc.wait(10)
        for server in [self.replica, *self.others]:
            if server:
                server.stop()
        self.primary.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@dataclass
class Clock:
    """An injected clock (epoch seconds) that tests move by hand."""

    now: float = 1_790_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


STORES = ["sqlite", "redis", "postgres"]


def pytest_configure(config: pytest.Config) -> None:
    """Check every document a store takes from its own written text against
    that text, value and type (:data:`sidecar.store.plan.CHECK_KNOWN`), small
    ones too: here, and in every sidecar process the tests start (they
    inherit the environment). Only under pytest: the benchmarks import this
    module for its servers and measure the sidecar as served."""
    os.environ["LOOPSTOP_CHECK_KNOWN_DOCS"] = "1"
    plan.CHECK_KNOWN = True
    plan.KEEP_DOC_CHARS = 0


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Give ``store_kind`` (hence ``store_url``, ``store``, ``make_app``, ``api``) every
    store under the ``all_stores`` marker, SQLite alone otherwise; each value carries
    its store's marker. Module-scoped, so a module-scoped server can follow it."""
    if "store_kind" not in metafunc.fixturenames:
        return
    kinds = STORES if metafunc.definition.get_closest_marker("all_stores") else STORES[:1]
    metafunc.parametrize(
        "store_kind",
        [pytest.param(kind, marks=getattr(pytest.mark, kind)) for kind in kinds],
        scope="module",
    )


def empty_store_url(kind: str, folder: Path, request: pytest.FixtureRequest) -> str:
    """An empty store of ``kind`` (sqlite, redis, postgres): a new SQLite file in
    ``folder``, or the session's Redis database flushed / PostgreSQL tables emptied."""
    if kind == "sqlite":
        return f"sqlite:///{folder}/loopstop.db"
    if kind == "postgres":
        pg: PostgresServer = request.getfixturevalue("postgres_server")
        pg.reset()
        return pg.url
    server: RedisServer = request.getfixturevalue("redis_server")
    server.client().flushdb()
    return server.url


@pytest.fixture
def store_url(store_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store URL of this test's kind (see ``pytest_generate_tests``)."""
    return empty_store_url(store_kind, tmp_path, request)


@pytest.fixture
def sidecar_env(store_url: str) -> dict[str, str]:
    """The environment of a served sidecar on this test's store, with the test tokens."""
    return {**TOKENS_ENV, "LOOPSTOP_STORE": store_url}


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = store_from_url(store_url)
    s.ensure_schema()
    yield s
    s.close()


AppFactory = Callable[..., Flask]


@pytest.fixture
def make_app(store_url: str, clock: Clock) -> AppFactory:
    """Build an app on this test's store; keyword arguments are config sections."""

    def build(tokens: bool = True, environ: dict[str, str] | None = None, **sections: Any) -> Flask:
        config: dict[str, Any] = {"store": store_url, **sections}
        env = {"LOOPSTOP_SECRET": SECRET}
        if tokens:
            config["tokens"] = TOKENS_CONFIG
            env.update(TOKENS_ENV)
        env.update(environ or {})
        return create_app(config, environ=env, clock=clock)

    return build


class Api:
    """A test client that sends a bearer token and returns (status, json)."""

    def __init__(self, client: FlaskClient, token: str | None = N8N_TOKEN) -> None:
        self.client = client
        self.token = token

    def _headers(self, token: str | None) -> dict[str, str]:
        tok = self.token if token == "default" else token
        return {"Authorization": f"Bearer {tok}"} if tok else {}

    def post(self, path: str, body: Any = None, token: str | None = "default") -> tuple[int, Any]:
        r = self.client.post(
            path, json=body if body is not None else {}, headers=self._headers(token)
        )
        return r.status_code, r.get_json(silent=True)

    def get(self, path: str, token: str | None = "default", **query: Any) -> tuple[int, Any]:
        r = self.client.get(path, query_string=query, headers=self._headers(token))
        return r.status_code, r.get_json(silent=True)

    def begin(self, op_id: str, payload: Any = None, **fields: Any) -> dict[str, Any]:
        status, body = self.post(
            f"/v1/operations/{op_id}/begin",
            {"payload": payload if payload is not None else {"x": 1}, **fields},
        )
        assert status == 200, body
        return dict(body)


@contextmanager
def served_by_flask(app: Flask) -> Iterator[list[str]]:
    """Within the block, the paths of the requests Flask's request machinery
    served (its ``request_started`` signal): what the hot path left to Flask."""
    from flask import request, request_started

    seen: list[str] = []

    def started(sender: Flask, **_: Any) -> None:
        seen.append(request.path)

    request_started.connect(started, app)
    try:
        yield seen
    finally:
        request_started.disconnect(started, app)


def flask_only(app: Flask) -> Client:
    """A client of the Flask app behind the hot path (every request through Flask)."""
    from sidecar.api.hot import HotRoutes

    hot = app.wsgi_app
    assert isinstance(hot, HotRoutes)
    return Client(hot._flask)


@pytest.fixture
def api(make_app: AppFactory) -> Api:
    return Api(make_app().test_client())


#: Markers and fixtures that keep a test out of the ``quick`` tier: a process it
#: starts (gunicorn, n8n, a CLI run: ``slow``) or a store server it talks to.
NOT_QUICK_MARKERS = ("slow", "n8n", "redis", "postgres")
NOT_QUICK_FIXTURES = frozenset({"redis_server", "postgres_server"})


def is_quick(item: pytest.Item) -> bool:
    """The ``quick`` tier: outside tests/e2e, none of ``NOT_QUICK_MARKERS`` (a test on
    SQLite or on no store at all) and none of ``NOT_QUICK_FIXTURES``."""
    if "e2e" in item.path.parts:
        return False
    if any(item.get_closest_marker(name) for name in NOT_QUICK_MARKERS):
        return False
    return not NOT_QUICK_FIXTURES & set(getattr(item, "fixturenames", ()))


#: Under pytest-xdist every test file is one unit of work (a module-scoped fixture,
#: a served sidecar or a store server, starts once), and the real-n8n tests, which share
#: the session's one n8n (``tests/e2e/conftest.py``), are one unit together.
N8N_TESTS = "tests/e2e/"


def in_worker_process() -> bool:
    """True in a pytest-xdist worker (``./scripts/test`` runs two; ``-n 0``: none)."""
    return "PYTEST_XDIST_WORKER" in os.environ


try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # pragma: no cover - pytest-xdist is a test dependency
    LoadFileScheduling = None


if LoadFileScheduling is not None:

    class FileOrN8nScheduling(LoadFileScheduling):
        """``--dist loadfile``, with every test under ``N8N_TESTS`` in one unit, so one
        worker runs the n8n suite in order on one n8n while the others take the files."""

        def _split_scope(self, nodeid: str) -> str:
            return N8N_TESTS if nodeid.startswith(N8N_TESTS) else super()._split_scope(nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        """``./scripts/test``'s ``--dist loadfile`` (any other ``--dist`` is xdist's)."""
        if config.getvalue("dist") == "loadfile":
            return FileOrN8nScheduling(config, log)
        return None


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects: ``-m quick`` sees the marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the ``quick`` tier, and order the real-n8n suite (the queue-mode n8n last of
    all: its stack is session-scoped, so it then runs alone).

    In one process the n8n suite runs after everything else; in an xdist worker it
    comes first, so the scheduler hands it to a worker at the start: it is the
    longest chain of the run."""
    distributed = in_worker_process()
    for item in items:
        if is_quick(item):
            item.add_marker(pytest.mark.quick)

    def order(item: pytest.Item) -> tuple[bool, bool]:
        is_n8n = item.get_closest_marker("n8n") is not None
        queue = "queue" in getattr(item, "fixturenames", ())
        return (not is_n8n if distributed else is_n8n, queue)

    items.sort(key=order)

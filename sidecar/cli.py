"""The ``loopstop`` command: ``serve`` and ``check-config``.

``loopstop serve`` validates everything in the master process before any
worker starts (configuration, bind addresses against authentication, the
secret, the store's schema), so a bad setup fails once, loudly, with every
error and its path, instead of as a crash loop of workers.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
from typing import Any

import click

from sidecar import __version__
from sidecar.auth import is_loopback
from sidecar.config import Settings, load_settings, read_config_file
from sidecar.errors import ConfigError, StoreUnavailable

log = logging.getLogger("loopstop")

DEFAULT_BIND = "127.0.0.1:8765"


class AddressInUse(ConfigError):
    """The address to listen on is taken: not a configuration error, one line of its own."""


def _print_problems(exc: ConfigError) -> None:
    if isinstance(exc, AddressInUse):
        click.echo(f"loopstop: cannot listen: {exc.problems[0][1]}", err=True)
        return
    click.echo("loopstop: invalid configuration:", err=True)
    for path, msg in exc.problems:
        click.echo(f"  {path or '(config)'}: {msg}", err=True)


def _bind_host(bind: str, strict: bool = False) -> str | None:
    """The host of a gunicorn bind (``HOST:PORT``, ``[::1]:PORT``); None for unix sockets.

    :raises ConfigError: with ``strict``, when the port is not a number.
    """
    if bind.startswith(("unix:", "fd://")):
        return None
    host, _, port = bind.rpartition(":")
    if strict and not port.isdigit():
        raise ConfigError([("LOOPSTOP_BIND", f"{bind!r} is not HOST:PORT")])
    return host or "0.0.0.0"


def check_free(binds: list[str]) -> None:
    """Refuse an address another process listens on, before saying we listen on it.

    :raises AddressInUse: naming the address in use.
    :raises ConfigError: when the address cannot be bound for another reason.
    """
    for bind in binds:
        host = _bind_host(bind)
        if host is None:
            continue
        port = int(bind.rpartition(":")[2])
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
            try:
                probe.bind((host, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise ConfigError([("bind", f"{bind}: {exc.strerror}")]) from exc
                raise AddressInUse(
                    [
                        (
                            "bind",
                            f"{bind} is in use (another loopstop serve?): stop it, or pass "
                            "--bind HOST:OTHER_PORT",
                        )
                    ]
                ) from exc


def check_binds(settings: Settings, binds: list[str]) -> None:
    """Refuse to listen beyond loopback without tokens.

    :raises ConfigError: when no token is configured and a bind address is
        not loopback (``0.0.0.0``, a LAN address, a hostname).
    """
    if settings.tokens:
        return
    public = [b for b in binds if (h := _bind_host(b)) is not None and not is_loopback(h)]
    if public:
        raise ConfigError(
            [
                (
                    "tokens",
                    f"no tokens are configured, so loopstop serves only loopback; refusing to bind "
                    f"{', '.join(public)}. Configure tokens (docs/reference/configuration.md, "
                    "'Making tokens') or bind 127.0.0.1.",
                )
            ]
        )


@click.group()
@click.version_option(__version__, prog_name="loopstop")
def main() -> None:
    """loopstop: a sidecar for n8n that makes automation loops stop."""
    level = os.environ.get("LOOPSTOP_LOG_LEVEL", "INFO").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        click.echo(
            f"loopstop: LOOPSTOP_LOG_LEVEL={level!r} is not one of DEBUG, INFO, "
            "WARNING, ERROR, CRITICAL",
            err=True,
        )
        sys.exit(2)
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    # Decision lines are JSON documents on their own (one per line, for log shippers).
    decisions = logging.getLogger("loopstop.decisions")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    decisions.addHandler(handler)
    decisions.propagate = False


@main.command("check-config")
def check_config() -> None:
    """Validate LOOPSTOP_CONFIG (or ./loopstop.yaml) and the environment; exit 1 on errors."""
    try:
        _, path = read_config_file(os.environ)
        settings = load_settings()
        from sidecar.app import secret_file_for
        from sidecar.canonical import build_fingerprinter
        from sidecar.store import check_store_url

        check_store_url(settings.store)
        if os.environ.get("LOOPSTOP_BIND"):
            _bind_host(os.environ["LOOPSTOP_BIND"], strict=True)
        if os.environ.get("LOOPSTOP_SECRET") or secret_file_for(settings.store) is None:
            build_fingerprinter(os.environ, None)
    except ConfigError as exc:
        _print_problems(exc)
        sys.exit(1)
    except ValueError as exc:
        _print_problems(ConfigError([("LOOPSTOP_SECRET", str(exc))]))
        sys.exit(1)
    auth = f"{len(settings.tokens)} token(s)" if settings.tokens else "no tokens (loopback only)"
    click.echo(
        f"configuration ok ({path or 'no file, defaults'}); "
        f"store {_redacted_store(settings.store)}; {auth}"
        + (f"; n8n API {_redacted_store(settings.n8n.api_url)}" if settings.n8n else "")
    )


@main.command()
@click.option(
    "--bind",
    "binds",
    multiple=True,
    metavar="HOST:PORT",
    help=f"Address to listen on (repeatable). Default {DEFAULT_BIND}.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=2,
    show_default=True,
    help="gunicorn worker processes.",
)
@click.option(
    "--threads",
    type=click.IntRange(1, 256),
    default=8,
    show_default=True,
    help="Threads per worker (gthread): requests one worker serves at once.",
)
@click.option(
    "--request-timeout",
    "request_timeout_s",
    type=click.FloatRange(1, 300),
    default=10.0,
    show_default=True,
    help="Seconds a client has to send a whole request (headers and body) "
    "before its connection is closed.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.IntRange(5, 3600),
    default=60,
    show_default=True,
    help="Seconds before a silent worker is restarted.",
)
def serve(
    binds: tuple[str, ...], workers: int, threads: int, request_timeout_s: float, timeout_s: int
) -> None:
    """Run the sidecar under gunicorn.

    gunicorn's ``gthread`` worker with a bounded thread pool (``--threads``)
    and a deadline on reading each request (``--request-timeout``,
    :mod:`sidecar.serving`): idle and slow connections never hold the
    threads n8n's requests need.
    """
    os.environ["LOOPSTOP_REQUEST_READ_TIMEOUT_S"] = str(request_timeout_s)
    bind_list = list(binds) or [os.environ.get("LOOPSTOP_BIND", DEFAULT_BIND)]
    _metrics_folder()
    try:
        for bind in bind_list:
            _bind_host(bind, strict=True)
        settings = load_settings()
        _, config_path = read_config_file(os.environ)
        from sidecar.serving import SLOW_WRITERS_ENV, WRITE_TIMEOUT_ENV

        os.environ[WRITE_TIMEOUT_ENV] = str(settings.http.write_timeout_s)
        os.environ[SLOW_WRITERS_ENV] = str(settings.http.slow_writers)
        check_binds(settings, bind_list)
        check_free(bind_list)
        from sidecar.app import create_app

        # Validate once in the master: secret (created here, once), store, schema.
        probe = create_app(settings, announce=False)
        probe_store = probe.extensions["loopstop"].store
        if probe_store.identity:  # the workers refuse a store that is not this one
            from sidecar.app import STORE_ID_ENV

            os.environ[STORE_ID_ENV] = probe_store.identity
        probe_store.close()
    except ConfigError as exc:
        _print_problems(exc)
        sys.exit(2)
    except StoreUnavailable as exc:
        click.echo(f"loopstop: store unavailable: {exc.detail}", err=True)
        sys.exit(3)
    if not settings.tokens:
        log.warning(
            "no tokens configured: serving WITHOUT authentication on %s (loopback only); "
            "any bearer token a caller sends is ignored (n8n's credential test passes with any)",
            ", ".join(bind_list),
        )
    log.info(
        "loopstop %s: configuration %s, store %s, %s, %d worker(s), listening on %s",
        __version__,
        config_path or "none found (defaults)",
        _redacted_store(settings.store),
        f"{len(settings.tokens)} token(s)" if settings.tokens else "no tokens",
        workers,
        ", ".join(bind_list),
    )
    _Gunicorn(
        {
            "bind": bind_list,
            "workers": workers,
            "worker_class": "sidecar.serving.BoundedThreadWorker",
            "threads": threads,
            "worker_connections": 1000,
            "timeout": timeout_s,
            "graceful_timeout": 20,
            "keepalive": 5,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": os.environ.get("LOOPSTOP_LOG_LEVEL", "info").lower(),
            "proc_name": "loopstop",
            "forwarded_allow_ips": "127.0.0.1,::1",
            "control_socket_disable": True,
            "limit_request_line": 8190,  # long ids reach the app and get a 422 problem
            "child_exit": _child_exit,
        }
    ).run()


@main.command()
@click.option("--vacuum", is_flag=True, help="Also give the freed pages back to the disk.")
def purge(vacuum: bool) -> None:
    """Delete every expired record now (SQLite, PostgreSQL; Redis expires keys by itself)."""
    from sidecar.store import Compactable, Sweepable, sqlite_path, store_from_url

    try:
        settings = load_settings()
        store = store_from_url(settings.store, timeout_s=max(settings.store_timeout_s, 30.0))
    except ConfigError as exc:
        _print_problems(exc)
        sys.exit(2)
    except StoreUnavailable as exc:
        click.echo(f"loopstop: store unavailable: {exc.detail}", err=True)
        sys.exit(3)
    if not isinstance(store, Sweepable):
        click.echo("redis expires every key by its TTL: nothing to purge")
        return
    total = 0
    try:
        while n := store.sweep():
            total += n
        if vacuum and isinstance(store, Compactable):
            store.vacuum()
    except StoreUnavailable as exc:
        click.echo(f"loopstop: store unavailable: {exc.detail}", err=True)
        sys.exit(3)
    where = sqlite_path(settings.store) or _redacted_store(settings.store)
    click.echo(f"purged {total} expired record(s) from {where}")


@main.command("accept-store")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def accept_store(yes: bool) -> None:
    """Accept the store as it is now, after it was emptied or replaced.

    Workers refuse every decision (503, not ready) once the store they saw
    loses its identity: a Redis restarted without its data, a database
    swapped for another. Accepting says the ledger now starts from what this
    store holds: any write committed before and missing here can run again
    when its workflow retries it. Check the system of record first.
    """
    from sidecar.store import store_from_url

    try:
        settings = load_settings()
        store = store_from_url(settings.store, timeout_s=max(settings.store_timeout_s, 10.0))
        click.echo(
            "Accepting this store means: every operation it does not hold is new to "
            "loopstop. A committed write whose record was lost (an emptied Redis, a "
            "replaced database) will execute again when its workflow retries it."
        )
        if not yes:
            click.confirm("Accept the store as it is now?", abort=True)
        before, accepted = store.accept()
    except ConfigError as exc:
        _print_problems(exc)
        sys.exit(2)
    except StoreUnavailable as exc:
        click.echo(f"loopstop: store unavailable: {exc.detail}", err=True)
        sys.exit(3)
    what = "was empty" if before is None else f"had identity {before}"
    click.echo(
        f"accepted store {accepted} ({what}); running workers serve on it again "
        "at their next request"
    )
    store.close()


def _metrics_folder() -> None:
    """Give the workers one folder for their metric samples (multiprocess mode),
    emptied at start so a restart does not count the previous run twice."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        for old in path.glob("*.db"):
            old.unlink()
    else:
        path = Path(tempfile.mkdtemp(prefix="loopstop-metrics-"))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
        master = os.getpid()

        def remove() -> None:
            # Forked workers inherit this handler: only the master's exit removes the
            # folder (a worker restarted by gunicorn must leave it to the others).
            if os.getpid() == master:
                shutil.rmtree(path, True)

        atexit.register(remove)


def _child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook: a dead worker's live gauges leave the aggregate."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


def _redacted_store(url: str) -> str:
    from sidecar.urls import redact_url

    return redact_url(url)  # a store's or n8n's URL: never its password


def _gunicorn_base() -> type:
    from gunicorn.app.base import BaseApplication

    return BaseApplication  # type: ignore[no-any-return]


class _Gunicorn(_gunicorn_base()):  # type: ignore[misc]
    """gunicorn with our options; each worker builds its own app (no preload)."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            if key in self.cfg.settings:  # settings newer gunicorns added are optional
                self.cfg.set(key, value)

    def load(self) -> Any:
        from sidecar.app import create_app

        return create_app(announce=False)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(exists=True, dir_okay=False),
    help="A YAML file (limits, policies, tools, chains, operations...) replacing "
    "those sections of each scenario's configuration: tune limits on a "
    "captured incident before deploying them.",
)
@click.option(
    "--store",
    "store_url",
    default=None,
    help="Store URL to replay into (default: a temporary SQLite file).",
)
@click.option("--verbose", "-v", is_flag=True, help="Print every answer in full.")
def replay(
    files: tuple[str, ...], policy_file: str | None, store_url: str | None, verbose: bool
) -> None:
    """Replay scenario files (tests/scenarios/*.json): one line per step with its
    decision, reason and counters, then the final envelope; exit 1 when an
    expectation is not met."""
    from pathlib import Path

    import yaml
    from pydantic import ValidationError

    from sidecar import replay as replayer

    if not verbose:
        logging.getLogger("loopstop.decisions").setLevel(logging.WARNING)
    policy: dict[str, Any] = {}
    if policy_file:
        loaded = yaml.safe_load(Path(policy_file).read_text()) or {}
        if not isinstance(loaded, dict):
            click.echo(f"{policy_file}: the top level must be a mapping", err=True)
            sys.exit(2)
        policy = loaded
    failed = steps = 0
    for name in files:
        try:
            scenario = replayer.load(Path(name))
            if policy:
                scenario = scenario.model_copy(update={"config": {**scenario.config, **policy}})
        except (ValidationError, ValueError) as exc:
            click.echo(f"{name}: not a scenario file: {exc}", err=True)
            failed += 1
            continue
        click.echo(f"{name}: {scenario.name}")
        envelope = None
        try:
            results = list(replayer.run(scenario, store_url))
        except ConfigError as exc:
            _print_problems(exc)
            sys.exit(2)
        for result in results:
            step = result.step
            what = (
                (step.post and f"POST {step.post}")
                or (step.get and f"GET {step.get}")
                or f"advance {step.advance_s} s"
            )
            mark = "ok  " if result.ok else "FAIL"
            click.echo(
                f"  {mark} {result.index:>2} {what}{_summary(result.body)}"
                + (f"  ({step.note})" if step.note else "")
            )
            if verbose and result.body is not None:
                click.echo("       " + json.dumps(result.body, sort_keys=True))
            for problem in result.mismatches:
                click.echo(f"       {problem}")
            if isinstance(result.body, dict) and "envelope" in result.body:
                envelope = result.body["envelope"]
            failed += not result.ok
            steps += 1
        if envelope is not None:
            click.echo("  final envelope: " + json.dumps(envelope, sort_keys=True))
    click.echo(f"{steps - failed} steps ok, {failed} failed")
    sys.exit(1 if failed else 0)


def _summary(body: Any) -> str:
    """`` -> decision/reason [counters]`` of an answer, for one replay line."""
    if not isinstance(body, dict):
        return ""
    parts = []
    if "decision" in body:
        parts.append(str(body["decision"]) + (f"/{body['reason']}" if body.get("reason") else ""))
    elif "operation" in body and isinstance(body["operation"], dict):
        parts.append(str(body["operation"].get("state")))
    elif "type" in body and "status" in body:
        parts.append(f"{body['status']} {str(body['type']).rsplit(':', 1)[-1]}")
    used = (body.get("task") or {}).get("used") if isinstance(body.get("task"), dict) else None
    if used:
        parts.append(
            "["
            + " ".join(f"{k}={used[k]}" for k in ("model_calls", "tool_calls", "polls", "tokens"))
            + "]"
        )
    if "depth" in body and body.get("depth") is not None:
        parts.append(f"depth={body['depth']}")
    return ("  -> " + " ".join(parts)) if parts else ""

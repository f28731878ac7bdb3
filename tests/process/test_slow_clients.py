"""Slow and idle clients cannot hold the workers n8n needs (real gunicorn, real sockets).

``loopstop serve`` runs gunicorn's gthread worker with a bounded thread pool
and a deadline on reading each request (:mod:`sidecar.serving`). Eight
clients that each send one header line a second (or one byte of a body a
second), reconnecting whenever they are cut off, stay connected for the
whole run; meanwhile ordinary requests (n8n's: a begin, a health probe)
must still be answered.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest
import requests
from served import Sidecar

pytestmark = pytest.mark.slow

SLOW_CLIENTS = 8
READ_TIMEOUT_S = 3


#: What a slow client sends first, and then one piece of every second, forever:
#: a header line (the headers never end), or a byte of a body that never ends.
DRIPS = {
    "headers": (
        b"POST /v1/operations/slow/begin HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        b"X-Slow: 1\r\n",
    ),
    "body": (
        b"POST /v1/operations/slow/begin HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{",
        b" ",
    ),
}


def _drip(port: int, stop: threading.Event, lifetimes: list[float], drip: str) -> None:
    """One slow client: the start of a request, then one more piece a second, forever."""
    first, piece = DRIPS[drip]
    while not stop.is_set():
        opened = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(first)
                while not stop.is_set():
                    time.sleep(1)
                    sock.sendall(piece)
                    sock.settimeout(0.01)
                    try:
                        if sock.recv(1) == b"":
                            raise ConnectionResetError("closed by the server")
                    except TimeoutError:
                        pass
        except OSError:
            lifetimes.append(time.monotonic() - opened)


@pytest.mark.parametrize("drip", sorted(DRIPS))
def test_eight_slow_clients_do_not_starve_ordinary_requests(tmp_path: Path, drip: str) -> None:
    served = Sidecar(
        tmp_path, {}, workers=2, extra=("--request-timeout", str(READ_TIMEOUT_S))
    ).start()
    stop = threading.Event()
    lifetimes: list[float] = []
    drips = [
        threading.Thread(target=_drip, args=(served.port, stop, lifetimes, drip), daemon=True)
        for _ in range(SLOW_CLIENTS)
    ]
    try:
        for t in drips:
            t.start()
        time.sleep(1.5)  # every slow client is connected and dripping
        answered = total = 0
        slowest = 0.0
        deadline = time.monotonic() + 12
        i = 0
        with requests.Session() as session:
            while time.monotonic() < deadline:
                i += 1
                started = time.monotonic()
                try:
                    if i % 2:
                        r = session.get(f"{served.base}/healthz", timeout=2)
                    else:
                        r = session.post(
                            f"{served.base}/v1/operations/probe-{i}/begin",
                            json={"payload": {"i": i}},
                            timeout=2,
                        )
                    ok = r.status_code == 200
                except requests.RequestException:
                    ok = False
                took = time.monotonic() - started
                slowest = max(slowest, took)
                total += 1
                answered += ok and took <= 2
                time.sleep(0.05)
        share = answered / total
        print(
            f"with {SLOW_CLIENTS} slow clients ({drip}) connected: {answered}/{total} ordinary "
            f"requests answered within 2 s ({share:.1%}), slowest {slowest:.2f} s; slow "
            f"connections cut after {min(lifetimes, default=0):.1f}-"
            f"{max(lifetimes, default=0):.1f} s ({len(lifetimes)} cuts)"
        )
        assert share >= 0.95
        # Slow clients are cut at the read deadline (and reconnect), never kept forever.
        assert lifetimes and max(lifetimes) < READ_TIMEOUT_S + 3
    finally:
        stop.set()
        served.stop()


def test_without_tokens_the_host_must_name_the_bound_port(tmp_path: Path) -> None:
    served = Sidecar(tmp_path, {}, workers=1).start()
    try:
        url = f"{served.base}/v1/whoami"
        assert requests.get(url, headers={"Host": f"localhost:{served.port}"}, timeout=5).ok
        for host in (f"localhost:{served.port + 1}", "localhost", f"evil.example:{served.port}"):
            r = requests.get(url, headers={"Host": host}, timeout=5)
            assert r.status_code == 421, (host, r.text)
    finally:
        served.stop()


READERS = 40
PIPELINED = 60


def _never_read(port: int, stop: threading.Event, opened: list[float]) -> None:
    """One client that never reads: a 4 KiB receive buffer, 60 pipelined
    ``GET /openapi.json``, then silence; a new such connection every 30 s (a cut
    one cannot tell: the server's FIN waits behind the answers it never reads)."""
    request = f"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    while not stop.is_set():
        opened.append(time.monotonic())
        with contextlib.suppress(OSError), socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.settimeout(5)
            sock.connect(("127.0.0.1", port))
            sock.sendall(request * PIPELINED)
            stop.wait(30)


def cut_count(served: Sidecar) -> int:
    """Connections the server cut for not reading its answers (its log says each)."""
    return served.log.read_text().count("closed a connection that does not read its answers")


@pytest.mark.security
def test_item2_clients_that_never_read_do_not_starve_probes(
    tmp_path: Path, sidecar_env: dict[str, str]
) -> None:
    """Attack item 2: 40 connections with a 4 KiB receive buffer that pipeline 60
    ``GET /openapi.json`` each and never read held every thread of 2 workers x 8
    threads (``/healthz`` answered 0 of 28). Each response now has a write deadline,
    and only a few threads per worker may wait on a client that does not read (the
    others are cut at once): ``/healthz`` and a tokened request keep being answered."""
    from served import tokens_yaml, write_config

    from conftest import N8N_TOKEN

    config = write_config(tmp_path / "loopstop.yaml", tokens_yaml())
    served = Sidecar(tmp_path, {**sidecar_env, "LOOPSTOP_CONFIG": str(config)}, workers=2).start()
    stop = threading.Event()
    opened: list[float] = []
    readers = [
        threading.Thread(target=_never_read, args=(served.port, stop, opened), daemon=True)
        for _ in range(READERS)
    ]
    try:
        for t in readers:
            t.start()
        time.sleep(3)  # every reader connected and pipelining
        results: dict[str, list[float]] = {"healthz": [], "tokened": []}
        # Long enough for the readers' answers to fill the socket buffers (4 MB on
        # loopback: about 45 of the 60 answers), which took 20 s in the attack.
        deadline = time.monotonic() + 40
        i = 0
        while time.monotonic() < deadline:
            i += 1
            kind = "healthz" if i % 2 else "tokened"
            started = time.monotonic()
            try:
                with requests.Session() as session:  # a fresh connection, as a probe makes
                    if kind == "healthz":
                        r = session.get(f"{served.base}/healthz", timeout=2)
                    else:
                        r = session.get(
                            f"{served.base}/v1/whoami",
                            headers={"Authorization": f"Bearer {N8N_TOKEN}"},
                            timeout=2,
                        )
                ok = r.status_code == 200
            except requests.RequestException:
                ok = False
            took = time.monotonic() - started
            results[kind].append(took if ok else float("inf"))
            time.sleep(0.1)
        shares = {}
        for kind, took in results.items():
            within = sum(1 for t in took if t <= 2)
            shares[kind] = within / len(took)
            print(
                f"{READERS} clients that never read: {kind} {within}/{len(took)} answered "
                f"within 2 s ({shares[kind]:.1%}), slowest "
                f"{max((t for t in took if t != float('inf')), default=0):.2f} s; "
                f"{len(opened)} reader connections opened, {cut_count(served)} cut"
            )
        assert shares["healthz"] >= 0.95 and shares["tokened"] >= 0.95, shares
        assert cut_count(served) > 0  # readers are cut, not kept forever
    finally:
        stop.set()
        served.stop()

"""Slow and idle clients cannot hold the workers n8n needs (real gunicorn, real sockets).

``loopstop serve`` runs gunicorn's gthread worker with a bounded thread pool
and a deadline on reading each request (:mod:`sidecar.serving`). Eight
clients that each send one header line a second (or one byte of a body a
second), reconnecting whenever they are cut off, stay connected for the
whole run; meanwhile ordinary requests (n8n's: a begin, a health probe)
must still be answered.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
import requests
from test_serve import Sidecar

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

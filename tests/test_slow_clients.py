"""Slow and idle clients cannot hold the workers n8n needs (real gunicorn, real sockets).

``loopstop serve`` runs gunicorn's gthread worker with a bounded thread pool
and a deadline on reading each request (:mod:`sidecar.serving`). Eight
clients that each send one header line a second, reconnecting whenever they
are cut off, stay connected for the whole run; meanwhile ordinary requests
(n8n's: a begin, a health probe) must still be answered.
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


def _drip(port: int, stop: threading.Event, lifetimes: list[float]) -> None:
    """One slow client: a request line, then one header line a second, forever."""
    while not stop.is_set():
        opened = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"POST /v1/operations/slow/begin HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                while not stop.is_set():
                    time.sleep(1)
                    sock.sendall(b"X-Slow: 1\r\n")
                    sock.settimeout(0.01)
                    try:
                        if sock.recv(1) == b"":
                            raise ConnectionResetError("closed by the server")
                    except TimeoutError:
                        pass
        except OSError:
            lifetimes.append(time.monotonic() - opened)


def test_eight_slow_clients_do_not_starve_ordinary_requests(tmp_path: Path) -> None:
    served = Sidecar(
        tmp_path, {}, workers=2, extra=("--request-timeout", str(READ_TIMEOUT_S))
    ).start()
    stop = threading.Event()
    lifetimes: list[float] = []
    drips = [
        threading.Thread(target=_drip, args=(served.port, stop, lifetimes), daemon=True)
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
            f"with {SLOW_CLIENTS} slow clients connected: {answered}/{total} ordinary requests "
            f"answered within 2 s ({share:.1%}), slowest {slowest:.2f} s; slow connections "
            f"cut after {min(lifetimes, default=0):.1f}-{max(lifetimes, default=0):.1f} s "
            f"({len(lifetimes)} cuts)"
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

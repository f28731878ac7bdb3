"""The watch on an answer's head (sidecar.outbound.head_watch) on real sockets:
a socket past its deadline is shut down, one released in time is not; the
watch survives a socket it cannot shut down, keeps its deadlines bounded and
works in a process forked after its first use."""

from __future__ import annotations

import os
import socket
import time
import warnings

from sidecar.outbound.head_watch import HeadWatch


def _shut_within(sock: socket.socket, seconds: float) -> bool:
    """Whether ``sock``'s reads end (shut down) within ``seconds``."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def test_a_socket_past_its_deadline_is_shut_down_and_one_released_is_not() -> None:
    watch = HeadWatch()
    late, peer = socket.socketpair()
    kept, peer2 = socket.socketpair()
    with late, peer, kept, peer2:
        watch.arm(late, time.monotonic() + 0.1)
        watch.release(watch.arm(kept, time.monotonic() + 0.1))
        assert _shut_within(late, 2.0)
        assert not _shut_within(kept, 0.3)


class _NoShutdown:
    """A socket-like object whose shutdown raises what no socket raises."""

    def shutdown(self, how: int) -> None:
        raise AttributeError("shutdown")


def test_the_watch_outlives_a_socket_it_cannot_shut_down() -> None:
    watch = HeadWatch()
    watch.arm(_NoShutdown(), time.monotonic())  # type: ignore[arg-type]
    time.sleep(0.1)
    sock, peer = socket.socketpair()
    with sock, peer:
        watch.arm(sock, time.monotonic() + 0.1)
        assert _shut_within(sock, 2.0)


def test_released_deadlines_do_not_pile_up_behind_a_long_one() -> None:
    watch = HeadWatch()
    slow, peer = socket.socketpair()
    with slow, peer:
        watch.arm(slow, time.monotonic() + 600)  # one head that may take ten minutes
        for _ in range(10_000):
            watch.release(watch.arm(slow, time.monotonic() + 600))
        assert watch.backlog() <= 2 * 1 + 64 + 1


def test_a_process_forked_after_first_use_still_watches() -> None:
    watch = HeadWatch()
    first, peer = socket.socketpair()
    with first, peer:
        watch.arm(first, time.monotonic() + 0.05)
        assert _shut_within(first, 2.0)  # the parent's thread runs
    with warnings.catch_warnings():  # 3.12+: forking a process that has threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: its own thread, its own lock
        code = 1
        try:
            sock, _peer = socket.socketpair()
            watch.arm(sock, time.monotonic() + 0.1)
            code = 0 if _shut_within(sock, 2.0) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0

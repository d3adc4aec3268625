"""gunicorn's ``gthread`` worker, keeping a keep-alive connection on its thread for a moment
(``deploy/gunicorn.conf.py`` sets ``worker_class`` to ``KeepAliveThreadWorker``).

Stock ``gthread`` hands every keep-alive connection back to the worker's main thread after
each response: the thread that answered queues a callback for the main thread (a wake-up
through a pipe), the main thread registers the socket in its poller, and when the next
request arrives the main thread wakes again and submits the connection to the thread pool,
whose thread wakes a third time. On this project's 2-vCPU machine those three wake-ups
cost ~0.2 ms of a request's latency at concurrency 1 (a trivial WSGI app: p50 0.52–0.70 ms
stock, 0.29–0.36 ms with this worker; docs/performance.md, "The keep-alive linger").

This worker lets the thread that answered wait up to ``GUNICORN_KEEPALIVE_LINGER_MS``
(default 2 ms, ``0`` = stock behaviour) for the connection's next request and serve it
itself, as long as no other connection is waiting for a thread (the pool's queue is
empty): a client sending requests one after another on one connection (an SDK loop, nginx's
upstream keep-alive connections under steady traffic) skips the hand-over. When the wait
runs out, when other work is queued, or when the worker is stopping, the connection goes
back to the poller exactly as before, so keep-alive timeouts, connection limits, graceful
stops and ``max_requests`` are gunicorn's own. Only HTTP/1.x connections linger.

The pool's queue is checked again when the next request arrives: a connection queued
meanwhile is served first (the lingering one goes back to the poller, readable, behind
it). What the linger can cost another connection is the wait itself: when every thread
of the worker lingers, a newly readable connection waits up to the linger for one.
"""
from __future__ import annotations

import os
import select

from gunicorn.workers.gthread import ThreadWorker


def _linger_seconds() -> float:
    raw = os.environ.get("GUNICORN_KEEPALIVE_LINGER_MS", "2")
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"GUNICORN_KEEPALIVE_LINGER_MS must be a number of milliseconds, not {raw!r}")
    if not 0 <= value <= 1000:
        raise SystemExit(f"GUNICORN_KEEPALIVE_LINGER_MS must be between 0 and 1000, not {raw!r}")
    return value / 1000


class KeepAliveThreadWorker(ThreadWorker):
    """``gthread`` plus the linger described in the module docstring."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.linger = _linger_seconds()
        self.served_in_place = 0  # requests served without the hand-over (tests, debugging)

    def handle(self, conn):
        result = super().handle(conn)
        while result is True and self._may_linger(conn):
            if not _buffered(conn) and not _readable_within(conn.sock, self.linger):
                break  # nothing yet: back to the poller (finish_request), as stock gthread does
            if not self._may_linger(conn):
                break  # work was queued meanwhile: it goes first, this connection behind it
            self.served_in_place += 1  # not locked: an approximate count for tests
            result = super().handle(conn)
        return result

    def _may_linger(self, conn) -> bool:
        if self.linger <= 0 or not self.alive or conn.is_http2:
            return False
        queue = getattr(self.tpool, "_work_queue", None)  # ThreadPoolExecutor's pending work
        return queue is not None and queue.empty()


def _buffered(conn) -> bool:
    """Bytes of the next request already read: by the parser (a pipelined request, a
    body drain reading ahead) or, on TLS, decrypted by the SSL object — the poller cannot
    see either."""
    if conn.parser.unreader.buf.getvalue():
        return True
    pending = getattr(conn.sock, "pending", None)
    return bool(pending and pending())


def _readable_within(sock, seconds: float) -> bool:
    """The socket has bytes to read (or was closed by the peer) within ``seconds``."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(seconds * 1000))
    except (OSError, ValueError):
        return False

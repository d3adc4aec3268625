"""gunicorn's ``gthread`` worker, keeping a keep-alive connection on its thread for a moment
(``deploy/gunicorn.conf.py`` sets ``worker_class`` to ``KeepAliveThreadWorker``).

Stock ``gthread`` hands every keep-alive connection back to the worker's main thread after
each response: the thread that answered queues a callback for the main thread (a wake-up
through a pipe), the main thread registers the socket in its poller, and when the next
request arrives the main thread wakes again and submits the connection to the thread pool,
whose thread wakes a third time. On this project's 2-vCPU machine those three wake-ups
cost ~0.2 ms of a request's latency at concurrency 1 (a trivial WSGI app: p50 0.52–0.70 ms
stock, 0.29–0.36 ms with this worker; bench/DIARY.md, "The keep-alive linger").

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

**Connections spread evenly over the workers.** All workers accept from the one
listening socket the master opened; the kernel wakes every worker's poller and whichever
runs first takes the connection. A worker that is already running (it just served a
request) wins nearly every race, so a burst of new connections — wrk's 16, nginx
opening its upstream keep-alive pool — could all land on ONE worker (seen on the bench:
16 connections on one worker, none on the other, for the whole measurement). Keep-alive
connections stay where they were accepted, so that worker was capped at one core by its
GIL while the other idled: metered calls at c=16 ran at 866 req/s instead of ~1,430,
with ~35 % more CPU per call from eight threads contending for one GIL.

So the workers of one master share a small table (an anonymous shared mapping made in
the master, where this module is imported before any fork): each worker's number of
open connections, written by its main thread on every turn of its loop. A worker
accepts only while it holds no more connections than the least loaded other live worker
(``_Balance.may_accept``); otherwise it takes its listening socket out of its poller and
looks again every ``GATED_POLL`` seconds. The least loaded worker never stops accepting;
when a connection has waited ``STALL_SECONDS`` on the listening socket and that worker
has not run its loop since (its main thread stalled: a request holding the GIL, gunicorn
closing a connection gracefully), a held-back worker takes it, one per stall seen, so
holding back costs a new connection at most ~40 ms; a worker that is merely slower than a
burst keeps running its loop and still gets the burst. A worker that is
stopping, whose process is gone, or that has not written its row for ``LIVE_SECONDS`` is
ignored; the master empties a row once its worker has exited. Off with ``reuse_port``
(each worker has its own listening socket there, and only it can accept what the kernel
queues on it) and with ``GUNICORN_BALANCE=0`` (stock accepts). With one worker nothing
changes.
"""
from __future__ import annotations

import mmap
import os
import select
import struct
import time

from gunicorn.workers.gthread import ThreadWorker

GATED_POLL = 0.02  # seconds: how often a worker holding more than its share looks again
# a connection the listening socket has held this long while this worker held back is
# accepted anyway: the least loaded worker is not taking it (its main thread is stalled)
STALL_SECONDS = 0.02
LIVE_SECONDS = 2.0  # a row not written for this long is not a live worker's (the loop writes ≥ 1/s)
RESERVATION_SECONDS = 300.0  # a row reserved for a fork that never claimed it is free again


def _linger_seconds() -> float:
    raw = os.environ.get("GUNICORN_KEEPALIVE_LINGER_MS", "2")
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"GUNICORN_KEEPALIVE_LINGER_MS must be a number of milliseconds, not {raw!r}")
    if not 0 <= value <= 1000:
        raise SystemExit(f"GUNICORN_KEEPALIVE_LINGER_MS must be between 0 and 1000, not {raw!r}")
    return value / 1000


def _balance_enabled() -> bool:
    raw = os.environ.get("GUNICORN_BALANCE", "1")
    if raw not in ("0", "1"):
        raise SystemExit(f"GUNICORN_BALANCE must be 1 (spread connections over the workers) or 0, not {raw!r}")
    return raw == "1"


class _Balance:
    """The open-connection counts of one master's workers, in shared memory.

    A header (how many rows have ever been used: readers scan only those) and rows of
    (pid, open connections, last written on CLOCK_MONOTONIC, which every process of the
    machine shares). The master reserves a row for each worker it is about to fork
    (``reserve``, in the worker object's ``__init__``: the master creates workers one at a
    time, so no lock is needed); the forked worker writes its pid there (``claim``) and
    keeps it current (``publish``). A stopping worker keeps its row but marks it not live
    (``stop``: others stop deferring to it, and the row is not handed to a new worker while
    the old one drains); the master empties it once the worker has exited (``leave``, only
    if the row is still that worker's). A row is free when it is empty, when its process
    is gone, or when a reservation was never claimed (a fork that failed)."""

    HEAD = struct.Struct("q")
    ROW = struct.Struct("qqd")
    ROWS = 256  # more workers than any master here runs (beyond it: ungated workers)
    RESERVED = -1

    def __init__(self, rows: int = ROWS):
        self.rows = rows
        self.mem = mmap.mmap(-1, self.HEAD.size + rows * self.ROW.size)  # MAP_SHARED | MAP_ANONYMOUS

    def _used(self) -> int:
        return self.HEAD.unpack_from(self.mem, 0)[0]

    def _read(self, i: int) -> tuple[int, int, float]:
        return self.ROW.unpack_from(self.mem, self.HEAD.size + i * self.ROW.size)

    def _write(self, i: int, pid: int, conns: int, seen: float) -> None:
        self.ROW.pack_into(self.mem, self.HEAD.size + i * self.ROW.size, pid, conns, seen)

    def reserve(self) -> int | None:
        """Master: a free row for the worker about to be forked (None: table full — that
        worker then accepts without the gate)."""
        now = time.monotonic()
        for i in range(self.rows):
            pid, _, seen = self._read(i)
            if pid == 0 or (pid == self.RESERVED and now - seen > RESERVATION_SECONDS) or \
                    (pid > 0 and not process_exists(pid)):
                self._write(i, self.RESERVED, 0, now)
                if i >= self._used():
                    self.HEAD.pack_into(self.mem, 0, i + 1)
                return i
        return None

    def claim(self, row: int, pid: int) -> None:
        self._write(row, pid, 0, time.monotonic())

    def publish(self, row: int, pid: int, conns: int) -> float:
        now = time.monotonic()
        self._write(row, pid, conns, now)
        return now

    def stop(self, row: int, pid: int) -> None:
        """The worker is stopping: still its row, no longer a live one for the others."""
        self._write(row, pid, 0, 0.0)

    def leave(self, row: int, pid: int) -> None:
        """Empty ``row`` if it is still ``pid``'s (or a reservation never claimed)."""
        owner = self._read(row)[0]
        if owner == pid or owner == self.RESERVED:
            self._write(row, 0, 0, 0.0)

    def may_accept(self, row: int, conns: int, now: float) -> bool:
        """True when no other live worker holds fewer open connections than ``conns``."""
        return self.held_back_since(row, conns, now) is None

    def held_back_since(self, row: int, conns: int, now: float) -> float | None:
        """None when no other live worker holds fewer open connections than ``conns``;
        else when the most recently active of those workers last wrote its row."""
        latest = None
        for i in range(self._used()):
            if i == row:
                continue
            pid, other, seen = self._read(i)
            if pid > 0 and now - seen < LIVE_SECONDS and other < conns and process_exists(pid):
                # (the process test: a worker killed a moment ago has fewer)
                latest = seen if latest is None else max(latest, seen)
        return latest


def process_exists(pid: int) -> bool:
    """The process exists (a zombie not yet reaped counts; another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# Made at import: in the master, which imports the worker class before it forks any worker.
BALANCE = _Balance()


class KeepAliveThreadWorker(ThreadWorker):
    """``gthread`` plus the linger and the even spread described in the module docstring."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.linger = _linger_seconds()
        self.served_in_place = 0  # requests served without the hand-over (tests, debugging)
        # runs in the master, right before the fork. Not with reuse_port: each worker then
        # has a listening socket of its own that the kernel hands connections to, and only
        # that worker can accept them
        self.balance_row = BALANCE.reserve() if _balance_enabled() and not self.cfg.reuse_port else None
        self.fair_share = True
        self._backlog_since = None  # when this held-back worker first saw a connection waiting

    def run(self):
        if self.balance_row is not None:
            BALANCE.claim(self.balance_row, os.getpid())
        try:
            super().run()
        finally:
            # stopping with no connection left skips the drain loop that writes it
            if self.balance_row is not None:
                BALANCE.stop(self.balance_row, self.pid)

    def release_balance_row(self):
        """Master, when this worker has exited (``child_exit`` in deploy/gunicorn.conf.py):
        its row is free (if it is still its own)."""
        if self.balance_row is not None:
            BALANCE.leave(self.balance_row, self.pid)

    def set_accept_enabled(self, enabled):
        # gthread's loop enables accepting whenever it is below worker_connections; keep
        # the listener out of the poller while this worker holds more than its share
        super().set_accept_enabled(enabled and self.fair_share and self.alive)

    def wait_for_and_dispatch_events(self, timeout):
        """One turn of gthread's loop: write this worker's count, look at the others'."""
        if self.balance_row is not None:
            if not self.alive:
                BALANCE.stop(self.balance_row, self.pid)  # stopping: nobody waits for this one
            else:
                now = BALANCE.publish(self.balance_row, self.pid, self.nr_conns)
                others_seen = BALANCE.held_back_since(self.balance_row, self.nr_conns, now)
                self.fair_share = others_seen is None or self._other_stalled(others_seen, now)
                if not self.fair_share:
                    super().set_accept_enabled(False)
                    timeout = min(timeout, GATED_POLL)
                elif not self._accepting and self.nr_conns < self.worker_connections:
                    super().set_accept_enabled(True)
        super().wait_for_and_dispatch_events(timeout)

    def _other_stalled(self, others_seen: float, now: float) -> bool:
        """This worker holds back for others with fewer connections; take ONE waiting
        connection anyway when it has waited on the listening socket for STALL_SECONDS
        and none of those workers has run its loop since it arrived (its main thread is
        stalled: a request holding the GIL, gunicorn closing a connection gracefully).
        A worker that is merely slower than a burst keeps writing its row, so the burst
        still goes to it. Looked at only while held back (a poll of the listener)."""
        if not _listeners_readable(self.sockets):
            self._backlog_since = None
            return False
        if self._backlog_since is None:
            self._backlog_since = now
            return False
        if now - self._backlog_since < STALL_SECONDS or others_seen >= self._backlog_since:
            return False
        self._backlog_since = None  # one connection per stall seen; the next waits again
        return True

    def handle(self, conn):
        result = super().handle(conn)
        while result is True and self._may_linger(conn):
            if not _buffered(conn) and not _readable_within([conn.sock], self.linger):
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


def _listeners_readable(sockets) -> bool:
    """A connection is waiting to be accepted on one of the listening sockets."""
    return _readable_within(sockets, 0)


def _readable_within(sockets, seconds: float) -> bool:
    """One of ``sockets`` has bytes to read, a connection to accept, or was closed by the
    peer, within ``seconds``."""
    try:
        poller = select.poll()
        for sock in sockets:
            poller.register(sock, select.POLLIN)
        return bool(poller.poll(seconds * 1000))
    except (OSError, ValueError):
        return False

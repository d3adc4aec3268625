"""deploy/gunicorn_worker.py: the gthread worker whose thread keeps a keep-alive connection
for its next request. A real gunicorn serves a tiny WSGI app; the worker's count of requests
served without the hand-over to the poller is written at exit (``worker_exit`` hook)."""
from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from tests.support.apps import ROOT, VENV_BIN
from tests.support.procs import Proc, free_port

sys.path.insert(0, str(ROOT))
from deploy import gunicorn_worker  # noqa: E402

APP = textwrap.dedent("""\
    import itertools
    import os
    import random
    import threading
    import time

    BIG = list(range(2_000_000))
    random.Random(1).shuffle(BIG)
    SEQ = itertools.count()  # the order in which the worker took up the requests

    def app(environ, start_response):
        seq = next(SEQ)
        if environ["PATH_INFO"] == "/slow":
            time.sleep(1)
        if environ["PATH_INFO"] == "/gil":
            sorted(BIG * 3)  # one C call: holds the GIL throughout (~1.5 s), no thread switches
        if environ["PATH_INFO"] == "/pid":
            out = str(os.getpid()).encode()
            start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(out)))])
            return [out]
        size = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(size) if size else b""
        out = b"%s %s %d %d" % (environ["PATH_INFO"].encode(), body, threading.get_ident(), seq)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(out)))])
        return [out]
""")


def _serve(tmp_path, linger_ms: str, threads: int = 4, workers: int = 1, balance: str = "1",
           args: list[str] | None = None, exit_sleep: float = 0, hooks: str = ""):
    (tmp_path / "lingerapp.py").write_text(APP)
    counts = tmp_path / "served_in_place"
    conf = tmp_path / "conf.py"
    conf.write_text(textwrap.dedent(f"""\
        worker_class = "deploy.gunicorn_worker.KeepAliveThreadWorker"
        workers = {workers}
        threads = {threads}
        keepalive = 30
        graceful_timeout = 5

        def worker_exit(server, worker):
            with open({str(counts)!r}, "a") as f:
                f.write(f"{{worker.served_in_place}}\\n")
            import time
            time.sleep({exit_sleep})
        """) + textwrap.dedent(hooks))
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{tmp_path}",
           "GUNICORN_KEEPALIVE_LINGER_MS": linger_ms, "GUNICORN_BALANCE": balance}
    proc = Proc([VENV_BIN / "gunicorn", "-c", str(conf), "-b", f"127.0.0.1:{port}", *(args or []),
                 "lingerapp:app"],
                name="gunicorn", env=env, cwd=ROOT, log=tmp_path / "gunicorn.log", grace=10)
    return proc, port, counts


def _served_in_place(counts) -> int:
    return sum(int(line) for line in counts.read_text().split())


def _held_back_hook(tmp_path) -> str:
    """A gunicorn hook: before each /pid request the worker serving it notes (1 or 0)
    whether a live worker with fewer connections holds it back right now; ``_held_back``
    reads the notes in order."""
    return f"""
        def pre_request(worker, req):
            import time
            from deploy.gunicorn_worker import BALANCE
            if req.path == "/pid":
                since = BALANCE.held_back_since(worker.balance_row, worker.nr_conns, time.monotonic())
                with open({str(tmp_path / "held_back")!r}, "a") as f:
                    f.write(f"{{int(since is not None)}}\\n")
        """


def _held_back(tmp_path) -> list[int]:
    return [int(x) for x in (tmp_path / "held_back").read_text().split()]


def _in_turn(port: int, requests: list[tuple[str, str, bytes | None]], pause: float = 0.0):
    """(status, body) of each (method, path, body), sent one after another on ONE
    keep-alive connection, ``pause`` seconds after each answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    answers = []
    for method, path, body in requests:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        answers.append((resp.status, resp.read()))
        time.sleep(pause)
    conn.close()
    return answers


def test_sequential_requests_on_one_connection_stay_on_their_thread(tmp_path):
    proc, port, counts = _serve(tmp_path, "50")
    with proc:
        proc.wait_port(port, timeout=30)
        answers = _in_turn(port, [("POST", f"/n{i}", b"x" * i) for i in range(30)])
    assert [status for status, _ in answers] == [200] * 30
    assert [body.split()[0] for _, body in answers] == [f"/n{i}".encode() for i in range(30)]
    assert [body.split(b" ")[1] for _, body in answers] == [b"x" * i for i in range(30)]
    # each request after the first came within the linger: served by the thread itself
    assert _served_in_place(counts) >= 25


def test_an_idle_connection_goes_back_to_the_poller_and_is_still_served(tmp_path):
    proc, port, counts = _serve(tmp_path, "20")
    with proc:
        proc.wait_port(port, timeout=30)
        # a pause longer than the linger: the poller holds the connection meanwhile
        answers = _in_turn(port, [("GET", f"/idle{i}", None) for i in range(3)], pause=0.3)
    for i, (status, body) in enumerate(answers):
        assert (status, body.split()[0]) == (200, f"/idle{i}".encode())
    assert _served_in_place(counts) == 0


def test_pipelined_requests_are_all_answered_in_order(tmp_path):
    proc, port, counts = _serve(tmp_path, "50")
    with proc:
        proc.wait_port(port, timeout=30)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"".join(b"GET /p%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(5)))
            data = b""
            deadline = time.monotonic() + 10
            while b"/p4 " not in data and time.monotonic() < deadline:  # the last body
                data += sock.recv(65536)
    assert data.count(b"HTTP/1.1 200") == 5
    positions = [data.index(b"/p%d " % i) for i in range(5)]
    assert positions == sorted(positions)


def test_a_connection_queued_during_the_linger_is_served_before_the_lingering_one(tmp_path):
    """One thread, lingering on A's connection, when B connects and sends; then A sends a
    slow request. B goes first: it waits at most the linger, never A's second request."""
    proc, port, counts = _serve(tmp_path, "300", threads=1)
    with proc:
        proc.wait_port(port, timeout=30)
        a = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        a.request("GET", "/first")
        assert a.getresponse().read().startswith(b"/first")
        b = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        b.request("GET", "/b")  # queued: the only thread is lingering on A
        time.sleep(0.1)
        a.request("GET", "/slow")  # wakes the lingering thread; B is already waiting
        b_body = b.getresponse().read()
        slow_body = a.getresponse().read()
        a.close()
        b.close()
    assert b_body.startswith(b"/b") and slow_body.startswith(b"/slow")
    # taken up in that order: B waited only for the linger, never behind A's /slow
    assert int(b_body.split()[-1]) < int(slow_body.split()[-1])


def test_linger_zero_is_stock_gthread(tmp_path):
    proc, port, counts = _serve(tmp_path, "0")
    with proc:
        proc.wait_port(port, timeout=30)
        answers = _in_turn(port, [("GET", f"/z{i}", None) for i in range(10)])
    for i, (_, body) in enumerate(answers):
        assert body.startswith(f"/z{i}".encode())
    assert _served_in_place(counts) == 0


def _worker(linger=0.002, alive=True, queued=0, http2=False):
    worker = object.__new__(gunicorn_worker.KeepAliveThreadWorker)
    work = SimpleNamespace(empty=lambda: queued == 0)
    worker.linger, worker.alive, worker.tpool = linger, alive, SimpleNamespace(_work_queue=work)
    return worker, SimpleNamespace(is_http2=http2)


@pytest.mark.parametrize("kwargs, expected", [
    ({}, True),
    ({"queued": 1}, False),  # another connection waits for a thread: hand this one back
    ({"alive": False}, False),  # stopping (or max_requests reached)
    ({"http2": True}, False),
    ({"linger": 0}, False),
])
def test_the_thread_lingers_only_when_nothing_else_waits(kwargs, expected):
    worker, conn = _worker(**kwargs)
    assert worker._may_linger(conn) is expected


@pytest.mark.parametrize("raw, seconds", [("2", 0.002), ("0", 0.0), ("0.5", 0.0005), ("1000", 1.0)])
def test_linger_setting(monkeypatch, raw, seconds):
    monkeypatch.setenv("GUNICORN_KEEPALIVE_LINGER_MS", raw)
    assert gunicorn_worker._linger_seconds() == pytest.approx(seconds)


@pytest.mark.parametrize("raw", ["two", "-1", "1001", "nan"])
def test_a_bad_linger_setting_stops_the_worker_with_a_clear_message(monkeypatch, raw):
    monkeypatch.setenv("GUNICORN_KEEPALIVE_LINGER_MS", raw)
    with pytest.raises(SystemExit, match="GUNICORN_KEEPALIVE_LINGER_MS"):
        gunicorn_worker._linger_seconds()


# --- connections spread over the workers -------------------------------------------------

def _burst_of_kept_connections(port: int, n: int) -> list[int]:
    """``n`` keep-alive connections opened at once (as wrk or nginx's upstream pool opens
    them), each asking which worker answers it; all stay open until every one has its
    answer. Returns the worker pid of each connection."""
    pids: list[int] = []
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(n)]
    ready = threading.Barrier(n)
    lock = threading.Lock()

    def one(conn):
        ready.wait()
        conn.request("GET", "/pid")
        pid = int(conn.getresponse().read())
        with lock:
            pids.append(pid)

    threads = [threading.Thread(target=one, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    for c in conns:
        c.close()
    return pids


def _both_workers_up(tmp_path, port: int) -> None:
    """Until a worker runs its loop (after loading the app) it has no row and the other
    accepts alone (right): wait until two connections held at once reach two workers."""
    deadline = time.monotonic() + 30
    while True:
        pair = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(2)]
        pids = set()
        for c in pair:
            c.request("GET", "/pid")
            pids.add(int(c.getresponse().read()))
        for c in pair:
            c.close()
        if len(pids) == 2:
            break
        assert time.monotonic() < deadline, "the two workers did not both start"
        time.sleep(0.2)
    time.sleep(0.2)  # the closed connections leave both workers' counts


def _warm_one_worker(port: int) -> None:
    """Requests one after another on one connection: the worker serving it is running
    when the burst comes, the state in which it used to take every new connection."""
    _in_turn(port, [("GET", "/pid", None)] * 200)


def test_a_burst_of_connections_is_spread_evenly_over_the_workers(tmp_path):
    proc, port, _ = _serve(tmp_path, "2", threads=8, workers=2)
    with proc:
        proc.wait_port(port, timeout=30)
        _both_workers_up(tmp_path, port)
        spreads = []
        for _ in range(3):
            _warm_one_worker(port)
            spreads.append(sorted(Counter(_burst_of_kept_connections(port, 12)).values()))
            time.sleep(0.2)  # the closed connections leave both workers' counts
    # stock gthread: whichever worker runs first accepts (seen: 12/0, 9/3); spread: 6/6
    assert spreads == [[6, 6]] * 3


def test_balance_off_is_stock_accepting(tmp_path):
    proc, port, _ = _serve(tmp_path, "2", threads=8, workers=2, balance="0")
    with proc:
        proc.wait_port(port, timeout=30)
        pids = _burst_of_kept_connections(port, 12)
    assert len(pids) == 12  # every connection served; how they spread is the kernel's race


def _table(*rows):
    table = gunicorn_worker._Balance(rows=8)
    for i, (pid, conns, age) in enumerate(rows):
        table._write(i, pid, conns, time.monotonic() - age)
    table.HEAD.pack_into(table.mem, 0, len(rows))
    return table


LIVE = os.getpid()  # a process that exists: stands for another live worker


def _gone_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


@pytest.mark.parametrize("rows, me, conns, expected", [
    ([(0, 0, 0), (LIVE, 3, 0)], 0, 3, True),  # as many as the other: accept
    ([(0, 0, 0), (LIVE, 3, 0)], 0, 4, False),  # one more than the other: leave it to the other
    ([(0, 0, 0), (LIVE, 3, 0), (LIVE, 9, 0)], 0, 3, True),  # the least loaded of three
    ([(0, 0, 0), (LIVE, 0, 5.0)], 0, 4, True),  # the other has not written for 5 s: ignored
    ([(0, 0, 0), (-1, 0, 0)], 0, 4, True),  # reserved, not started yet: ignored
    ([(0, 0, 0), (0, 0, 0)], 0, 4, True),  # empty row (a worker that stopped)
    ([(0, 0, 0), ("gone", 0, 0)], 0, 4, True),  # killed a moment ago, row still fresh: ignored
])
def test_a_worker_accepts_only_while_no_live_worker_holds_fewer_connections(rows, me, conns, expected):
    rows = [(_gone_pid() if pid == "gone" else pid, n, age) for pid, n, age in rows]
    table = _table(*rows)
    assert table.may_accept(me, conns, time.monotonic()) is expected


def test_rows_are_reserved_in_the_master_and_freed_when_their_worker_is_gone():
    gone = _gone_pid()
    old = time.monotonic() - gunicorn_worker.RESERVATION_SECONDS - 1
    table = _table((os.getpid(), 2, 0), (gone, 5, 0), (-1, 0, 0), (-1, 0, 0))
    table._write(2, -1, 0, old)
    # row 0: a live process; row 1: its process is gone; row 2: a reservation never claimed
    assert table.reserve() == 1
    assert table.reserve() == 2
    assert table.reserve() == 4  # row 3 is a fresh reservation: still waiting for its fork
    assert table._used() == 5
    table.claim(4, 4242)
    assert table._read(4)[:2] == (4242, 0)
    table.leave(4, 4242)
    assert table.reserve() == 4


def test_a_row_is_never_shared_by_two_workers():
    """Worker A stops gracefully while B is killed and replaced: A's row must not go to B's
    replacement while A drains, and A's exit must not empty a row that is no longer A's
    (the review of bc12530: both live workers ended on row 0 and saw nothing of each other)."""
    table = gunicorn_worker._Balance(rows=8)
    a, b = table.reserve(), table.reserve()
    a_pid, b_pid = os.getpid(), os.getppid()  # two processes that exist
    table.claim(a, a_pid)
    table.claim(b, b_pid)
    table.stop(a, a_pid)  # A draining: not live for the others, still its row
    assert table.may_accept(b, 5, time.monotonic())  # nobody defers to a stopping worker
    table.leave(b, b_pid)  # the master reaped B
    b2 = table.reserve()  # B's replacement
    assert b2 == b
    table.claim(b2, 777)
    table.leave(a, a_pid)  # the master reaped A
    table.leave(b2, b_pid)  # a late release for the old B: not its row any more
    assert table._read(b2)[0] == 777
    a2 = table.reserve()
    assert a2 == a and a2 != b2


@pytest.mark.parametrize("raw", ["2", "on", ""])
def test_a_bad_balance_setting_stops_the_worker_with_a_clear_message(monkeypatch, raw):
    monkeypatch.setenv("GUNICORN_BALANCE", raw)
    with pytest.raises(SystemExit, match="GUNICORN_BALANCE"):
        gunicorn_worker._balance_enabled()


def test_with_reuse_port_every_connection_is_answered(tmp_path):
    """reuse_port gives each worker its own listening socket: a worker holding back would
    leave the connections the kernel queued on its socket unanswered (review of bc12530:
    14 of 20 within 5 s), so the spread is off there."""
    proc, port, _ = _serve(tmp_path, "2", threads=4, workers=2, args=["--reuse-port"],
                           hooks=_held_back_hook(tmp_path))
    with proc:
        proc.wait_port(port, timeout=30)
        _both_workers_up(tmp_path, port)
        held = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        held.request("GET", "/pid")
        holder = int(held.getresponse().read())  # an idle keep-alive connection on one worker
        answered_by = set()
        for _ in range(20):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/pid")
            answered_by.add(int(c.getresponse().read()))
            c.close()
        held.close()
    # the worker holding a connection still took what the kernel queued on its socket
    # (20 all on the other: a 2^-20 chance), and no worker ever held back for the other
    assert holder in answered_by and len(answered_by) == 2
    assert _held_back(tmp_path)[-20:] == [0] * 20


def test_a_worker_holding_back_takes_a_connection_the_other_does_not(tmp_path):
    """The least loaded worker's main thread cannot run (a request holds the GIL for ~1.5 s):
    the worker that holds more connections takes the new one after STALL_SECONDS instead
    of leaving it in the backlog until LIVE_SECONDS (review of bc12530: 1.4 s)."""
    proc, port, _ = _serve(tmp_path, "2", threads=4, workers=2, hooks=_held_back_hook(tmp_path))
    with proc:
        proc.wait_port(port, timeout=30)
        _both_workers_up(tmp_path, port)
        kept = []
        for _ in range(3):  # spread 2/1 (or 1/2)
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("GET", "/pid")
            kept.append((int(c.getresponse().read()), c))
            time.sleep(0.05)
        counts = Counter(pid for pid, _ in kept)
        assert sorted(counts.values()) == [1, 2]
        least = min(counts, key=counts.get)
        busy = next(c for pid, c in kept if pid == least)
        stall = threading.Thread(target=lambda: (busy.request("GET", "/gil"), busy.getresponse().read()))
        stall.start()
        time.sleep(0.2)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", "/pid")
        answered_by = int(c.getresponse().read())
        gil_still_held = stall.is_alive()
        c.close()
        stall.join(30)
        for _, k in kept:
            k.close()
    # taken by the busier worker while the least loaded one was stalled and still counted
    # live (the stall rule), not once its row went stale (LIVE_SECONDS) or it came back
    assert answered_by != least and gil_still_held
    assert _held_back(tmp_path)[-1] == 1


def _held_back_worker(listener):
    worker = object.__new__(gunicorn_worker.KeepAliveThreadWorker)
    worker.sockets, worker._backlog_since = [listener], None
    return worker


def test_a_worker_that_keeps_running_its_loop_is_not_overtaken():
    """The stall rule takes a connection only from a worker that has not run its loop since
    the connection arrived, and one per stall seen (review of 2118720: a worker merely slower
    than a burst was overtaken on every turn, and bursts of 64 split 62/2)."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())  # waits: nobody accepts it
    try:
        worker = _held_back_worker(listener)
        t0 = time.monotonic()
        assert worker._other_stalled(t0 - 1, t0) is False  # the wait starts now
        later = t0 + gunicorn_worker.STALL_SECONDS + 1e-6  # (t0 + s) - t0 may round below s
        # the least loaded worker wrote its row after the connection arrived: it is running
        assert worker._other_stalled(t0 + 0.001, later) is False
        # it has not run since: take this one connection, and only this one
        assert worker._other_stalled(t0 - 1, later) is True
        assert worker._other_stalled(t0 - 1, later + 0.001) is False
    finally:
        client.close()
        listener.close()


def test_nothing_waiting_means_no_stall():
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        worker = _held_back_worker(listener)
        now = time.monotonic()
        assert worker._other_stalled(now - 10, now) is False
        assert worker._other_stalled(now - 10, now + 1) is False
        assert worker._backlog_since is None
    finally:
        listener.close()


def test_a_worker_stopping_with_no_connection_is_not_waited_for(tmp_path):
    """The oldest worker holds no connection when TTOU stops it and takes its time to exit
    (a ``worker_exit`` hook sleeping 2 s): it must leave the spread at once, or every new
    connection waits for the stall rule (review of 2118720: 21-33 ms each for ~2 s)."""
    proc, port, _ = _serve(tmp_path, "2", threads=4, workers=2, exit_sleep=2,
                           hooks=_held_back_hook(tmp_path))
    with proc:
        proc.wait_port(port, timeout=30)
        _both_workers_up(tmp_path, port)
        kids = sorted(int(p) for p in subprocess.run(["pgrep", "-P", str(proc.popen.pid)], capture_output=True,
                                                     text=True).stdout.split())
        held = None
        for _ in range(50):  # one kept connection on the younger worker
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/pid")
            if int(c.getresponse().read()) == kids[1]:
                held = c
                break
            c.close()
            time.sleep(0.05)
        assert held is not None
        time.sleep(0.3)
        os.kill(proc.popen.pid, signal.SIGTTOU)  # stops the oldest worker
        time.sleep(0.1)
        for _ in range(15):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/pid")
            assert int(c.getresponse().read()) == kids[1]
            c.close()
        held.close()
    # the stopping worker (no connection, still exiting) left the spread at once: the
    # younger one, holding more, was never held back for it (each new connection would
    # otherwise have waited for the stall rule)
    assert _held_back(tmp_path)[-15:] == [0] * 15

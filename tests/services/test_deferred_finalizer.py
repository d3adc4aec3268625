"""Answer first, write after (``money.charging.DeferredFinalizer``, CALL_FINALIZE_DEFERRED):
the caller is not kept waiting for the finalize, one thread writes everything queued with
one statement, a database outage is outlasted, a row the function refuses does not take
its group down, a stop writes the queue first, a forked child never writes its parent's
queue, and which calls are deferred at all. On PostgreSQL: a real call through the route
is answered before its row is written and ends ``succeeded`` with its key's stored
response, exactly as in durable mode."""
from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, OperationalError

from app import metrics
from app.extensions import db
from app.models import IdempotencyRecord, ModuleCall
from app.models.base import utcnow
from app.services.money import charging
from tests.support import finalize as finalize_helpers
from tests.gateway_helpers import balance_cents, call, mod, provider, provider_server  # noqa: F401


class _Recorder:
    """Stands in for ``_write_group``: records the groups, can hold the first statement
    (``gate``) and fail chosen attempts."""

    def __init__(self, fail=None, late=()):
        self.groups: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.fail = fail or (lambda attempt, rows: None)
        self.late = set(late)

    def __call__(self, rows):
        self.groups.append([r["id"] for r in rows])
        self.started.set()
        self.gate.wait(5)
        exc = self.fail(len(self.groups), rows)
        if exc is not None:
            raise exc
        return {r["id"] for r in rows if r["id"] not in self.late}


def _db_error(kind=OperationalError, invalidated=False):
    return kind("SELECT gw_finalize_calls(...)", {}, Exception("boom"),
                connection_invalidated=invalidated)


@pytest.fixture
def writer(app, monkeypatch):
    monkeypatch.setattr(charging, "_RETRY_WAITS", (0.001, 0.002))
    w = charging.DeferredFinalizer(app)
    yield w
    w.close(2)


def test_submit_does_not_wait_and_calls_queued_meanwhile_share_one_statement(writer, monkeypatch):
    rec = _Recorder()
    rec.gate.clear()  # the first statement "takes" until the gate opens
    monkeypatch.setattr(charging, "_write_group", rec)
    writer.submit({"id": "c0"})
    assert rec.started.wait(2)
    for i in range(1, 6):
        writer.submit({"id": f"c{i}"})  # returns at once although a statement is in flight
    assert writer.pending() == 6
    rec.gate.set()
    assert writer.drain(5) and writer.pending() == 0
    assert rec.groups == [["c0"], ["c1", "c2", "c3", "c4", "c5"]]


def test_a_database_outage_is_retried_until_the_group_is_written(writer, monkeypatch, caplog):
    rec = _Recorder(fail=lambda attempt, rows: _db_error() if attempt <= 3 else None)
    monkeypatch.setattr(charging, "_write_group", rec)
    with caplog.at_level(logging.WARNING, logger=charging.__name__):
        writer.submit({"id": "a"})
        writer.submit({"id": "b"})
        assert writer.drain(5)
    assert rec.groups[-1] in (["a", "b"], ["b"]) and len(rec.groups) >= 4
    assert sum("database unavailable" in r.message for r in caplog.records) == 3
    assert _count("retried") >= 3


def test_a_lost_connection_is_retried_too(writer, monkeypatch):
    rec = _Recorder(fail=lambda attempt, rows: _db_error(DBAPIError, invalidated=True) if attempt == 1 else None)
    monkeypatch.setattr(charging, "_write_group", rec)
    writer.submit({"id": "a"})
    assert writer.drain(5)
    assert rec.groups == [["a"], ["a"]]


def test_a_refused_row_is_isolated_and_the_rest_of_its_group_written(writer, monkeypatch, caplog):
    def fail(attempt, rows):
        if any(r["id"] == "bad" for r in rows):
            return _db_error(DBAPIError)  # not a connection problem: the function refuses
        return None

    rec = _Recorder(fail=fail)
    rec.gate.clear()
    monkeypatch.setattr(charging, "_write_group", rec)
    writer.submit({"id": "first"})
    assert rec.started.wait(2)
    for cid in ("x", "bad", "y"):
        writer.submit({"id": cid})
    with caplog.at_level(logging.ERROR, logger=charging.__name__):
        rec.gate.set()
        assert writer.drain(5)
    assert rec.groups == [["first"], ["x", "bad", "y"], ["x"], ["bad"], ["y"]]
    assert any("call bad refused" in r.message for r in caplog.records)
    writer.submit({"id": "after"})  # the thread lives on
    assert writer.drain(5) and rec.groups[-1] == ["after"]


class _Clock:
    """``charging.time`` for the window tests: ``monotonic()`` stands still until the test
    moves it, so what the writer does at each point of its window is certain, not a race
    with the machine's load (``sleep`` stays the real one)."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(seconds)


class _TimedWaits(threading.Condition):
    """The writer's condition on the test's clock: each wait of the writer thread for the
    rest of its window is recorded (``waits``) and lasts at most 5 ms of real time, so the
    writer soon looks at the clock again; another thread's timed wait (a drain) that times
    out moves the clock by its timeout, so a drain still ends."""

    def __init__(self, clock: _Clock):
        super().__init__()
        self.clock = clock
        self.waits: list[float] = []

    def wait(self, timeout=None):
        if timeout is None:
            return super().wait()
        if threading.current_thread().name == "finalize-writer":
            self.waits.append(timeout)
            return super().wait(min(timeout, 0.005))
        woken = super().wait(timeout)
        if not woken:
            self.clock.now += timeout
        return woken


def _until(predicate, seconds: float = 5.0) -> bool:
    """Poll ``predicate`` (another thread's progress) until true; False if it never is."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


@pytest.fixture
def clocked(app, monkeypatch):
    """``make(ms)``: a writer with window ``CALL_FINALIZE_BATCH_MS=ms`` on a clock the
    test moves; returns (writer, clock, recorder of the statements written)."""
    clock = _Clock()
    monkeypatch.setattr(charging, "time", clock)
    made = []

    def make(ms):
        rec = _Recorder()
        monkeypatch.setattr(charging, "_write_group", rec)
        monkeypatch.setitem(app.config, "CALL_FINALIZE_BATCH_MS", ms)
        made.append(charging.DeferredFinalizer(app))
        made[-1]._cond = _TimedWaits(clock)
        return made[-1], clock, rec

    yield make
    for w in made:
        w.close(2)


def test_calls_queued_within_the_window_share_one_statement(clocked):
    writer, clock, rec = clocked(250)
    writer.submit({"id": "a"})
    assert _until(lambda: writer._cond.waits)  # the writer is awake, waiting out a's window
    writer.submit({"id": "b"})
    writer.submit({"id": "c"})
    clock.now += 0.25
    assert rec.started.wait(2) and writer.drain(2)
    assert rec.groups == [["a", "b", "c"]]


def test_the_first_row_waits_the_window_and_no_longer(clocked):
    writer, clock, rec = clocked(250)
    writer.submit({"id": "a"})
    assert _until(lambda: writer._cond.waits)
    assert writer._cond.waits[0] == 0.25  # from its first row: the whole window
    clock.now += 0.125
    assert _until(lambda: 0.125 in writer._cond.waits)  # saw the time move: waits the rest
    assert not rec.started.is_set()  # nothing written before the window ends ...
    clock.now += 0.125
    assert rec.started.wait(2)  # ... and written when it ends, with nothing else waking it
    assert rec.groups == [["a"]]
    rec.started.clear()
    writer._cond.waits.clear()
    clock.now += 5
    writer.submit({"id": "b"})  # a new group: its own window, from its own first row
    assert _until(lambda: writer._cond.waits)
    assert writer._cond.waits[0] == 0.25 and not rec.started.is_set()
    clock.now += 0.25
    assert rec.started.wait(2)
    assert rec.groups == [["a"], ["b"]]


def test_a_drain_or_a_full_group_does_not_wait_out_the_window(clocked, monkeypatch):
    writer, clock, rec = clocked(1000)
    start = clock.now
    writer.submit({"id": "a"})
    assert _until(lambda: writer._cond.waits)  # waiting out its window
    assert writer.drain(5)  # a stopping process writes its queue at once
    assert rec.groups == [["a"]]
    monkeypatch.setattr(charging, "BATCH_MAX_ROWS", 3)
    for cid in ("x", "y", "z"):
        writer.submit({"id": cid})
    assert _until(lambda: len(rec.groups) == 2)  # a full group goes at once
    assert rec.groups == [["a"], ["x", "y", "z"]]
    assert clock.now == start  # written while the clock stood still: no window waited out


def test_a_backlog_is_written_in_statements_of_at_most_batch_max_rows(writer, monkeypatch):
    rec = _Recorder()
    rec.gate.clear()  # the first statement "takes" while eight more rows queue
    monkeypatch.setattr(charging, "_write_group", rec)
    monkeypatch.setattr(charging, "BATCH_MAX_ROWS", 3)
    writer.submit({"id": "r0"})
    assert rec.started.wait(2)
    for i in range(1, 9):
        writer.submit({"id": f"r{i}"})
    rec.gate.set()
    assert writer.drain(5)
    assert rec.groups == [["r0"], ["r1", "r2", "r3"], ["r4", "r5", "r6"], ["r7", "r8"]]


@pytest.mark.parametrize("value", ["-1", "1001"])
def test_the_window_setting_is_bounded(monkeypatch, value):
    from config import ConfigError, load_config
    monkeypatch.setenv("CALL_FINALIZE_BATCH_MS", value)
    with pytest.raises(ConfigError, match="CALL_FINALIZE_BATCH_MS"):
        load_config({"APP_ENV": "test"})


def _count(outcome: str) -> float:
    return metrics.FINALIZE_WRITER.labels(outcome=outcome)._value.get()


def test_a_call_the_sweep_refunded_first_is_logged_and_counted_as_late(writer, monkeypatch, caplog):
    monkeypatch.setattr(charging, "_write_group", _Recorder(late={"gone"}))
    late, written = _count("late"), _count("written")
    with caplog.at_level(logging.WARNING, logger=charging.__name__):
        writer.submit({"id": "gone"})
        writer.submit({"id": "kept"})
        assert writer.drain(5)
    assert any("call_finalize_late: call gone" in r.message for r in caplog.records)
    assert (_count("late") - late, _count("written") - written) == (1, 1)


def test_close_writes_the_queue_before_the_thread_stops(writer, monkeypatch):
    rec = _Recorder()
    rec.gate.clear()
    monkeypatch.setattr(charging, "_write_group", rec)
    for i in range(3):
        writer.submit({"id": f"q{i}"})
    threading.Timer(0.1, rec.gate.set).start()
    assert writer.close(5) is True
    assert sorted(c for g in rec.groups for c in g) == ["q0", "q1", "q2"]
    writer._thread.join(2)
    assert not writer._thread.is_alive()


def test_close_gives_up_after_its_timeout_and_says_so(writer, monkeypatch, caplog):
    rec = _Recorder()
    rec.gate.clear()
    monkeypatch.setattr(charging, "_write_group", rec)
    writer.submit({"id": "stuck"})
    with caplog.at_level(logging.ERROR, logger=charging.__name__):
        assert writer.close(0.1) is False
    assert any("1 calls unwritten" in r.message for r in caplog.records)
    rec.gate.set()


def test_a_forked_child_starts_its_own_writer_without_the_parents_queue(writer, monkeypatch):
    rec = _Recorder()
    rec.gate.clear()
    monkeypatch.setattr(charging, "_write_group", rec)
    writer.submit({"id": "parent"})
    assert rec.started.wait(2)
    writer.submit({"id": "parent-queued"})
    parent_thread = writer._thread
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as seen from a forked child
    writer.submit({"id": "child"})
    assert writer._thread is not parent_thread and writer._queue in ([{"id": "child"}], [])
    rec.gate.set()
    assert writer.drain(5)
    written = [c for g in rec.groups for c in g]
    assert written.count("child") == 1 and "parent-queued" not in written


@pytest.mark.parametrize("deferred, seconds_left, expect", [
    (True, 3600, "deferred"), (True, 31, "deferred"),
    (True, 29, "durable"),  # less than half the sweep margin (60 s) left: written first
    (False, 3600, "durable"),
])
def test_which_calls_are_answered_before_their_write(app, monkeypatch, deferred, seconds_left, expect):
    seen = []
    monkeypatch.setattr(charging.DeferredFinalizer, "submit", lambda self, row: seen.append("deferred"))
    monkeypatch.setattr(charging.GroupFinalizer, "finalize", lambda self, item: seen.append("durable") or True)
    now = utcnow()
    cid = charging.OpenedCall("call_x", now, now + timedelta(seconds=seconds_left))
    monkeypatch.setitem(app.config, "CALL_FINALIZE_DEFERRED", deferred)
    with app.app_context():
        assert charging.finalize_pg(call_id=cid, account_id="acct", idem_key=None, ok=True,
                                    provider_status=200, receipt={}, finished_at=now,
                                    response_body="{}") is True
    assert seen == [expect]


# --- through the route ----------------------------------------------------------------

@pytest.fixture
def slow_finalize(app):
    """``gw_finalize_calls`` takes 0.3 s more for the test."""
    with finalize_helpers.slow_finalize(app, 0.3):
        yield


def test_a_call_is_answered_before_its_row_is_written_and_ends_exactly_as_in_durable_mode(
        app, make_account, mod, slow_finalize, ledger_clean, monkeypatch):
    acct = make_account(cents=100)
    monkeypatch.setitem(app.config, "CALL_FINALIZE_DEFERRED", True)  # this mode, whatever the env says
    with app.test_client() as c:
        r = call(c, acct, {"action": "ok", "n": 1}, key="deferred-1")
        assert r.status_code == 200, r.get_json()
        body = r.get_json()
        with app.app_context():  # answered; the writer's statement is still in PostgreSQL
            row = db.session.execute(select(ModuleCall.status, ModuleCall.receipt)
                                     .where(ModuleCall.id == body["call_id"])).one()
            assert row.status == "pending" and row.receipt is None
            db.session.remove()
        # the key's response is not stored yet: the replay waits for it (it answered 409
        # before, issue 36 item 7) and returns the cached answer
        again = call(c, acct, {"action": "ok", "n": 1}, key="deferred-1")
        assert again.status_code == 200 and again.get_data() == r.get_data()
        assert again.headers.get("Idempotent-Replayed") == "true"
        assert charging.drain_finalizer(app, 10)
        replay = call(c, acct, {"action": "ok", "n": 1}, key="deferred-1")
    assert replay.status_code == 200 and replay.get_data() == r.get_data()
    with app.app_context():
        row = db.session.execute(select(ModuleCall.status, ModuleCall.receipt, ModuleCall.ok)
                                 .where(ModuleCall.id == body["call_id"])).one()
        assert row.status == "succeeded" and row.ok is True and row.receipt == body["receipt"]
        rec = db.session.execute(select(IdempotencyRecord.status, IdempotencyRecord.response_body)
                                 .where(IdempotencyRecord.account_id == acct.id)).one()
        assert rec.status == "done" and rec.response_body.encode() == r.get_data()
        db.session.remove()
    assert balance_cents(app, acct.id) == 100 - 3
    ledger_clean()

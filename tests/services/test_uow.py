"""The unit of work (app/services/platform/uow.py): commit on success, rollback on error,
no nesting, after-commit hooks only after a commit; and a guard that nothing else in the
application commits or rolls back."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from tests.support.sqlevents import listening
from app.extensions import db
from app.ids import new_id
from app.models import ContactMessage, OutboxMessage
from app.services.platform import outbox
from app.services.platform.uow import (after_commit, in_unit_of_work, one_statement,
                                      transactional, unit_of_work)

ROOT = Path(__file__).resolve().parents[2]


def _row() -> ContactMessage:
    return ContactMessage(id=new_id("contact"), email="a@example.com", message="hi")


def _committed_count() -> int:
    """Rows visible to another connection (i.e. committed)."""
    with db.engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM contact_messages")).scalar_one()


def test_commits_on_normal_exit(app):
    with app.app_context():
        with unit_of_work():
            assert in_unit_of_work()
            db.session.add(_row())
        assert not in_unit_of_work()
        assert _committed_count() == 1


def test_rolls_back_and_reraises_on_error(app):
    with app.app_context():
        with pytest.raises(ValueError, match="boom"):
            with unit_of_work():
                db.session.add(_row())
                db.session.flush()
                raise ValueError("boom")
        assert not in_unit_of_work()
        assert db.session.execute(select(func.count()).select_from(ContactMessage)).scalar_one() == 0
        assert _committed_count() == 0


def test_nesting_is_refused(app):
    with app.app_context():
        with pytest.raises(RuntimeError, match="do not nest"):
            with unit_of_work():
                db.session.add(_row())
                with unit_of_work():
                    pass
        assert _committed_count() == 0  # the outer unit rolled back
        with unit_of_work():  # and the state was reset: a new unit opens
            db.session.add(_row())
        assert _committed_count() == 1


def test_one_statement_commits_by_itself_and_refuses_inside_a_unit(app):
    insert = text("INSERT INTO contact_messages (id, email, message, created_at) "
                  "VALUES (:id, 'a@example.com', 'hi', now())")
    with app.app_context():
        with one_statement() as conn:  # autocommit: visible at once, nothing to commit
            conn.execute(insert, {"id": new_id("contact")})
            assert _committed_count() == 1
        with one_statement() as again:  # the same connection for the rest of the request
            assert again is conn
        with pytest.raises(RuntimeError, match="inside a unit_of_work"):
            with unit_of_work():
                with one_statement():
                    pass
    assert conn.closed  # returned to its pool at teardown


def test_transactional_decorator(app):
    @transactional
    def entry(fail: bool) -> str:
        db.session.add(_row())
        if fail:
            raise KeyError("x")
        return "done"

    with app.app_context():
        assert entry(False) == "done"
        with pytest.raises(KeyError):
            entry(True)
        assert _committed_count() == 1


def test_after_commit_runs_only_after_the_commit(app):
    seen = []

    def hook(tag, *, extra):
        seen.append((tag, extra, in_unit_of_work(), _committed_count()))

    with app.app_context():
        with unit_of_work():
            db.session.add(_row())
            after_commit(hook, "a", extra=1)
            assert seen == []
        assert seen == [("a", 1, False, 1)]  # outside the unit, the row already committed

        with pytest.raises(ValueError):
            with unit_of_work():
                after_commit(hook, "b", extra=2)
                raise ValueError("rolled back")
        assert [s[0] for s in seen] == ["a"]  # dropped on rollback


def test_after_commit_needs_a_unit_of_work(app):
    with app.app_context(), pytest.raises(RuntimeError, match="unit_of_work"):
        after_commit(print, "x")


def test_a_failing_hook_is_logged_and_the_commit_stands(app, caplog):
    ran = []

    def bad():
        raise OSError("redis down")

    with app.app_context(), caplog.at_level(logging.ERROR, logger="app.services.platform.uow"):
        with unit_of_work():
            db.session.add(_row())
            after_commit(bad)
            after_commit(ran.append, "next")
        assert _committed_count() == 1 and ran == ["next"]
        assert "after-commit hook" in caplog.text and "redis down" in caplog.text


def test_outbox_delivery_is_enqueued_after_commit_only(app, monkeypatch):
    sent = []
    monkeypatch.setattr(outbox, "dispatch", lambda *ids: sent.extend(
        (mid, db.session.get(OutboxMessage, mid) is not None) for mid in ids))
    with app.app_context():
        with unit_of_work():
            msg = outbox.add_email("to@example.com", "Hi", "Body")
            mid = msg.id
            assert sent == []
        assert sent == [(mid, True)]
        with pytest.raises(ValueError):
            with unit_of_work():
                outbox.add_email("to@example.com", "Never", "Body")
                raise ValueError("rolled back")
        assert sent == [(mid, True)]
        assert db.session.execute(select(func.count()).select_from(OutboxMessage)).scalar_one() == 1


# --- the guard: only the unit of work commits or rolls back ------------------------------

GUARDED = ["app/services", "app/blueprints", "app/tasks", "app/cli", "app/auth.py"]
# path relative to the repository -> why it may commit/roll back itself (none today)
ALLOWED: dict[str, str] = {
    "app/services/platform/uow.py": "the unit of work itself",
}
_CALL = re.compile(r"\.(commit|rollback)\(")


def test_nothing_but_the_unit_of_work_commits_or_rolls_back():
    offenders = []
    for entry in GUARDED:
        base = ROOT / entry
        files = [base] if base.is_file() else sorted(base.rglob("*.py"))
        assert files, f"{entry}: nothing to check (moved?)"
        for path in files:
            rel = path.relative_to(ROOT).as_posix()
            if rel in ALLOWED:
                continue
            for no, line in enumerate(path.read_text().splitlines(), 1):
                if _CALL.search(line.split("#", 1)[0]):
                    offenders.append(f"{rel}:{no}: {line.strip()}")
    assert offenders == [], "commit/rollback outside platform/uow.py:\n" + "\n".join(offenders)


def test_the_guard_sees_a_commit():
    """The pattern the guard relies on matches the calls it must refuse."""
    assert _CALL.search("    db.session.commit()") and _CALL.search("s.rollback()")
    assert not _CALL.search("skip_commit_flush()") and not _CALL.search("after_commit(fn)")


def test_end_reads_ends_the_sessions_reads_and_refuses_inside_a_unit_of_work(app):
    from app.services.platform.uow import end_reads

    with app.app_context():
        end_reads()  # nothing open: nothing to do
        db.session.execute(text("SELECT 1"))
        assert db.session().in_transaction()
        end_reads()
        assert not db.session().in_transaction()
        with pytest.raises(RuntimeError):
            with unit_of_work():
                end_reads()
        db.session.remove()


def test_execute_rows_on_the_cursor_keeps_errors_and_listeners(app):
    """``execute_rows`` sends plain SQL straight to a driver cursor, yet a refused
    statement still raises SQLAlchemy's ``DBAPIError`` (with the driver's SQLSTATE), a
    dead connection is reported ``connection_invalidated`` (and ``run_one`` retries it on
    a fresh one), and an engine listener still sees every statement."""
    from unittest.mock import patch

    from sqlalchemy.engine import Connection, Engine
    from sqlalchemy.exc import DBAPIError, IntegrityError

    from app.services.platform.uow import execute_rows, release_connection, run_one

    with app.app_context():
        with one_statement() as conn:
            assert execute_rows(conn, "SELECT %(a)s::int + 1, 'x'", {"a": 1}) == [(2, "x")]
            assert execute_rows(conn, "SET LOCAL synchronous_commit = off", {}) == []
            with pytest.raises(DBAPIError) as refused:
                execute_rows(conn, "DO $$ BEGIN RAISE EXCEPTION 'no' USING ERRCODE = 'GW402'; END $$", {})
            assert refused.value.orig.sqlstate == "GW402" and not refused.value.connection_invalidated
            with pytest.raises(IntegrityError):
                execute_rows(conn, "DO $$ BEGIN RAISE unique_violation; END $$", {})
            pid = execute_rows(conn, "SELECT pg_backend_pid()", {})[0][0]
        db.session.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        db.session.commit()
        with pytest.raises(DBAPIError) as dead:
            with one_statement() as conn:
                execute_rows(conn, "SELECT 1", {})
        assert dead.value.connection_invalidated
        db.session.execute(text("SELECT pg_terminate_backend(:pid)"),
                           {"pid": run_one("SELECT pg_backend_pid()", {})[0][0]})
        db.session.commit()
        assert run_one("SELECT 41 + 1", {}) == [(42,)]  # the dead one replaced, run again

        seen = []

        def listener(conn, cursor, statement, *args):  # noqa: ARG001
            seen.append(statement)

        with listening(Engine, ("before_cursor_execute", listener)):
            assert run_one("SELECT %(v)s::text", {"v": "heard"}) == [("heard",)]
        assert seen == ["SELECT %(v)s::text"]
        # the listener gone, the statement takes the cursor path again (not exec_driver_sql)
        with patch.object(Connection, "exec_driver_sql", side_effect=AssertionError("not the cursor path")):
            assert run_one("SELECT 7", {}) == [(7,)]
        release_connection()
        db.session.remove()


def test_statement_text_for_the_driver():
    """``run_one``'s SQL goes to the driver with ``$n`` placeholders only when every
    placeholder carries a cast; a repeated name keeps its number, ``%%`` is a literal
    ``%``, anything else stays on the cursor (None)."""
    from app.services.platform.uow import _statement

    st = _statement("SELECT %(a)s::int + %(b)s::int, %(a)s::int, '5%%'")
    assert st.sql == b"SELECT $1::int + $2::int, $1::int, '5%'" and st.params == ("a", "b")
    assert _statement("SELECT %(a)s::int + %(b)s::int, %(a)s::int, '5%%'") is st  # made once
    assert _statement("SELECT 1").sql == b"SELECT 1" and _statement("SELECT 1").params == ()
    assert _statement("SELECT %(a)s") is None  # no cast: psycopg's typed parameter decides
    assert _statement("SELECT %s::int") is None  # positional
    assert _statement("SELECT %(a)b::bytea") is None  # binary format


def test_run_one_uses_the_threads_own_connection_not_a_pool_checkout(app):
    """Each thread sends ``run_one``'s statements on one connection of its own (no pool
    checkout per statement; a second thread has another), with typed results, a NULL,
    parameters of every kind the hot path sends, and more named statements than a
    connection keeps (the rest run unnamed, with the same answers)."""
    import threading
    from datetime import datetime, timezone

    from app.services.platform import uow

    with app.app_context():
        engine = uow._autocommit_engine()
        before = engine.pool.checkedout()
        pid = uow.run_one("SELECT pg_backend_pid()", {})[0][0]
        when = datetime(2026, 11, 24, 12, 0, 0, 123456, tzinfo=timezone.utc)
        row = uow.run_one("SELECT %(s)s::varchar, %(i)s::bigint, %(b)s::boolean, %(n)s::varchar, "
                          "%(t)s::timestamptz, %(arr)s::bigint[], pg_backend_pid()",
                          {"s": "é'\"\\x", "i": 2**62, "b": False, "n": None, "t": when,
                           "arr": uow.pg_array([-1, 2])})
        assert row == [("é'\"\\x", 2**62, False, None, when, [-1, 2], pid)]
        assert engine.pool.checkedout() == before
        for i in range(uow._MAX_PREPARED + 3):  # past the named statements a connection keeps
            assert uow.run_one(f"SELECT %(v)s::int + {i}, pg_backend_pid()", {"v": 1}) == [(1 + i, pid)]
        assert len(uow._own_local.conn.prepared) == uow._MAX_PREPARED
        other = []

        def in_thread():
            with app.app_context():
                other.append(uow.run_one("SELECT pg_backend_pid()", {})[0][0])

        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
        assert other and other[0] != pid


def test_the_threads_own_connection_survives_a_fork(app):
    """A child process (gunicorn forks its workers from a preloaded master) makes its own
    connection and leaves the inherited one alone: closing it there would end the
    parent's session on the shared socket."""
    import os

    from app.services.platform import uow

    with app.app_context():
        pid = uow.run_one("SELECT pg_backend_pid()", {})[0][0]
        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                theirs = uow.run_one("SELECT pg_backend_pid()", {})[0][0]
                uow._own_local.conn.close()  # the child's own
                import gc
                gc.collect()  # the inherited one is garbage now: must not close the parent's
                code = 0 if theirs != pid else 2
            finally:
                os.write(w, bytes([code]))
                os._exit(0)
        os.close(w)
        assert os.read(r, 1) == b"\x00"
        os.waitpid(child, 0)
        assert uow.run_one("SELECT pg_backend_pid()", {})[0][0] == pid  # still ours, still alive


def test_a_forked_child_leaves_the_parents_pooled_connections_alone(app):
    """The autocommit pool's idle connections are the parent's: a forked child that
    takes one (to make its own thread connection) and closes it would end the parent's
    session on the shared socket, and the parent's next statement on it would fail.
    Failed before the side pools were dropped in a forked child (extensions.side_engine)."""
    import os

    from app.services.platform import uow

    with app.app_context():
        engine = uow._autocommit_engine()
        engine.dispose()
        with one_statement() as conn:  # now idle in the pool, the only one
            pooled = uow.execute_rows(conn, "SELECT pg_backend_pid()", {})[0][0]
        uow.release_connection()
        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                uow._own_local.conn = None  # a thread with no own connection yet
                theirs = uow.run_one("SELECT pg_backend_pid()", {})[0][0]
                uow._own_local.conn.close()
                code = 0 if theirs != pooled else 2
            finally:
                os.write(w, bytes([code]))
                os._exit(0)
        os.close(w)
        assert os.read(r, 1) == b"\x00"
        os.waitpid(child, 0)
        with one_statement() as conn:  # the parent's pooled connection is alive
            assert uow.execute_rows(conn, "SELECT pg_backend_pid()", {})[0][0] == pooled
        uow.release_connection()


def _backend(app, sql="SELECT pg_backend_pid()"):
    from app.services.platform import uow

    return uow.run_one(sql, {})[0][0]


def _kill(*pids):
    with db.engine.connect() as c:
        for pid in pids:
            c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        c.commit()


def test_a_restart_costs_one_retry_not_a_failed_call(app):
    """A server restart kills the thread's own connection AND the pool's idle ones: the
    retry must get a fresh connection (the pool's older connections invalidated, as
    SQLAlchemy does on a disconnect), not another dead one. Failed on 38551bc: both
    attempts died (AdminShutdown), i.e. a 500 for the metered call."""
    from app.services.platform import uow

    with app.app_context():
        own = _backend(app)
        with one_statement() as conn:  # an idle pooled connection of the autocommit pool
            pooled = uow.execute_rows(conn, "SELECT pg_backend_pid()", {})[0][0]
        uow.release_connection()
        _kill(own, pooled)
        fresh = _backend(app)
        assert fresh not in (own, pooled)
        with one_statement() as conn:  # the pool's dead idle connection was replaced too
            assert uow.execute_rows(conn, "SELECT pg_backend_pid()", {})[0][0] != pooled
        uow.release_connection()


def test_execute_rows_disconnect_invalidates_the_pools_older_connections(app):
    """execute_rows on a pooled connection that a restart killed fails once (reported
    ``connection_invalidated``); the pool's other connections of that generation are
    replaced on checkout, so the next statements succeed. Failed on 38551bc: every dead
    idle connection failed one statement in turn."""
    from sqlalchemy.exc import DBAPIError

    from app.services.platform import uow

    with app.app_context():
        engine = uow._autocommit_engine()
        engine.dispose()  # the pool holds only this test's connections (FIFO: others first)
        conns = [engine.connect() for _ in range(3)]
        pids = [uow.execute_rows(c, "SELECT pg_backend_pid()", {})[0][0] for c in conns]
        for c in conns:
            c.close()
        _kill(*pids)
        outcomes = []
        for _ in range(3):
            try:
                with one_statement() as conn:
                    outcomes.append(uow.execute_rows(conn, "SELECT 1::int", {}) == [(1,)])
            except DBAPIError as exc:
                outcomes.append(f"invalidated={exc.connection_invalidated}")
            uow.release_connection()
        assert outcomes.count(True) >= 2 and outcomes[1:] == [True, True], outcomes


def test_own_connection_follows_pool_recycle(app, monkeypatch):
    """``pool_recycle`` (production: 1800 s) applies to the thread's own connection as to a
    pooled one: past it, the next statement runs on a new connection and the old one is
    closed. Failed on 38551bc: the same backend forever."""
    import time

    from app.services.platform import uow

    with app.app_context():
        engine = uow._autocommit_engine()
        first = _backend(app)
        monkeypatch.setattr(engine.pool, "_recycle", 0.2)
        time.sleep(0.3)
        second = _backend(app)
        assert second != first
        with db.engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"),
                             {"p": first}).scalar() == 0


def test_own_connection_keeps_names_prepared_while_pooled(app):
    """A connection that execute_rows used while pooled (its statements prepared there)
    and that becomes a thread's own connection knows those names: the same SQL through
    run_one runs. Failed on 38551bc: 'prepared statement "gw_…" already exists', for good."""
    import threading

    from app.services.platform import uow

    sql = "SELECT %(n)s::int * 2, pg_backend_pid()"
    with app.app_context():
        engine = uow._autocommit_engine()
        engine.dispose()  # one pooled connection only: the next thread's own is made from it
        with one_statement() as conn:
            pooled = uow.execute_rows(conn, sql, {"n": 1})[0][1]
        uow.release_connection()
    got = []

    def in_thread():
        with app.app_context():
            got.append(uow.run_one(sql, {"n": 21}))

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    assert got == [[(42, pooled)]]


def test_direct_path_keeps_what_the_cursor_accepted(app):
    """Several statements in one text still run (they take the cursor: a prepared
    statement holds one); a missing parameter is SQLAlchemy's ProgrammingError, as
    before, and does not cost the thread its connection."""
    from sqlalchemy.exc import ProgrammingError

    from app.services.platform import uow

    with app.app_context():
        assert uow.run_one("SELECT 1; SELECT 2", {}) == [(1,)]  # the first result, as the cursor answers
        own = _backend(app)
        with pytest.raises(ProgrammingError, match="missing"):
            uow.run_one("SELECT %(a)s::int + %(b)s::int", {"a": 1})
        assert _backend(app) == own

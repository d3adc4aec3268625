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


def _boom():
    db.session.flush()
    raise ValueError("boom")


def _nested():
    with unit_of_work():
        pass


@pytest.mark.parametrize("inside, error, match", [(_boom, ValueError, "boom"),
                                                  (_nested, RuntimeError, "do not nest")],
                         ids=["error", "nesting"])
def test_a_failing_unit_rolls_back_reraises_and_resets(app, inside, error, match):
    """An error inside a unit, or a nested unit (refused), rolls the whole unit back and
    re-raises; the state is reset: a new unit opens and commits."""
    with app.app_context():
        with pytest.raises(error, match=match):
            with unit_of_work():
                db.session.add(_row())
                inside()
        assert not in_unit_of_work()
        assert db.session.execute(select(func.count()).select_from(ContactMessage)).scalar_one() == 0
        assert _committed_count() == 0
        with unit_of_work():
            db.session.add(_row())
        assert _committed_count() == 1


def test_one_statement_commits_by_itself_and_refuses_inside_a_unit(app):
    insert = text("INSERT INTO contact_messages (id, email, message, created_at) "
                  "VALUES (:id, 'a@example.com', 'hi', now())")
    with app.app_context():
        with one_statement() as conn:  # autocommit: visible at once, nothing to commit
            conn.execute(insert, {"id": new_id("contact")})
            assert _committed_count() == 1
        assert conn.closed  # returned to the pool when the block ends
        with pytest.raises(RuntimeError, match="inside a unit_of_work"):
            with unit_of_work():
                with one_statement():
                    pass


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


def _kill(*pids):
    """Terminate those server processes, from a connection outside the pool."""
    import psycopg

    url = db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as c:
        for pid in pids:
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))


def _pool_pids(engine, n: int) -> list[int]:
    """Check out ``n`` connections of the pool at once, note their server pids, return them."""
    conns = [engine.raw_connection() for _ in range(n)]
    try:
        return [c.driver_connection.info.backend_pid for c in conns]
    finally:
        for c in conns:
            c.close()


def test_run_one_keeps_sqlalchemys_errors_and_listeners(app):
    """``run_one`` sends SQL text to a psycopg cursor of the pool, yet a refused
    statement raises SQLAlchemy's error (the DBAPI class, the SQLSTATE on ``orig``), a
    dead connection is reported ``connection_invalidated`` (and retried once on a fresh
    one), and while statement events are wanted the listeners see the statement."""
    from sqlalchemy.engine import Engine
    from sqlalchemy.exc import DBAPIError, IntegrityError

    from app.services.platform import uow

    with app.app_context():
        assert uow.run_one("SELECT %(a)s::int + 1, 'x'", {"a": 1}) == [(2, "x")]
        assert uow.run_one("SET LOCAL synchronous_commit = off", {}) == []
        with pytest.raises(DBAPIError) as refused:
            uow.run_one("DO $$ BEGIN RAISE EXCEPTION 'no' USING ERRCODE = 'GW402'; END $$", {})
        assert refused.value.orig.sqlstate == "GW402" and not refused.value.connection_invalidated
        with pytest.raises(IntegrityError):
            uow.run_one("DO $$ BEGIN RAISE unique_violation; END $$", {})
        # a refusal leaves the connection usable and back out of autocommit
        raw = db.engine.raw_connection()
        try:
            assert raw.driver_connection.autocommit is False
        finally:
            raw.close()
        with pytest.raises(DBAPIError) as dead:  # a connection that dies under its statement
            uow.run_statement("SELECT pg_terminate_backend(pg_backend_pid())", {})
        assert dead.value.connection_invalidated and dead.value.orig.sqlstate == "57P01"
        assert uow.run_one("SELECT 41 + 1", {}) == [(42,)]
        seen = []

        def listener(conn, cursor, statement, *args):
            seen.append(statement)
        with listening(Engine, ("before_cursor_execute", listener)):
            assert uow.run_one("SELECT %(v)s::text", {"v": "heard"}) == [("heard",)]
        assert seen == ["SELECT %(v)s::text"]
        assert uow.run_one("SELECT 7", {}) == [(7,)]  # nothing listens: the cursor again
        assert seen == ["SELECT %(v)s::text"]


def test_every_statement_shares_the_one_pool(app):
    """``run_one``, ``one_statement`` and the session check connections out of the same
    pool (db.engine's) and give them back when the statement ends: a process holds no
    connection of its own per thread. Failed before (the thread's own connection, a
    second autocommit pool): 8 threads left 8 connections outside any pool."""
    import threading

    from app.services.platform import uow

    with app.app_context():
        pool = db.engine.pool
        assert uow._autocommit_engine().pool is pool
        before = pool.checkedout()
        barrier = threading.Barrier(8)

        def work():
            with app.app_context():
                barrier.wait()
                for _ in range(5):
                    uow.run_one("SELECT pg_backend_pid()", {})
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert pool.checkedout() == before  # all returned
        assert pool.checkedin() + pool.checkedout() <= pool.size() + max(pool.overflow(), 0)
        with one_statement() as conn:
            assert pool.checkedout() == before + 1
            assert conn.exec_driver_sql("SHOW transaction_isolation").scalar() is not None
        assert pool.checkedout() == before


def test_run_one_gives_the_sessions_connection_back_first(app):
    """A request never holds two of the pool's connections at once: ``run_one`` ends the
    session's reads (a credential lookup's) before checking a connection out. Failed
    before: 8 threads each holding a session connection and waiting for a second emptied
    a pool of 8, and every request waited out the pool timeout (503, tests/e2e/
    test_connection_budget.py)."""
    from sqlalchemy import event

    from app.services.platform import uow

    with app.app_context():
        pool = db.engine.pool
        db.session.execute(text("SELECT 1"))  # the session's transaction holds a connection
        assert db.session().in_transaction()
        held = pool.checkedout()
        at_checkout = []

        def checkout(*args):
            at_checkout.append(pool.checkedout())
        event.listen(pool, "checkout", checkout)
        try:
            assert uow.run_one("SELECT 1", {}) == [(1,)]
        finally:
            event.remove(pool, "checkout", checkout)
        assert at_checkout == [held]  # the session's was given back before
        assert not db.session().in_transaction()


def test_run_one_makes_no_session_for_a_request_that_has_none(app):
    """A request that never used the session (warm caches: the metered call's usual
    case) gets none made by ``run_one``'s check for open reads (making one costs more
    than the check)."""
    from app.services.platform import uow

    with app.app_context():
        assert not db.session.registry.has()
        assert uow.run_one("SELECT 1", {}) == [(1,)]
        assert uow.read(text("SELECT 2")) == [(2,)]
        assert not db.session.registry.has()


def test_a_restart_costs_no_failed_call(app):
    """A server restart kills the pool's idle connections: the checkout sees each one's
    closed socket and connects afresh (dbpool._alive), so no statement fails on them, and
    the pool's connections are out of autocommit for the session's transactions."""
    from app.services.platform import uow

    with app.app_context():
        db.engine.dispose()
        pids = _pool_pids(db.engine, 3)
        _kill(*pids)
        import time
        time.sleep(0.2)  # the server's end: the backends exit and close their sockets
        got = [uow.run_statement("SELECT pg_backend_pid()", {})[0][0] for _ in range(3)]
        assert not set(got) & set(pids)
        assert db.session.execute(text("SELECT 1")).scalar() == 1
        db.session.rollback()


def test_a_forked_child_leaves_the_parents_pooled_connections_alone(app):
    """The pool's idle connections are the parent's: a forked child that connects its own
    must not close them (that ends the parent's sessions on the shared sockets).
    dbpool's at-fork hook drops them in the child without closing."""
    import os

    from app.services.platform import uow

    with app.app_context():
        db.engine.dispose()
        pooled = uow.run_one("SELECT pg_backend_pid()", {})[0][0]
        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                theirs = uow.run_one("SELECT pg_backend_pid()", {})[0][0]
                db.engine.dispose()  # the child's own, closed
                code = 0 if theirs != pooled else 2
            finally:
                os.write(w, bytes([code]))
                os._exit(code)
        os.close(w)
        assert os.read(r, 1) == b"\x00"
        os.waitpid(child, 0)
        assert uow.run_one("SELECT pg_backend_pid()", {})[0][0] == pooled  # alive, still ours


def test_run_one_prepares_with_psycopgs_threshold(app):
    """Server-side prepared statements come from psycopg's ``prepare_threshold`` (config:
    ``DB_PREPARE_THRESHOLD``, none behind PgBouncer): a statement run often enough is
    prepared on its connection (``pg_prepared_statements``)."""
    from app.services.platform import uow

    with app.app_context():
        db.engine.dispose()
        sql = "SELECT %(n)s::int, pg_backend_pid()"
        for n in range(8):
            assert uow.run_one(sql, {"n": n})[0][0] == n
        names = uow.run_one("SELECT statement FROM pg_prepared_statements", {})
        assert any("$1::int" in row[0] for row in names), names


def test_pool_settings_come_from_the_configuration(monkeypatch):
    """One pool per process, sized by configuration (documented defaults), pre-ping off
    (the checkout check replaces it), prepared statements off behind PgBouncer."""
    import config

    monkeypatch.delenv("DB_PREPARE_THRESHOLD", raising=False)
    opts = config.engine_options({"DATABASE_PGBOUNCER": False})
    assert (opts["pool_size"], opts["max_overflow"], opts["pool_timeout"]) == (8, 0, 5.0)
    assert opts["pool_pre_ping"] is False and opts["connect_args"]["prepare_threshold"] == 5
    assert config.engine_options({"DATABASE_PGBOUNCER": True})["connect_args"]["prepare_threshold"] is None
    monkeypatch.setenv("DB_PREPARE_THRESHOLD", "1")
    assert config.engine_options({"DATABASE_PGBOUNCER": True})["connect_args"]["prepare_threshold"] == 1
    monkeypatch.setenv("DB_PREPARE_THRESHOLD", "none")
    assert config.engine_options({"DATABASE_PGBOUNCER": False})["connect_args"]["prepare_threshold"] is None
    for name, bad in (("DB_PREPARE_THRESHOLD", "soon"), ("DB_POOL_SIZE", "0"), ("DB_POOL_TIMEOUT", "0")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(config.ConfigError, match=name):
            config.engine_options({"DATABASE_PGBOUNCER": False})
        monkeypatch.delenv(name)


def test_an_exhausted_pool_answers_503_not_500(app, client, monkeypatch):
    """A checkout that waits DB_POOL_TIMEOUT in vain (every connection busy) is a 503
    ``service_unavailable`` with Retry-After, as is PostgreSQL's too_many_connections;
    nothing else is."""
    from sqlalchemy.exc import OperationalError, TimeoutError as PoolTimeout

    from app import errors

    assert errors.database_busy(PoolTimeout("QueuePool limit of size 4 overflow 4 reached"))

    class Orig(Exception):
        sqlstate = "53300"
    assert errors.database_busy(OperationalError("connect", {}, Orig("too many clients")))
    Orig.sqlstate = "23505"
    assert not errors.database_busy(OperationalError("x", {}, Orig("dup")))
    with app.test_request_context():
        resp = errors.handle_unexpected(PoolTimeout("busy"))
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "1"
    assert resp.get_json()["error"] == "service_unavailable"

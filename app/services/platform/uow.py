"""The unit of work: the one place that commits or rolls back the database session.

A service entry point runs its writes inside exactly one ``unit_of_work()`` (or is
decorated ``@transactional``): it commits when the block ends normally and rolls back
when an exception leaves it. Helpers below an entry point never commit or roll back, and
units of work never nest: a second one may start only after the first has ended. A
network call never runs inside a unit of work; a flow that needs one (a provider call, a
payment processor, an x402 facilitator) is two units of work in sequence around it.

``after_commit(fn, ...)`` registers work that must only happen once the data it refers
to is committed (e.g. enqueueing outbox delivery); it is dropped on rollback, and a
failing hook is logged without undoing the commit. State lives in a ``ContextVar``, so
it is per thread / per request and works the same in requests, RQ jobs and CLI commands.

``one_statement()`` is the one documented exception to "writes in a unit of work": a
write that is a single statement (PostgreSQL function or data-modifying CTE) runs in
autocommit — PostgreSQL makes one statement atomic by itself, so BEGIN/COMMIT would only
add round trips. Such a statement must leave nothing behind when it refuses (it RAISEs,
and the server undoes it), and says itself whether its commit waits for the WAL flush
(``gw_open_calls`` does not, the finalize does: docs/performance.md, "What a crash can
lose").

``read(statement, params)`` runs ONE read-only statement for an entry point that reads and
writes nothing else (the usage reads): when no unit of work is open and the
session holds no transaction, in autocommit — one round trip instead of ``BEGIN`` +
statement + ``ROLLBACK``; a single statement sees one snapshot by itself. Otherwise
(inside a unit of work, or after earlier reads of this request opened a transaction) on
``db.session``, so it sees what the session sees.

Connections (docs/architecture.md, "Connections"): every statement of the process — the
session's, these autocommit ones, the finalize writer's and the background flushes' —
runs on a connection of ONE pool, the app engine's (``db.engine``: ``DB_POOL_SIZE`` +
``DB_MAX_OVERFLOW`` connections at most, a checkout waits ``DB_POOL_TIMEOUT`` seconds and
then fails, answered 503). A statement here holds its connection only while it runs
(checked out, run, returned), never across a provider call, so a worker's 8 request
threads share a few connections. Everything is public API: SQLAlchemy's
``Engine.raw_connection`` / ``Connection.exec_driver_sql``, psycopg's cursor and its
``prepare_threshold`` (server-side prepared statements, off behind PgBouncer < 1.21).
"""
from __future__ import annotations

import functools
import logging
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

import psycopg
import sqlalchemy.exc as sa_exc
from flask import current_app
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from app.extensions import db

log = logging.getLogger(__name__)

_current: ContextVar["_Unit | None"] = ContextVar("unit_of_work", default=None)


class _Unit:
    __slots__ = ("hooks",)

    def __init__(self) -> None:
        self.hooks: list[tuple[Callable, tuple, dict]] = []


def in_unit_of_work() -> bool:
    """True while a unit of work is open in this context."""
    return _current.get() is not None


@contextmanager
def unit_of_work() -> Iterator[None]:
    """Commit ``db.session`` when the block ends normally, roll it back (and re-raise)
    when it raises; then run the ``after_commit`` hooks of a committed unit. Refuses to
    nest (RuntimeError): the outer entry point owns the transaction."""
    if _current.get() is not None:
        raise RuntimeError("unit_of_work() is already open: units of work do not nest; "
                           "call the helper below the entry point instead of another entry point")
    unit = _Unit()
    token = _current.set(unit)
    try:
        try:
            yield
        except BaseException:
            db.session.rollback()
            raise
        try:
            db.session.commit()
        except BaseException:
            db.session.rollback()
            raise
    finally:
        _current.reset(token)
    for fn, args, kwargs in unit.hooks:
        try:
            fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - the commit stands; the hook's own retry covers it
            log.exception("after-commit hook %s failed", getattr(fn, "__qualname__", fn))


def transactional(fn: Callable) -> Callable:
    """Decorator: run a service entry point inside ``unit_of_work()``."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with unit_of_work():
            return fn(*args, **kwargs)
    return wrapper


def end_reads() -> None:
    """End the session's open transaction of reads made before (e.g. a credential lookup)
    and give its connection back to the pool, so the session does not sit idle in a
    transaction through a provider call, nor hold a connection while the request's
    one-statement write takes another. A rollback: reads have nothing to commit, and a
    write made outside a unit of work (the rules forbid it) is not committed by accident;
    the same one round trip the session's end at teardown would have cost. Nothing to do
    (no round trip) when the session has no transaction open. Refuses inside a unit of
    work (RuntimeError): that one owns the transaction."""
    if _current.get() is not None:
        raise RuntimeError("end_reads() inside a unit_of_work(): the unit of work ends it")
    if _session_in_transaction():
        db.session.rollback()


def _session_in_transaction() -> bool:
    """The request's session holds a transaction; without making a session when the
    request has none yet (``scoped_session.registry.has``: ~11 µs saved per request)."""
    return db.session.registry.has() and db.session().in_transaction()


def read(statement, params: dict | None = None) -> list:
    """Run ONE read-only ``statement`` and return its rows (fetched): in autocommit when
    nothing is open on the session (see the module docstring), else on ``db.session``.
    Never for a statement that writes. A connection found dead (server restart) is
    replaced and the read run again, once (``run_one``: a read is always safe to repeat)."""
    if _current.get() is None and not _session_in_transaction():
        return run_one(statement, params or {})
    return db.session.execute(statement, params or {}).all()


def run_one(statement, params: dict) -> list:
    """Run ONE statement (driver-level SQL text, or a SQLAlchemy statement) in autocommit
    on a connection of the app's pool and return its rows (a list; empty when it returns
    none). A pooled connection found dead (``connection_invalidated``: a server restart)
    is replaced and the statement run once more with the SAME parameters, so only for a
    statement that is safe to repeat: a read, or a write whose first attempt, had it
    committed before the connection died, makes the second fail or write nothing (the
    caller says why). Every other error propagates."""
    for attempt in (1, 2):
        try:
            return run_statement(statement, params)
        except DBAPIError as exc:
            if not exc.connection_invalidated or attempt == 2:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def run_statement(statement, params: dict) -> list:
    """``run_one`` without the retry: ONE attempt (for a statement whose caller handles
    a lost connection itself, e.g. the finalize writer, which retries until written).
    The session's open reads are ended first (``end_reads``: one connection per request
    at a time).

    SQL text goes to a psycopg cursor of the pooled connection (``_run_on_cursor``):
    checked out, switched to autocommit, run, switched back and returned, with
    SQLAlchemy's errors; no SQLAlchemy ``Connection``, execution context or result
    object per statement (~170 µs of CPU less than ``exec_driver_sql``: docs/
    architecture.md, "Connections"). While something wants SQLAlchemy's statement
    events (``statement_events``: tracing, statement counters) or for a SQLAlchemy
    statement, it runs through ``Connection.exec_driver_sql`` / ``execute``, so the
    listeners see it."""
    if _current.get() is not None:
        raise RuntimeError("run_one() inside a unit_of_work(): it runs on its own connection")
    # A request never holds two connections of the pool at once: the session's reads so
    # far (e.g. a credential lookup) end and give theirs back first. Otherwise every
    # thread of a worker holding one and waiting for a second empties a pool smaller
    # than twice the threads, and they all wait out DB_POOL_TIMEOUT (503s under load).
    end_reads()
    if isinstance(statement, str) and not _events_wanted:
        return _run_on_cursor(db.engine, statement, params)
    with one_statement() as conn:
        if isinstance(statement, str):
            return execute_rows(conn, statement, params)
        return conn.execute(statement, params).all()


def execute_rows(conn: Connection, sql: str, params: dict) -> list[tuple]:
    """Run driver-level ``sql`` on ``conn`` (``exec_driver_sql``) and return its rows
    (tuples; none for a statement that returns none)."""
    result = conn.exec_driver_sql(sql, params)
    return [tuple(row) for row in result] if result.returns_rows else []


# --- statement events ----------------------------------------------------------------

_events_wanted = 0
_events_lock = threading.Lock()


@contextmanager
def statement_events() -> Iterator[None]:
    """While the block runs, every statement of ``run_one`` goes through SQLAlchemy's
    execution, so listeners of its statement events (``before_cursor_execute`` …) see
    it: the statement counters of tests and ``bench/roundtrips.py``. Nests and may be
    used from several threads; ``want_statement_events()`` turns it on for good
    (tracing)."""
    global _events_wanted
    with _events_lock:
        _events_wanted += 1
    try:
        yield
    finally:
        with _events_lock:
            _events_wanted -= 1


def want_statement_events() -> None:
    """Route every statement through SQLAlchemy's execution from now on (tracing:
    OpenTelemetry's SQLAlchemy instrumentation listens to its statement events)."""
    global _events_wanted
    with _events_lock:
        _events_wanted += 1


# --- statements on a psycopg cursor ---------------------------------------------------
#
# A pooled connection's psycopg cursor is made once and kept in the pool record's
# ``info`` (it lives as long as that connection); psycopg prepares a statement on the
# server after ``prepare_threshold`` executions on the connection (connect argument,
# config.py ``DB_PREPARE_THRESHOLD``; off behind PgBouncer). Errors become SQLAlchemy's
# (the DBAPI's class names are the same), with ``connection_invalidated`` set and the
# connection invalidated when the dialect calls the error a disconnect.

_CURSOR = "gw_cursor"


def _run_on_cursor(engine: Engine, sql: str, params: dict) -> list[tuple]:
    fairy = engine.raw_connection()  # the pool's checkout (its liveness check included)
    try:
        conn = fairy.driver_connection
        cursor = fairy.info.get(_CURSOR)
        if cursor is None or cursor.closed:
            cursor = fairy.info[_CURSOR] = conn.cursor()
        try:
            conn.autocommit = True
            cursor.execute(sql, params)
            rows = cursor.fetchall() if cursor.description is not None else []
            conn.autocommit = False
            return rows
        except psycopg.Error as orig:
            dead = engine.dialect.is_disconnect(orig, conn, cursor)
            if not dead:
                try:  # refused in autocommit: nothing open, the connection goes back as it came
                    conn.autocommit = False
                except psycopg.Error:
                    dead = True
            if dead:
                fairy.invalidate(orig)
            raise _sqlalchemy_error(sql, params, orig, dead) from orig
        except BaseException:  # interrupted mid-exchange: its protocol state is unknown
            fairy.invalidate()
            raise
    finally:
        fairy.close()  # back to the pool (an invalidated one is discarded)


def _sqlalchemy_error(sql: str, params: dict, orig: psycopg.Error, dead: bool) -> DBAPIError:
    """``orig`` as SQLAlchemy raises it from ``exec_driver_sql`` (its DBAPI class)."""
    for cls in type(orig).__mro__:
        wrapper = getattr(sa_exc, cls.__name__, None)
        if isinstance(wrapper, type) and issubclass(wrapper, DBAPIError):
            return wrapper(sql, params, orig, connection_invalidated=dead)
    return DBAPIError(sql, params, orig, connection_invalidated=dead)  # pragma: no cover


def stream(sql: str, params: dict, *, size: int = 1000) -> Iterator[tuple]:
    """Run ONE read-only driver-level ``sql`` in autocommit and yield its rows as they
    arrive: psycopg's ``Cursor.stream`` (one round trip; the server sends the rows in
    chunks of ``size``, memory stays constant) on a connection of the app's pool, held
    until the generator ends. The session's open reads end first (``end_reads``). A
    generator closed early (a client that went away mid-download) leaves psycopg to
    cancel the statement; a connection not back to idle after that is discarded. While
    something wants SQLAlchemy's statement events it runs through ``exec_driver_sql`` with
    ``stream_results`` in a transaction instead, so the listeners see it. Errors are
    SQLAlchemy's, as from ``run_one``."""
    if _current.get() is not None:
        raise RuntimeError("stream() inside a unit_of_work(): it runs on its own connection")
    end_reads()
    if _events_wanted:
        with db.engine.connect() as conn, conn.begin():
            result = conn.execution_options(stream_results=True, max_row_buffer=size).exec_driver_sql(sql, params)
            yield from (tuple(row) for row in result)
        return
    fairy = db.engine.raw_connection()
    conn = fairy.driver_connection
    cursor = conn.cursor()
    try:
        conn.autocommit = True
        try:
            yield from cursor.stream(sql, params, size=size)
        except psycopg.Error as orig:
            dead = db.engine.dialect.is_disconnect(orig, conn, cursor)
            if dead:
                fairy.invalidate(orig)
            raise _sqlalchemy_error(sql, params, orig, dead) from orig
    finally:
        try:
            cursor.close()
            if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                conn.autocommit = False
            elif fairy.is_valid:
                fairy.invalidate()
        except psycopg.Error:
            fairy.invalidate()
        fairy.close()  # back to the pool (an invalidated one is discarded)


def after_commit(fn: Callable, *args: Any, **kwargs: Any) -> None:
    """Run ``fn(*args, **kwargs)`` after the current unit of work commits (never if it
    rolls back). Raises RuntimeError when no unit of work is open."""
    unit = _current.get()
    if unit is None:
        raise RuntimeError("after_commit() needs an open unit_of_work()")
    unit.hooks.append((fn, args, kwargs))


def lock_key(key: str) -> None:
    """Hold a transaction advisory lock on ``key`` until the caller's transaction ends (a
    lock on a name, not a row: an earner's earnings, a payout wallet's nonces, one contact
    sender's submissions)."""
    db.session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"), {"k": key})


def _autocommit_engine() -> Engine:
    """The app engine with ``AUTOCOMMIT`` (``Engine.execution_options``: the SAME pool,
    its connections switched to autocommit while checked out)."""
    app = current_app._get_current_object()
    engine = app.extensions.get("uow.autocommit")
    if engine is None or engine.pool is not db.engine.pool:
        engine = app.extensions["uow.autocommit"] = db.engine.execution_options(isolation_level="AUTOCOMMIT")
    return engine


@contextmanager
def one_statement() -> Iterator[Connection]:
    """An autocommit SQLAlchemy ``Connection`` of the app's pool for self-contained
    statements (see the module docstring): each ``execute`` commits on its own, nothing
    to commit or roll back; returned to the pool when the block ends. Refuses inside a
    unit of work (RuntimeError): it is another connection, so it would not see that
    unit's writes nor be undone with them."""
    if _current.get() is not None:
        raise RuntimeError("one_statement() inside a unit_of_work(): it runs on its own connection")
    with _autocommit_engine().connect() as conn:
        yield conn

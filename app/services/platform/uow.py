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
autocommit on the request's hot-path connection — PostgreSQL makes one statement
atomic by itself, so BEGIN/COMMIT would only add round trips. Such a statement must
leave nothing behind when it refuses (it RAISEs, and the server undoes it), and says
itself whether its commit waits for the WAL flush (``gw_open_call`` does not, the
finalize does: docs/performance.md).

``read(statement, params)`` runs ONE read-only statement for an entry point that reads and
writes nothing else (the usage reads): on PostgreSQL, when no unit of work is open and the
session holds no transaction, on the same autocommit connection — one round trip instead
of pool pre-ping + ``BEGIN`` + statement + ``ROLLBACK`` at teardown; a single statement
sees one snapshot by itself. Otherwise (SQLite, inside a unit of work, or after earlier
reads of this request opened a transaction) on ``db.session``, so it sees what the
session sees.
"""
from __future__ import annotations

import functools
import logging
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

from flask import current_app, g, has_app_context
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from app.extensions import db, side_engine

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
    """End the session's open transaction of reads made before (e.g. a credential lookup),
    as a unit of work would end them, so the session does not sit idle in a transaction
    through a provider call while the hot path writes on its ``one_statement``
    connection. Nothing to do (no round trip) when the session has no transaction open.
    Refuses inside a unit of work (RuntimeError): that one owns the transaction."""
    if _current.get() is not None:
        raise RuntimeError("end_reads() inside a unit_of_work(): the unit of work ends it")
    if db.session().in_transaction():
        db.session.commit()


def read(statement, params: dict | None = None) -> list:
    """Run ONE read-only ``statement`` and return its rows (fetched): on PostgreSQL on the
    request's autocommit connection when nothing is open on the session (see the module
    docstring), else on ``db.session``. Never for a statement that writes. A connection
    found dead (server restart: that pool has no pre-ping) is replaced and the read run
    again, once (``run_one``: a read is always safe to repeat)."""
    if (_current.get() is None and one_statement_supported()
            and not db.session().in_transaction()):
        return run_one(statement, params or {})
    return db.session.execute(statement, params or {}).all()


def one_statement_supported() -> bool:
    """True when the app's database runs the one-statement hot path (PostgreSQL)."""
    return db.engine.dialect.name == "postgresql"


# SQLSTATEs the hot path's server-side functions RAISE on a refusal (``gw_open_call``,
# ``gw_chat_hold``: the statement is undone, nothing written), and what they mean.
REFUSALS = {"GW402": "insufficient", "GWKSL": "key_spend_limit"}


def run_one(statement, params: dict) -> list:
    """Run ONE statement (driver-level SQL text, or a SQLAlchemy statement) on the
    request's ``one_statement`` connection and return its rows (a list; empty when it
    returns none). A pooled connection found dead (``connection_invalidated``: a server
    restart; this pool has no pre-ping) is replaced and the statement run once more with
    the SAME parameters, so only for a statement that is safe to repeat: a read, or a
    write whose first attempt, had it committed before the connection died, makes the
    second fail or write nothing (the caller says why). Every other error propagates."""
    for attempt in (1, 2):
        try:
            with one_statement() as conn:
                if isinstance(statement, str):
                    return execute_rows(conn, statement, params)
                return conn.execute(statement, params).all()
        except DBAPIError as exc:
            if not exc.connection_invalidated or attempt == 2:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def execute_rows(conn: Connection, sql: str, params: dict) -> list[tuple]:
    """Run driver-level ``sql`` on ``conn`` and return all its rows (tuples).

    When nothing listens to the connection's statement events right now (the normal
    case) the statement goes straight to a driver cursor through SQLAlchemy's
    ``_cursor_execute``: the same execution and error handling as ``exec_driver_sql``
    (psycopg errors raised as ``DBAPIError``; a lost connection invalidated,
    ``connection_invalidated`` set) without building an execution context and a result
    per statement (~0.1 ms of CPU each on the hot path). When something listens
    (tracing, the bench's statement counters) it runs through ``exec_driver_sql``, so the
    listeners see it as before. The check is on the listener lists themselves (~1 µs),
    not SQLAlchemy's ``_has_events`` flag, which stays set after a listener is removed."""
    if conn.dispatch.before_cursor_execute or conn.dispatch.after_cursor_execute:
        return [tuple(row) for row in conn.exec_driver_sql(sql, params)]
    cursor = conn.connection.cursor()
    try:
        conn._cursor_execute(cursor, sql, params)
        return cursor.fetchall() if cursor.description is not None else []
    finally:
        cursor.close()


def after_commit(fn: Callable, *args: Any, **kwargs: Any) -> None:
    """Run ``fn(*args, **kwargs)`` after the current unit of work commits (never if it
    rolls back). Raises RuntimeError when no unit of work is open."""
    unit = _current.get()
    if unit is None:
        raise RuntimeError("after_commit() needs an open unit_of_work()")
    unit.hooks.append((fn, args, kwargs))


def _autocommit_engine() -> Engine:
    """The process's pool of autocommit connections to the app's database (same URL and
    connect arguments). No pre-ping: a connection that went stale (server restart) fails
    its statement with ``connection_invalidated`` and the caller may retry once on a
    fresh one (``gateway.charging`` does, where a retry is safe)."""
    opts = dict(current_app.config.get("SQLALCHEMY_ENGINE_OPTIONS") or {})
    # Nothing to reset on return: an autocommit connection never holds a transaction
    # (the default "rollback" reset only cost Python work per request).
    opts.update(pool_pre_ping=False, isolation_level="AUTOCOMMIT", pool_reset_on_return=None)
    return side_engine("autocommit", **opts)


@contextmanager
def one_statement() -> Iterator[Connection]:
    """An autocommit connection for ONE self-contained write statement (see the module
    docstring): each ``execute`` commits on its own, nothing to commit or roll back.
    Within a request (app context) the same connection serves every such statement of
    the request (one pool checkout; returned at teardown). Refuses inside a unit of
    work (RuntimeError): it is another connection, so it would not see that unit's
    writes nor be undone with them."""
    if _current.get() is not None:
        raise RuntimeError("one_statement() inside a unit_of_work(): it runs on its own connection")
    conn = g.get("_one_statement_conn") if has_app_context() else None
    if conn is None or conn.closed or conn.invalidated:
        conn = _autocommit_engine().connect()
        if has_app_context():
            g._one_statement_conn = conn
        else:  # pragma: no cover - hot paths run in an app context
            with conn:
                yield conn
            return
    try:
        yield conn
    except BaseException:
        conn.rollback()  # ends SQLAlchemy's bookkeeping only: autocommit has nothing to undo
        if conn.invalidated:
            g.pop("_one_statement_conn", None)
            conn.close()
        raise


def pg_array(values) -> str:
    """A PostgreSQL array literal of ``values`` (every element quoted) for a driver-level
    statement that casts it (``%(x)s::varchar[]``): cheaper than psycopg's list
    adaptation, which inspects the list on every execution (~30 µs a statement)."""
    return "{" + ",".join('"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def release_connection(exc: BaseException | None = None) -> None:  # noqa: ARG001
    """Teardown: return the request's ``one_statement`` connection to its pool."""
    conn = g.pop("_one_statement_conn", None)
    if conn is not None:
        conn.close()


def init_app(app) -> None:
    app.teardown_appcontext(release_connection)

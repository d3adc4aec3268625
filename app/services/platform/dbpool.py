"""The process's one PostgreSQL pool (``db.engine``): its checkout check and the name
its connections carry. Sizes and timeouts: ``config.engine_options``; who uses it:
``uow`` (docs/architecture.md, "Connections").

* Checkout: an idle connection whose server side is gone (PostgreSQL restarted, the
  session was terminated, PgBouncer went away) has a readable socket — the server's last
  message and the end of the stream. The checkout looks without waiting (``select`` with
  a zero timeout, a few µs) and reads what is there through libpq
  (``PGconn.consume_input``): a connection that is then closed or broken is replaced
  before anything runs on it (``DisconnectionError``: SQLAlchemy's documented way for a
  checkout listener to have the pool connect afresh). A healthy idle connection is never
  readable (the app uses no LISTEN), so the check costs no round trip — what
  ``pool_pre_ping``'s ``SELECT 1`` per checkout cost on every statement of the hot path.
  A connection that dies silently (a network that drops packets) is not seen here; its
  statement fails and ``uow.run_one`` retries a statement that is safe to repeat.
* After a fork (gunicorn's workers of a preloaded master, tests) the child drops the
  pool it inherited without closing its connections — they are the parent's sessions on
  shared sockets — and connects its own (``Engine.dispose(close=False)``, SQLAlchemy's
  documented recipe for forked processes).
* ``application_name`` ``gateway[<pid>]`` (PostgreSQL's ``pg_stat_activity``, PgBouncer's
  ``SHOW CLIENTS``): who holds which connection, set at connect time in each process
  (a startup parameter, so it holds behind PgBouncer too).
"""
from __future__ import annotations

import os
import select
import weakref

import psycopg
from sqlalchemy import event
from sqlalchemy.exc import DisconnectionError

from app.extensions import db


def _alive(dbapi_connection, connection_record, connection_proxy) -> None:  # noqa: ARG001
    """PoolEvents.checkout: refuse a connection whose server end is gone."""
    try:
        readable, _, _ = select.select([dbapi_connection.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error) as exc:  # closed: no socket any more
        raise DisconnectionError(f"connection closed: {exc}") from exc
    if readable or dbapi_connection.closed or dbapi_connection.broken:
        raise DisconnectionError("the server ended the connection (or sent something unasked)")


def _name(dialect, conn_rec, cargs, cparams) -> None:  # noqa: ARG001
    """DialectEvents.do_connect: the connecting process's application_name."""
    cparams.setdefault("application_name", f"gateway[{os.getpid()}]")


_engines: "weakref.WeakSet" = weakref.WeakSet()


def _forget_inherited() -> None:
    for engine in list(_engines):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_inherited)


def init_app(app) -> None:
    """Attach the checkout check and the connection name to the app's engine (made by
    Flask-SQLAlchemy now, connecting lazily)."""
    with app.app_context():
        engine = db.engine
    if not event.contains(engine, "checkout", _alive):
        event.listen(engine, "checkout", _alive)
        event.listen(engine, "do_connect", _name)
    _engines.add(engine)

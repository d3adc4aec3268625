"""Shared fixtures.

The suite runs against the PostgreSQL database named by ``DATABASE_URL`` when set,
otherwise against a throw-away embedded PostgreSQL (app/services/platform/embedded_pg.py)
started in a temporary directory for the session, whose URL is then put in
``DATABASE_URL`` for the tests and the processes they start (never the developer's
``instance/pg``); and against ``REDIS_URL`` when set. The database named by
``DATABASE_URL`` is a *test* database: its tables are dropped and rebuilt by running the
Alembic migrations at session start, and emptied after every test; its sessions commit
without waiting for the WAL flush (``synchronous_commit = off``, tests/support/workers.py).
Redis: the test DB index in ``REDIS_URL`` is flushed after every test.

Tests run the production configuration: the hot routes' one entry (``hotpath``) and the
deferred finalize (``CALL_FINALIZE_DEFERRED``: a metered call is answered, then its
``succeeded`` row, receipt and stored Idempotency-Key response are written by the
process's finalize writer). A helper that reads a call's state waits for the writer first
(``tests.support.finalize.drain``); every test's teardown drains it before the tables are
emptied, so a late write never lands in the next test's tables. A test about another
mode sets it explicitly (and restores it).
"""
from __future__ import annotations

import functools
import os
import shutil
import tempfile

import pytest
from sqlalchemy import text

from app import create_app
from app.extensions import db
from tests.support import schedule, workers
from tests.support.finalize import drain

_TMP = tempfile.mkdtemp(prefix="gw-tests-")
_EMBEDDED_PGDATA = os.path.join(_TMP, "pg")


def pytest_configure(config):  # noqa: ARG001 - pytest's hook signature
    """Runs in the xdist controller first (it starts the embedded server; its workers
    inherit the URL), then in every worker: the worker's own database and Redis index
    (tests/support/workers.py) go into the environment before any test module is read."""
    if not os.environ.get("DATABASE_URL"):
        from app.services.platform import embedded_pg

        os.environ["DATABASE_URL"] = embedded_pg.start(_EMBEDDED_PGDATA, database="gateway_test")
    worker = workers.worker_id()
    if worker:
        os.environ["DATABASE_URL"] = workers.database_url(os.environ["DATABASE_URL"], worker)
        if os.environ.get("REDIS_URL"):
            os.environ["REDIS_URL"] = workers.redis_url(os.environ["REDIS_URL"], worker)


def pytest_collection_modifyitems(config, items):  # noqa: ARG001 - pytest's hook signature
    """The long test modules (servers, subprocesses, browsers) at the starts of the xdist
    workers' slices, spread so that the workers end together (tests/support/schedule.py);
    the rest in collection order."""
    items[:] = schedule.order(items, schedule.worker_count())


def pytest_xdist_auto_num_workers(config):  # noqa: ARG001 - pytest-xdist's hook
    """``-n auto`` (``make test``): one worker more than the CPUs, at most 4. Many tests
    spend their time waiting for processes they start (servers, workers, browsers), so
    one worker per CPU left a CPU idle a third of the time (2 CPUs: 10m08s with 2
    workers, 9m40s with 3, 2026-11-28); each worker holds a database's worth of
    connections, hence the cap."""
    return max(1, min((os.cpu_count() or 1) + 1, 4))


def pytest_unconfigure(config):  # noqa: ARG001
    if os.path.isdir(_EMBEDDED_PGDATA):
        from app.services.platform import embedded_pg

        embedded_pg.stop(_EMBEDDED_PGDATA)
    shutil.rmtree(_TMP, ignore_errors=True)


def _db_url() -> str:
    return os.environ["DATABASE_URL"]


def base_config(**extra) -> dict:
    from tests.standins import shared_facilitator_url

    cfg = {
        "APP_ENV": "test",
        "TESTING": True,
        "SQLALCHEMY_DATABASE_URI": _db_url(),
        "REDIS_URL": os.environ.get("REDIS_URL") or None,
        "JOBS_INLINE": True,
        "INSTANCE_PATH": _TMP,
        "MAIL_OUTBOX_DIR": os.path.join(_TMP, "outbox"),
        "ALLOW_PRIVATE_URLS": True,
        "RATELIMIT_KEY_PREFIX": f"gwtest{os.getpid()}",
        "AUTH_CACHE_TTL": 0.0,
        # x402 settles live payments only through a facilitator: the suite's default is the
        # stand-in one (tests/standins.py, demo/facilitator.py), which checks signatures.
        "X402_FACILITATOR_URL": shared_facilitator_url(),
    }
    cfg.update(extra)
    return cfg


def _reset_schema(app) -> None:
    from flask_migrate import upgrade

    with app.app_context():
        with db.engine.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
        upgrade()


def migrated_app(url: str, *, create: bool = True):
    """The test app on the database ``url``, its schema rebuilt by the migrations; the
    database is made first when missing (``create``)."""
    if create:
        workers.ensure_database(url)
    workers.relax_durability(url)  # before the app's pool opens a connection
    app = create_app(base_config(SQLALCHEMY_DATABASE_URI=url))
    _reset_schema(app)
    return app


@pytest.fixture(scope="session")
def app():
    # an xdist worker: a database of its own, made when missing (kept for the next run)
    return migrated_app(_db_url(), create=bool(workers.worker_id()))


_RESET_SEQUENCES = text(
    "SELECT setval(format('%I.%I', schemaname, sequencename)::regclass, start_value, false) "
    "FROM pg_sequences WHERE schemaname = current_schema() AND last_value IS NOT NULL")


@functools.cache
def _emptying(tables: tuple[str, ...]) -> tuple:
    """(the one statement telling which of ``tables`` hold rows, whether this role may set
    ``session_replication_role``), read once per session."""
    probe = text("SELECT " + ", ".join(f'EXISTS (SELECT FROM "{t}")' for t in tables))
    with db.engine.connect() as conn:
        superuser = conn.execute(text("SELECT current_setting('is_superuser') = 'on'")).scalar()
    return probe, superuser


def _empty_tables(app) -> None:
    """Every table empty and every sequence at its start again, as after ``TRUNCATE …
    RESTART IDENTITY`` of them all, at a fraction of its cost: a TRUNCATE gives each of the
    ~60 relations (and their indexes) new files — 0.3-1 s per test on this shared server —
    while a test fills a handful. One statement finds the tables that hold rows; those are
    emptied by DELETE under ``session_replication_role = replica`` for the transaction, so
    neither the append-only triggers of the ledger, org_audit and invoices (they refuse
    DELETE; TRUNCATE is what they allow) nor the foreign keys' checks run: every table that
    holds rows is emptied in the same transaction, so no reference is left dangling. Then
    every sequence that was used (also by a rolled-back insert) is set back to its start.
    A role that may not set that parameter (a non-superuser ``DATABASE_URL``) TRUNCATEs
    the tables that hold rows instead. Unlike TRUNCATE, DELETE leaves the planner's
    statistics as they were: a test about a plan truncates its tables first
    (tests/services/test_usage_log.py)."""
    with app.app_context():
        db.session.remove()
        tables = tuple(t.name for t in reversed(db.metadata.sorted_tables))
        probe, superuser = _emptying(tables)
        with db.engine.begin() as conn:
            filled = [t for t, rows in zip(tables, conn.execute(probe).one()) if rows]
            if filled and superuser:
                conn.execute(text("SET LOCAL session_replication_role = replica"))
                for table in filled:
                    conn.execute(text(f'DELETE FROM "{table}"'))
            elif filled:
                conn.execute(text("TRUNCATE " + ", ".join(f'"{t}"' for t in filled)
                                  + " RESTART IDENTITY CASCADE"))
            conn.execute(_RESET_SEQUENCES)


@pytest.fixture(autouse=True)
def _clean(app):
    from app import auth

    auth.clear_cache()
    yield
    # the finalize writer's queue first: written into this test's rows, not the next one's
    from app.services.money import charging

    drained = charging.drain_finalizer(app)
    _empty_tables(app)
    auth.clear_cache()
    from app.extensions import get_redis

    with app.app_context():
        r = get_redis()
        if r is not None:
            r.flushdb()
    assert drained, "the finalize writer did not drain at teardown"


@pytest.fixture
def ctx(app):
    with app.app_context():
        yield
        db.session.remove()


@pytest.fixture
def client(app):
    return app.test_client()


class AccountHandle:
    """An account made by the ``make_account`` factory, with a full-scope key."""

    def __init__(self, account_id: str, key: str, test_key: str | None = None):
        self.id = account_id
        self.key = key
        self.test_key = test_key

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.key}"}


@pytest.fixture
def make_account(app):
    """Factory: ``make_account(email=None, plan=None, admin=False, cents=None, scopes=None)``.

    ``cents`` sets the exact starting balance (default: the 1,000-cent promo grant).
    """
    from app.scopes import ALL_SCOPES
    from app.services.accounts import accounts
    from app.services.accounts import keys
    from app.services.money import ledger

    counter = {"n": 0}

    def make(email=None, plan=None, admin=False, cents=None, scopes=None, test_key=False):
        counter["n"] += 1
        with app.app_context():
            email = email or f"user{counter['n']}-{os.urandom(3).hex()}@example.com"
            acct = accounts.create_account(email, plan=plan, admin=admin,
                                           promo=(cents is None))
            if cents:
                ledger.post("test_grant", [("adjust:test", -cents * 10_000),
                                           (ledger.customer(acct.id), cents * 10_000)])
                db.session.commit()
            _, secret = keys.mint(acct.id, "test", scopes or (ALL_SCOPES + ("admin",) if admin else ALL_SCOPES))
            tkey = keys.mint(acct.id, "sandbox", scopes or ALL_SCOPES, mode="test")[1] \
                if test_key else None
            handle = AccountHandle(acct.id, secret, tkey)
            db.session.remove()
        return handle

    return make


@pytest.fixture
def account(make_account):
    return make_account()


@pytest.fixture
def ledger_clean(app):
    """Call at the end of a test: asserts the ledger invariants hold."""
    from app.services.money import ledger

    def check():
        drain(app)  # the calls answered so far are finalized before the books are read
        with app.app_context():
            violations = ledger.check()
            db.session.remove()
        assert violations == [], [v.as_dict() for v in violations]

    return check

"""Parallel test workers (pytest-xdist, ``make test``): what each worker gets of its own.

``make test`` runs the suite in several worker processes (``pytest -n``). Every worker
owns a database and a Redis index, so one worker's per-test cleanup (every table
emptied, ``FLUSHDB``) never reaches another's data:

* database: ``<DATABASE_URL's database>_<worker>`` (``gateway_ci_gw0``, ``gateway_ci_gw1``…)
  on the same server, created when missing (the session then rebuilds its schema, as for
  ``DATABASE_URL`` itself) and kept between runs: ``DROP DATABASE`` waits for a
  checkpoint, which took 189 s on this busy shared server; with no ``DATABASE_URL`` the
  controller starts the one embedded server and every worker makes its database there;
* Redis: index ``(REDIS_URL's index + worker number) mod 16`` (``/14`` gives the two
  workers 14 and 15), so ``REDIS_URL`` should name an index whose next ones are free too.

Both are rewritten into ``DATABASE_URL`` / ``REDIS_URL`` of the worker process before any
test module is imported, so the tests and every process they start see the worker's own.
Without xdist (``pytest`` alone, a single file) nothing changes.
"""
from __future__ import annotations

import os

REDIS_DATABASES = 16  # Redis' default number of databases


def worker_id() -> str | None:
    """``gw0``, ``gw1``… inside an xdist worker; None otherwise."""
    return os.environ.get("PYTEST_XDIST_WORKER")


def database_url(url: str, worker: str) -> str:
    """``url`` with the database name suffixed by ``_<worker>`` (query, host socket kept)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return parsed.set(database=f"{parsed.database}_{worker}").render_as_string(hide_password=False)


def redis_url(url: str, worker: str) -> str:
    """``url`` moved to the worker's own Redis index."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    index = (base + int(worker.removeprefix("gw"))) % REDIS_DATABASES
    return urlunsplit(parts._replace(path=f"/{index}"))


def ensure_database(url: str) -> bool:
    """Create the database named by ``url`` unless it exists; True when it was created."""
    import psycopg
    from psycopg import errors, sql
    from sqlalchemy.engine import make_url

    target = make_url(url).set(drivername="postgresql")
    admin = target.set(database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (target.database,)).fetchone():
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(target.database)))
        except errors.DuplicateDatabase:  # made by another process meanwhile
            return False
        return True


def relax_durability(url: str) -> None:
    """The test database named by ``url`` commits without waiting for its WAL flush
    (``ALTER DATABASE … SET synchronous_commit = off``, taken by every session opened
    after it: the tests' pools and the processes they start). A commit is still atomic and
    visible at once; only a crash of the PostgreSQL server itself could lose the last
    ~0.6 s of them, which no test does (it kills backends and app processes, never the
    server). 0.5 ms a commit instead of 3-4 ms on this shared disk. A test database
    only: production keeps the server's setting (on); the hot path's statements set it
    off for their own transactions (docs/performance.md)."""
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    target = make_url(url).set(drivername="postgresql")
    with psycopg.connect(target.render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = off")
                     .format(sql.Identifier(target.database)))


def empty_database(url: str) -> None:
    """The database named by ``url``, created or emptied (its other sessions closed, its
    ``public`` schema dropped and made again): what a child process migrates from scratch.
    Not ``DROP DATABASE``, which waits for a checkpoint (minutes on a busy server)."""
    import psycopg
    from sqlalchemy.engine import make_url

    if ensure_database(url):
        return
    target = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(target, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        conn.execute("DROP SCHEMA IF EXISTS public CASCADE")
        conn.execute("CREATE SCHEMA public")

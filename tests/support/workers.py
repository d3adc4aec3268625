"""Parallel test workers (pytest-xdist, ``make test``): what each worker gets of its own.

``make test`` runs the suite in several worker processes (``pytest -n``). Every worker
owns a database and a Redis index, so one worker's per-test cleanup (TRUNCATE of every
table, ``FLUSHDB``) never reaches another's data:

* database: ``<DATABASE_URL's database>_<worker>`` (``gateway_ci_gw0``, ``gateway_ci_gw1``…)
  on the same server, created when the worker's session starts and dropped when it ends;
  with no ``DATABASE_URL`` the controller starts the one embedded server and every worker
  makes its database there;
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


def recreate_database(url: str) -> None:
    """Drop (closing its connections) and create the database named by ``url``."""
    _admin(url, "DROP DATABASE IF EXISTS {} WITH (FORCE)", "CREATE DATABASE {}")


def drop_database(url: str) -> None:
    _admin(url, "DROP DATABASE IF EXISTS {} WITH (FORCE)")


def _admin(url: str, *statements: str) -> None:
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    target = make_url(url).set(drivername="postgresql")
    admin = target.set(database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        for statement in statements:
            conn.execute(sql.SQL(statement).format(sql.Identifier(target.database)))

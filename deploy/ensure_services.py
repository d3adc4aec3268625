"""Pre-flight for `make serve`: PostgreSQL and Redis answer, and the database exists.

    python deploy/ensure_services.py DATABASE_URL REDIS_URL

Creates the database named in DATABASE_URL when it is missing (connecting to the
`postgres` maintenance database with the same credentials). Exits 1 with a clear
message when a service cannot be reached.
"""
from __future__ import annotations

import sys


def ensure_database(url: str) -> bool:
    """Create the database of ``url`` if missing; True when it was created."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    url = url.replace("postgresql+psycopg://", "postgresql://", 1)
    params = conninfo_to_dict(url)
    name = params.get("dbname")
    if not name:
        raise SystemExit(f"DATABASE_URL names no database: {url}")
    admin = make_conninfo(url, dbname="postgres", connect_timeout=5)
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists:
            return False
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return True


def check_redis(url: str) -> None:
    import redis

    redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3).ping()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    db_url, redis_url = argv[1], argv[2]
    if not db_url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        print(f"serve: DATABASE_URL must be PostgreSQL, got {db_url!r}", file=sys.stderr)
        return 1
    try:
        if ensure_database(db_url.replace("postgres://", "postgresql://", 1)):
            print(f"serve: created database {db_url.rsplit('/', 1)[-1]}")
    except Exception as exc:  # noqa: BLE001
        print(f"serve: PostgreSQL is not reachable at {db_url} ({exc})", file=sys.stderr)
        return 1
    try:
        check_redis(redis_url)
    except Exception as exc:  # noqa: BLE001
        print(f"serve: Redis is not reachable at {redis_url} ({exc})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

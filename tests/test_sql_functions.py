"""The PostgreSQL functions in the database are the .sql files (app/sqlfunctions.py):
every ``gw_`` function of the public schema has a file, every file's function is there,
and each is defined exactly as its file says (arguments, result, options, body)."""
from __future__ import annotations

import re

import pytest
from sqlalchemy import text

from app import sqlfunctions
from app.extensions import db

SCRATCH = "gw_sqlfunctions_check"


def _definitions(conn, schema: str) -> dict[str, list[str]]:
    """Function name → its definitions (pg_get_functiondef, schema name left out)."""
    rows = conn.execute(text(
        "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
        "WHERE p.pronamespace = CAST(:s AS regnamespace) AND left(p.proname, 3) = 'gw_' ORDER BY 2"),
        {"s": schema}).all()
    out: dict[str, list[str]] = {}
    for name, definition in rows:
        out.setdefault(name, []).append(definition.replace(f"FUNCTION {schema}.{name}(", f"FUNCTION {name}(", 1))
    return out


@pytest.fixture
def files_installed(app):
    """The files' functions, as PostgreSQL defines them: installed in a scratch schema,
    in a transaction rolled back afterwards."""
    with app.app_context(), db.engine.connect() as conn:
        trans = conn.begin()
        try:
            conn.execute(text(f"CREATE SCHEMA {SCRATCH}"))
            conn.execute(text(f"SET LOCAL search_path = {SCRATCH}, public"))
            dropped = sqlfunctions.install(conn)
            assert dropped == []
            yield conn, _definitions(conn, SCRATCH)
        finally:
            trans.rollback()


def test_every_function_is_its_file(files_installed):
    conn, files = files_installed
    database = _definitions(conn, "public")
    assert sorted(database) == sorted(files) == sorted(sqlfunctions.sources())
    for name, definitions in database.items():
        assert len(definitions) == 1, f"{name}: more than one signature in the database"
        assert definitions == files[name], (
            f"{name} in the database is not app/**/sql/{name}.sql: run `flask db upgrade`")


def test_a_file_edited_but_not_installed_is_caught(files_installed):
    conn, _ = files_installed
    name, source = next(iter(sqlfunctions.sources().items()))
    edited = source.replace("BEGIN\n", "BEGIN\n    -- edited\n", 1)
    assert edited != source
    with conn.connection.cursor() as cursor:  # into the scratch schema only
        cursor.execute(edited)
    assert _definitions(conn, SCRATCH)[name] != _definitions(conn, "public")[name]


def test_install_drops_the_functions_no_file_defines(app):
    """A function whose file was removed or renamed, or the old signature of a changed
    one, goes at the next install (the upgrade's)."""
    with app.app_context(), db.engine.connect() as conn:
        try:
            with conn.begin():
                conn.execute(text(f"CREATE SCHEMA {SCRATCH}"))
                conn.execute(text(f"SET LOCAL search_path = {SCRATCH}, public"))
                sqlfunctions.install(conn)
                conn.execute(text("CREATE FUNCTION gw_renamed_long_ago(n integer) RETURNS integer "
                                  "LANGUAGE sql AS 'SELECT n'"))
                conn.execute(text("CREATE FUNCTION gw_finalize_calls(n integer) RETURNS integer "
                                  "LANGUAGE sql AS 'SELECT n'"))
                conn.execute(text("CREATE FUNCTION other_function() RETURNS integer LANGUAGE sql AS 'SELECT 1'"))
            with conn.begin():
                conn.execute(text(f"SET LOCAL search_path = {SCRATCH}, public"))
                dropped = sqlfunctions.install(conn)
                left = _definitions(conn, SCRATCH)
                others = conn.execute(text("SELECT proname FROM pg_proc WHERE pronamespace = "
                                           "CAST(:s AS regnamespace) AND left(proname, 3) <> 'gw_'"),
                                      {"s": SCRATCH}).scalars().all()
        finally:
            with conn.begin():
                conn.execute(text(f"DROP SCHEMA IF EXISTS {SCRATCH} CASCADE"))
    assert dropped == ["gw_finalize_calls(integer)", "gw_renamed_long_ago(integer)"]
    assert sorted(left) == sorted(sqlfunctions.sources()) and all(len(d) == 1 for d in left.values())
    assert others == ["other_function"]


def test_every_file_says_what_it_does_then_defines_its_function():
    for path in sqlfunctions.files():
        source = path.read_text()
        header, _, rest = source.partition("CREATE OR REPLACE FUNCTION ")
        assert header.strip() and all(line.startswith("--") for line in header.strip().splitlines()), path
        assert re.match(rf"{path.stem}\(", rest), path
        assert "Called by" in header, path


def test_only_the_money_engine_posts_to_the_ledger():
    """Every posting is written by ``app/services/money/`` (``ledger.post`` → ``gw_post``,
    or an engine statement): a service elsewhere calls an engine function instead
    (``money.funding``, ``money.charging``, ``money.holds``, …), so each money rule has
    one home (docs/money.md, "Where each money rule lives")."""
    from pathlib import Path

    app_dir = Path(__file__).resolve().parents[1] / "app"
    engine = app_dir / "services" / "money"
    writers = [str(p.relative_to(app_dir)) for p in app_dir.rglob("*.py")
               if engine not in p.parents and re.search(r"\bledger\.post\(|\bgw_post\b|INSERT INTO ledger_",
                                                        p.read_text())]
    assert writers == []

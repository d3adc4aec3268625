"""Installs the engine's PostgreSQL functions from their ``.sql`` files (``sql/``)."""
from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

SQL_DIR = Path(__file__).with_name("sql")
# building blocks first: the others call them
ORDER = ("gw_spend.sql", "gw_post.sql", "gw_ledger_guard.sql")


def files() -> list[Path]:
    rest = sorted(p for p in SQL_DIR.glob("*.sql") if p.name not in ORDER)
    return [SQL_DIR / n for n in ORDER] + rest


def sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in files()}


def install(connection) -> None:
    for path in files():
        connection.execute(text(path.read_text()))

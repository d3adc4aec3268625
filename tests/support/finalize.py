"""The metered call's finalize in tests: ``drain(app)``, which waits for the app's finalize
writer (tests run the deferred finalize, as production does: a metered call is answered
before its ``succeeded`` row, receipt and stored Idempotency-Key response are written),
and the finalize statement made slower on purpose (PostgreSQL): one helper for the tests
and the fault harness that hold finalizations in flight.

``finalize_function(delay)`` is ``app/services/money/sql/gw_finalize_calls.sql`` (``CREATE
OR REPLACE FUNCTION gw_finalize_calls``) with a ``pg_sleep(delay)`` first (``None``: the
file as it is, to restore it). CREATE OR REPLACE keeps the function's OID, so prepared statements of
running processes run the new body too."""
from __future__ import annotations

from contextlib import contextmanager

from app import sqlfunctions


def drain(app, timeout: float = 10.0) -> None:
    """Wait until every call ``app`` has answered so far is finalized in the database.
    A test that reads a call's state (its ``module_calls`` row, receipt, status, the
    Idempotency-Key's record) right after the call calls this first; the charge (balance,
    ledger, the pending row) is written before the answer and needs no wait."""
    from app.services.money import charging

    assert charging.drain_finalizer(app, timeout), f"finalize writer not drained in {timeout} s"


def _definition() -> str:
    return sqlfunctions.sources()["gw_finalize_calls"]


def finalize_function(delay: float | None = None) -> str:
    body = _definition()
    if delay is None:
        return body
    slow = body.replace("BEGIN\n", f"BEGIN\n    PERFORM pg_sleep({delay});\n", 1)
    assert "pg_sleep" in slow, "gw_finalize_calls.sql changed: update tests/support/finalize.py"
    return slow


@contextmanager
def slow_finalize(app, delay: float):
    """Within the block, ``gw_finalize_calls`` of ``app``'s database takes ``delay`` s more."""
    from app.extensions import db

    with app.app_context(), db.engine.begin() as conn:
        conn.exec_driver_sql(finalize_function(delay))
    try:
        yield
    finally:
        with app.app_context(), db.engine.begin() as conn:
            conn.exec_driver_sql(finalize_function())

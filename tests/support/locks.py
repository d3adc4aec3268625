"""Waiting in a test until a statement of the test database waits for a lock, so the
interleaving the test set up has really happened."""
from __future__ import annotations

import time

from sqlalchemy import text

from app.extensions import db


def waiting_for_a_lock(fragment: str, n: int = 1, timeout: float = 10.0) -> None:
    """Return once ``n`` statements of the test database whose text contains ``fragment``
    wait for a lock (inside an app context); fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    with db.engine.connect() as c:
        while True:
            waiting = c.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE :q"), {"q": f"%{fragment}%"}).scalar_one()
            c.rollback()  # pg_stat_activity is read once per transaction
            if waiting >= n:
                return
            assert time.monotonic() < deadline, f"{waiting} of {n} statements with {fragment!r} waiting for a lock"
            time.sleep(0.005)

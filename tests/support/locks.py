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


def waits_for_the_counter_first(key_id: str, account_id: str, run, fragment: str) -> None:
    """The lock order of every money operation (docs/money.md, "Lock order"): with the
    key's spend counter (``key_spend``) held by another transaction, start ``run`` (an
    operation on that key, in a thread) and wait until its statement (text containing
    ``fragment``) waits for a lock; the account's balance row must then still be free —
    the operation takes the counter before the balance. Then let it finish. Inside an app
    context."""
    import threading

    with db.engine.connect() as other, db.engine.connect() as probe:
        other.execute(text("SELECT 1 FROM key_spend WHERE key_id = :k FOR UPDATE"), {"k": key_id})
        worker = threading.Thread(target=run)
        worker.start()
        try:
            waiting_for_a_lock(fragment)
            probe.execute(text("SET lock_timeout = '200ms'"))  # fails the test if it is taken
            probe.execute(text("SELECT 1 FROM accounts WHERE id = :a FOR UPDATE"), {"a": account_id})
            probe.rollback()
        finally:
            other.commit()
            worker.join(10)

"""``last_used_at`` flushes of several processes cannot deadlock (issue 36 item 7: three
nodes saw 5 deadlocks in 15 s, each losing that process's pending values)."""
from __future__ import annotations

import threading
import time

from sqlalchemy import text

from app import auth
from app.extensions import db
from app.models.base import utcnow


def _waiting_for_lock(app, marker: str) -> bool:
    with app.app_context(), db.engine.connect() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE :q"),
            {"q": f"%{marker}%"}).scalar())


def test_two_flushes_lock_keys_in_one_order(app, make_account):
    acct = make_account()
    with app.app_context():
        k1, k2 = sorted(db.session.execute(text("SELECT id FROM api_keys WHERE account_id = :a"),
                                           {"a": acct.id}).scalars().all()
                        + [_second_key(acct.id)])
        db.session.remove()
    errors: list[BaseException] = []
    with app.app_context(), db.engine.connect() as other:
        # another process's flush holds k1 and will want k2
        other.execute(text("SELECT id FROM api_keys WHERE id = :k FOR UPDATE"), {"k": k1})
        with auth._last_used_lock:  # this process saw k2 first, then k1
            auth._last_used.clear()
            auth._last_used[k2] = utcnow()
            auth._last_used[k1] = utcnow()

        def flush():
            try:
                with app.app_context():
                    auth.flush_last_used()
                    db.session.remove()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        t = threading.Thread(target=flush)
        t.start()
        deadline = time.monotonic() + 10
        while not _waiting_for_lock(app, "api_keys") and time.monotonic() < deadline:
            time.sleep(0.02)
        # the other flush now takes k2: with the keys locked in arrival order this process
        # would hold k2 and wait for k1 — a deadlock; in id order it holds nothing yet
        other.execute(text("SET lock_timeout = '3s'"))
        other.execute(text("UPDATE api_keys SET last_used_at = now() WHERE id = :k"), {"k": k2})
        other.commit()
        t.join(10)
    assert not t.is_alive() and errors == []
    with app.app_context():
        used = db.session.execute(text("SELECT count(*) FROM api_keys WHERE id IN (:a, :b) "
                                       "AND last_used_at IS NOT NULL"), {"a": k1, "b": k2}).scalar()
        db.session.remove()
    assert used == 2


def _second_key(account_id: str) -> str:
    from app.scopes import ALL_SCOPES
    from app.services.accounts import keys

    row, _ = keys.mint(account_id, "second", ALL_SCOPES)
    db.session.commit()
    return row.id

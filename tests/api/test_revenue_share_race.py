"""Issue 15 (revenue share with integrity), the late-refund race: a refund of a call whose
month is being settled concurrently. The settlement has locked the agent and read its
earnings balance but not yet posted; the refund runs in a second session. The refund must
wait for the settlement (it reads the earnings balance under the same lock), so the
earnings never go negative and the uncovered share becomes the carry-over — on PostgreSQL,
where the two sessions really run concurrently."""
from __future__ import annotations

import threading
import time

from sqlalchemy import text

from app.extensions import db
from app.services.money import revenue_share, settlement
from app.services.billing import money_check
from app.services.money import ledger
from app.services.gateway import calls
from tests.api.test_revenue_integrity import Charged
from tests.gateway_helpers import provider, provider_server  # noqa: F401


def _lock_waiters() -> int:
    """Backends of this database waiting for a row lock (another session's transaction)."""
    return int(db.session.execute(text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'")).scalar_one())


def test_refund_during_settlement_waits_and_leaves_a_carry_over(app, client, make_account, provider,
                                                                monkeypatch, ledger_clean):
    c = Charged(app, client, make_account, provider, "racemod")
    month, after, call_id, earn, carry = c.month, c.after, c.call_id, c.earn, c.carry

    # The settlement pauses after reading the earnings balance, before posting (inside
    # its transaction, holding the agent's lock).
    read, go = threading.Event(), threading.Event()
    real_recover = revenue_share.recover

    def paused_recover(agent_id, amount):
        read.set()
        assert go.wait(30)
        return real_recover(agent_id, amount)

    monkeypatch.setattr(revenue_share, "recover", paused_recover)
    out: dict = {}

    def settle():
        with app.app_context():
            out["settle"] = settlement.settle_month(month, now=after)
            db.session.remove()

    def refund():
        with app.app_context():
            out["refund"] = calls.refund(call_id, "swept")
            db.session.remove()

    settler = threading.Thread(target=settle)
    settler.start()
    assert read.wait(30)
    refunder = threading.Thread(target=refund)
    refunder.start()
    with app.app_context():  # until the refund has finished or waits for the settlement's lock
        for _ in range(600):
            if not refunder.is_alive() or _lock_waiters():
                break
            time.sleep(0.05)
        db.session.remove()
    go.set()
    settler.join(30)
    refunder.join(30)
    assert out["settle"]["settled"] == 1 and out["refund"] is True
    with app.app_context():
        assert ledger.balance(earn) == 0              # never negative
        assert ledger.balance(carry) == -300_000      # the refunded share, owed by the agent
        assert ledger.check() == []
        report = money_check.reconcile()
        assert report["ok"], report
        db.session.remove()
    ledger_clean()

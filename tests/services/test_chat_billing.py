"""Chat billing: hold → settle exactly once, release, cost above the hold, the stale-hold sweep."""
from __future__ import annotations

from datetime import timedelta

from app.tasks import job_paths as as_paths
import pytest
from sqlalchemy import select, update

from app.errors import PaymentRequired
from app.extensions import db
from app.models import ChatCompletion
from app.services.money import holds as chat_billing
from app.services.money import ledger
from app.services.billing import usage


def _fig(account_id):
    start, end = usage.billing_period()
    return (ledger.balance(ledger.customer(account_id)), ledger.balance(ledger.REVENUE),
            ledger.balance(chat_billing.HOLD), usage.totals(account_id, start, end))


def _settle(cid, acct_id, hold, cost):
    return chat_billing.settle(cid, acct_id, hold, cost, model="m", provider="p", prompt_tokens=1,
                               completion_tokens=1, estimated=False, attempts=1, latency_ms=5)


@pytest.fixture
def acct(app, make_account, ledger_clean):
    """An account holding 10,000 micros (1 cent), the test run in an app context; after
    it, the ledger's invariants must hold."""
    acct = make_account(cents=1)
    with app.app_context():
        yield acct
        db.session.remove()
    ledger_clean()


def test_settle_is_exact_and_happens_once(acct):
    chat_billing.hold("chatcmpl-a", acct.id, "auto", 4_000, False)
    assert _fig(acct.id)[:3] == (6_000, 0, 4_000)
    assert _settle("chatcmpl-a", acct.id, 4_000, 1_234) == 1_234
    # a second settle (a retry) writes nothing and answers what the first one charged
    assert _settle("chatcmpl-a", acct.id, 4_000, 9_999) == 1_234
    assert chat_billing.release("chatcmpl-a", error="late") is False  # and no release after it
    assert _fig(acct.id) == (8_766, 1_234, 0, {"calls": 1, "errors": 0, "spend_micros": 1_234})


def test_release_returns_everything_once(acct):
    chat_billing.hold("chatcmpl-b", acct.id, "auto", 4_000, False)
    assert chat_billing.release("chatcmpl-b", error="all failed") is True
    assert chat_billing.release("chatcmpl-b", error="again") is False
    assert _settle("chatcmpl-b", acct.id, 4_000, 100) is None
    assert _fig(acct.id) == (10_000, 0, 0, {"calls": 1, "errors": 1, "spend_micros": 0})


def test_hold_beyond_balance_is_402_and_writes_nothing(acct):
    with pytest.raises(PaymentRequired):
        chat_billing.hold("chatcmpl-c", acct.id, "auto", 10_001, False)
    assert db.session.get(ChatCompletion, "chatcmpl-c") is None
    assert _fig(acct.id)[:3] == (10_000, 0, 0)


def test_a_settle_never_charges_more_than_the_hold(acct):
    """Issue 39 item 7: what was held is the most a completion costs the customer, even with
    balance left (it charged hold + balance before); the rest is recorded as shortfall."""
    from app.models import LedgerTransaction

    chat_billing.hold("chatcmpl-d", acct.id, "auto", 4_000, False)
    assert _settle("chatcmpl-d", acct.id, 4_000, 5_000) == 4_000  # 6,000 of balance left: not taken
    assert _fig(acct.id)[:3] == (6_000, 4_000, 0)
    row = db.session.get(ChatCompletion, "chatcmpl-d")
    assert (row.status, row.cost_micros) == ("settled", 4_000)
    meta = db.session.execute(select(LedgerTransaction.meta)
                              .where(LedgerTransaction.ref == "chat_settle:chatcmpl-d")).scalar_one()
    assert meta["shortfall_micros"] == 1_000


def test_stale_holds_are_released_by_the_sweep(acct):
    from app.tasks import chat as chat_tasks
    from app.tasks.schedule import SCHEDULE

    assert ("chat-release-stale-holds", 300, "app.tasks.chat.release_stale_holds") in as_paths(SCHEDULE)
    chat_billing.hold("chatcmpl-old", acct.id, "auto", 3_000, False)   # process died after this
    chat_billing.hold("chatcmpl-new", acct.id, "auto", 2_000, False)   # still in flight
    db.session.execute(update(ChatCompletion).where(ChatCompletion.id == "chatcmpl-old")
                       .values(created_at=db.session.get(ChatCompletion, "chatcmpl-old").created_at
                               - timedelta(hours=1)))
    db.session.commit()
    assert chat_tasks.release_stale_holds() == 1
    assert chat_tasks.release_stale_holds() == 0
    statuses = dict(db.session.execute(select(ChatCompletion.id, ChatCompletion.status)).all())
    assert statuses == {"chatcmpl-old": "released", "chatcmpl-new": "held"}
    assert _fig(acct.id)[:3] == (8_000, 0, 2_000)
    assert _settle("chatcmpl-old", acct.id, 3_000, 100) is None  # a late settle cannot charge

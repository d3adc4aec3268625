"""Ledger invariants: balanced postings, conditional debits, the check command."""
from __future__ import annotations


import pytest
from sqlalchemy import text

from app.extensions import db
from app.models import Account
from app.services.money import ledger
from tests.support.concurrency import at_once


def test_promo_grant_is_a_balanced_posting(app, account, ledger_clean):
    with app.app_context():
        assert db.session.get(Account, account.id).balance_micros == 1000 * 10_000
        assert ledger.balance(ledger.customer(account.id)) == 10_000_000
        assert ledger.balance(ledger.PROMO) == -10_000_000
    ledger_clean()


def test_unbalanced_posting_refused(app, account):
    with app.app_context():
        with pytest.raises(ledger.UnbalancedPosting):
            ledger.post("bad", [(ledger.customer(account.id), 5), (ledger.REVENUE, -4)])
        db.session.rollback()


def test_overdraft_refused_and_nothing_written(app, account, ledger_clean):
    with app.app_context():
        with pytest.raises(ledger.InsufficientFunds):
            ledger.post("charge", [(ledger.customer(account.id), -10_000_001), (ledger.REVENUE, 10_000_001)])
        db.session.rollback()
        assert db.session.get(Account, account.id).balance_micros == 10_000_000
    ledger_clean()


def test_concurrent_debits_never_overdraw(app, make_account, ledger_clean):
    acct = make_account(cents=20)

    def spend() -> bool:
        with app.app_context():
            try:
                ledger.post("charge", [(ledger.customer(acct.id), -10_000), (ledger.REVENUE, 10_000)])
                db.session.commit()
                return True
            except ledger.InsufficientFunds:
                db.session.rollback()
                return False
            finally:
                db.session.remove()

    results = at_once(40, spend)
    assert results.count(True) == 20 and results.count(False) == 20
    with app.app_context():
        assert db.session.get(Account, acct.id).balance_micros == 0
    ledger_clean()


def test_check_detects_tampering(app, account):
    with app.app_context():
        db.session.execute(text("UPDATE accounts SET balance_micros = balance_micros + 1 WHERE id = :i"),
                           {"i": account.id})
        db.session.commit()
        rules = {v.rule for v in ledger.check()}
        assert "cached_balance_matches" in rules
        # The database refuses to edit the ledger (append-only); an operator who turns the
        # guard off on purpose is still caught by the check.
        db.session.execute(text("ALTER TABLE ledger_entries DISABLE TRIGGER USER"))
        try:
            db.session.execute(text("UPDATE ledger_entries SET amount_micros = amount_micros + 7 "
                                    "WHERE ledger_account = :c"), {"c": ledger.customer(account.id)})
        finally:
            db.session.execute(text("ALTER TABLE ledger_entries ENABLE TRIGGER USER"))
        db.session.commit()
        rules = {v.rule for v in ledger.check()}
        assert {"entries_sum_to_zero", "transaction_balanced"} <= rules


def test_ref_makes_posting_idempotent(app, account):
    from sqlalchemy.exc import IntegrityError

    with app.app_context():
        legs = [(ledger.external("card"), -500), (ledger.customer(account.id), 500)]
        ledger.post("deposit", legs, ref="evt_1")
        db.session.commit()
        with pytest.raises(IntegrityError):
            ledger.post("deposit", legs, ref="evt_1")
            db.session.flush()
        db.session.rollback()
        assert ledger.already_posted("evt_1")
        assert ledger.balance(ledger.customer(account.id)) == 10_000_500

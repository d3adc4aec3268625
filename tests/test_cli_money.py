"""``flask money reconcile`` (issue 15): clean after real traffic on every rail; non-zero
with a JSON report on a stuck x402 authorization, a credit missing from the ledger, a stuck
chat hold."""
from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import insert, update

from app.extensions import db
from app.models import ChatCompletion, X402Authorization
from app.models.base import utcnow
from app.services.money import outside
from app.services.money import holds, ledger


def _run(app):
    res = app.test_cli_runner().invoke(args=["money", "reconcile"])
    return res.exit_code, json.loads(res.output)


def test_clean_then_each_dirty_state_reported(app, make_account):
    acct = make_account(cents=500)  # a promo/operator grant: ledger only
    with app.app_context():
        outside.record("stripe:pi_ok", rail="stripe", account_id=acct.id, amount_micros=70_000, ledger_ref="pay:ok")
        ledger.post("payment", [(ledger.external("card"), -70_000), (ledger.customer(acct.id), 70_000)],
                    ref="pay:ok", account_id=acct.id)
        db.session.commit()
        holds.hold("chatcmpl-live", acct.id, "m", 1_000, stream=True)
    code, report = _run(app)
    assert code == 0 and report["ok"] and report["problems"] == [], report
    assert report["checked"]["external_credits"] == 1 and report["checked"]["open_hold_micros"] == 1_000

    old = utcnow() - timedelta(days=1)
    with app.app_context():
        outside.record("chain:base:0xabc:0", rail="chain", account_id=acct.id, amount_micros=5, ledger_ref="usdc:x")
        db.session.execute(insert(X402Authorization).values(
            id="x4a_stuck", auth_key="base:0xp:0xn", account_id=acct.id, network="base", payer="0xp",
            value_atomic=10, status="reserved", created_at=old))
        db.session.execute(update(ChatCompletion).where(ChatCompletion.id == "chatcmpl-live").values(created_at=old))
        db.session.commit()
    code, report = _run(app)
    assert code == 1 and not report["ok"]
    assert {p["check"] for p in report["problems"]} == {"external_credit_unposted", "x402_stuck", "chat_hold_stuck"}


def test_resolve_x402_runs_the_reconciliation_job_now(app, make_account, monkeypatch):
    """``flask money resolve-x402``: a reserved authorization that was never settled (no
    facilitator, no payload: nothing moved) is released at once, and no longer stuck."""
    acct = make_account(cents=0)
    with app.app_context():
        db.session.execute(insert(X402Authorization).values(
            id="x4a_left", auth_key="base:0xq:0xm", account_id=acct.id, network="base", payer="0xq",
            value_atomic=10, status="reserved", created_at=utcnow()))
        db.session.commit()
    monkeypatch.setitem(app.config, "X402_FACILITATOR_URL", None)
    res = app.test_cli_runner().invoke(args=["money", "resolve-x402", "--older-than", "0"])
    assert res.exit_code == 0 and json.loads(res.output) == {"booked": 0, "released": 1, "pending": 0,
                                                             "already": 0}
    code, report = _run(app)
    assert code == 0 and report["ok"], report


def test_resolve_x402_without_a_facilitator_says_what_to_set(app, make_account, monkeypatch):
    """Run in another shell than the service, ``flask money resolve-x402`` had no
    X402_FACILITATOR_URL, left every live authorization reserved and said only
    ``"pending": 1``, exit 0. It now says what to set and exits 1; nothing changed."""
    acct = make_account(cents=0)
    with app.app_context():
        db.session.execute(insert(X402Authorization).values(
            id="x4a_nofac", auth_key="base:0xr:0xo", account_id=acct.id, network="base", payer="0xr",
            value_atomic=10, status="reserved", payload={"x402Version": 2}, created_at=utcnow() - timedelta(hours=1)))
        db.session.commit()
    monkeypatch.setitem(app.config, "X402_FACILITATOR_URL", None)
    monkeypatch.setitem(app.config, "RPC_URLS", {"base": None, "ethereum": None, "polygon": None, "solana": None})
    res = app.test_cli_runner().invoke(args=["money", "resolve-x402", "--older-than", "0"])
    assert res.exit_code == 1, res.output
    assert "X402_FACILITATOR_URL" in res.output and "instance/run-local.env" in res.output
    with app.app_context():
        assert db.session.get(X402Authorization, "x4a_nofac").status == "reserved"
        db.session.execute(update(X402Authorization).where(X402Authorization.id == "x4a_nofac")
                           .values(status="released"))
        db.session.commit()

"""Disabling an agent that set a payout destination with its own credential: what its
modules earn afterwards, and what was owed to that destination, go back to the owner like
the rest of its money — not to the destination of whoever held the agent's key."""
from __future__ import annotations

from datetime import timedelta, timezone

from app.extensions import db
from app.models import Payout, PayoutDestination
from app.models.base import utcnow
from app.services.billing import payouts
from app.services.money import ledger, settlement
from app.tasks.agents import return_disabled_balances
from tests.agentkit import Keypair, register, session_headers
from tests.gateway_helpers import call, create_module, provider, provider_server  # noqa: F401


def test_a_disabled_agents_earnings_reach_its_owner_not_its_payout_destination(
        app, client, make_account, provider, monkeypatch, ledger_clean):
    monkeypatch.setitem(app.config, "PAYOUT_MINIMUM_CENTS", 30)
    owner, payer = make_account(cents=0), make_account(cents=5000)
    kp = Keypair()
    agent = register(client, owner, kp, name="seller-bot").get_json()
    create_module(app, "leakmod", provider, {"ok": (100, "/ok")}, owner_agent_id=agent["id"])
    r = client.put("/api/payouts/destination/stripe_connect", headers=session_headers(client, kp),
                   json={"account": "acct_leakedOK01"})
    assert r.status_code == 200, r.get_json()
    assert call(client, payer, {"action": "ok"}, slug="leakmod").status_code == 200
    with app.app_context():  # an earlier month's settlement still owed to the destination
        ledger.post("test_owed", [("adjust:test", -200_000), (ledger.payable(agent["account_id"]), 200_000)])
        db.session.commit()
        db.session.remove()
    assert client.delete(f"/api/agent/{agent['id']}", headers=owner.headers).status_code == 200
    assert call(client, payer, {"action": "ok"}, slug="leakmod").status_code == 200   # its module still earns
    now = utcnow()
    after = (now.replace(day=1) + timedelta(days=32)).replace(day=1, hour=2, tzinfo=timezone.utc)
    with app.app_context():
        assert settlement.settle_month(f"{now.year:04d}-{now.month:02d}", now=after)["settled"] == 1
        assert payouts.run()["sent"] == 0                      # nothing paid to the agent's destination
        return_disabled_balances()
        assert db.session.query(Payout).filter_by(account_id=agent["account_id"]).count() == 0
        assert db.session.query(PayoutDestination).filter_by(account_id=agent["account_id"]).count() == 0
        assert ledger.balance(ledger.payable(agent["account_id"])) == 0
        assert ledger.cached_balance(agent["account_id"]) == 0
        assert ledger.cached_balance(owner.id) == 800_000        # 20 owed + 2 × 30 cents, back with the owner
        db.session.remove()
    ledger_clean()

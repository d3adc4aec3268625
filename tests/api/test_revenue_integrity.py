"""Issue 15 (revenue share with integrity): the owner's side never accrues a share of its
own module's calls; a refund after the month was settled becomes a recoverable negative
carry-over, never a negative earnings balance; the ledger stays clean."""
from __future__ import annotations

from datetime import timedelta, timezone

from app.extensions import db
from app.models.base import utcnow
from app.services.accounts import keys
from app.services.money import settlement
from app.services.money import ledger
from app.services.gateway import calls, catalog
from app.scopes import ALL_SCOPES
from standardwebhooks import Webhook

from tests.agentkit import Keypair, register
from tests.support.standin import recorder
from tests.gateway_helpers import call, create_module, provider, provider_server  # noqa: F401


class _Key:
    def __init__(self, key):
        self.key = key


def _agent_key(app, agent_account_id, cents=100):
    with app.app_context():
        ledger.post("test_grant", [("adjust:test", -cents * 10_000), (ledger.customer(agent_account_id), cents * 10_000)])
        secret = keys.mint(agent_account_id, "agent-key", ALL_SCOPES)[1]
        db.session.commit()
        db.session.remove()
    return _Key(secret)


def test_owner_and_its_agents_accrue_no_share(app, client, make_account, provider, ledger_clean):
    owner = make_account(cents=100)
    agent = register(client, owner, Keypair(), name="seller").get_json()
    sibling = register(client, owner, Keypair(), name="sibling").get_json()
    create_module(app, "selfmod", provider, {"ok": (10, "/ok")}, owner_agent_id=agent["id"])
    callers = [owner, _agent_key(app, agent["account_id"]), _agent_key(app, sibling["account_id"])]
    for who in callers:
        assert call(client, who, {"action": "ok"}, slug="selfmod").status_code == 200
    with app.app_context():
        assert ledger.balance(ledger.earnings(agent["id"])) == 0
        assert ledger.balance(ledger.REVENUE) == 3 * 100_000
        db.session.remove()
    stranger = make_account(cents=100)
    assert call(client, stranger, {"action": "ok"}, slug="selfmod").status_code == 200
    with app.app_context():
        assert ledger.balance(ledger.earnings(agent["id"])) == 30_000   # 30% of a stranger's call
        db.session.remove()
    ledger_clean()


class Charged:
    """A 1-USD call to a module of agent ``agent`` by ``payer``, still pending (refundable),
    in the current ``month``, which can be settled ``after``."""

    def __init__(self, app, client, make_account, provider, slug, webhook=None):
        self.owner, self.payer = make_account(), make_account(cents=1000)
        self.agent = register(client, self.owner, Keypair(), name="seller", webhook=webhook).get_json()
        create_module(app, slug, provider, {"ok": (100, "/ok")}, owner_agent_id=self.agent["id"])
        self.earn, self.carry = ledger.earnings(self.agent["id"]), ledger.carry(self.agent["id"])
        now = utcnow()
        self.month = f"{now.year:04d}-{now.month:02d}"
        self.after = (now.replace(day=1) + timedelta(days=32)).replace(day=1, hour=2, tzinfo=timezone.utc)
        with app.app_context():
            self.mod = catalog.get_module(slug)
            self.call_id = self.call()
            assert ledger.balance(self.earn) == 300_000
            db.session.remove()

    def call(self) -> str:
        return calls.open_call(account_id=self.payer.id, mode="live", mod=self.mod,
                               act=catalog.get_action(self.mod, "ok"), body={"action": "ok"})


def test_refund_after_settlement_is_a_negative_carry_over(app, client, make_account, provider, ledger_clean):
    c = Charged(app, client, make_account, provider, "latemod")
    agent, earn, carry, month, after, call_id = c.agent, c.earn, c.carry, c.month, c.after, c.call_id
    with app.app_context():
        assert settlement.settle_month(month, now=after)["settled"] == 1
        assert calls.refund(call_id, "swept") is True           # the call failed after settlement
        assert ledger.balance(earn) == 0                         # never negative
        assert ledger.balance(carry) == -300_000                 # owed by the agent
        assert ledger.check() == []
        # The next earnings repay the carry-over first (the next month's settlement takes
        # what accrued since the last one).
        c.call()
        agent_acct = agent["account_id"]
        before = ledger.cached_balance(agent_acct)
        later = (after + timedelta(days=32)).replace(day=1, hour=2)
        nxt = f"{after.year:04d}-{after.month:02d}"
        assert settlement.settle_month(nxt, now=later)["settled"] == 1
        assert ledger.balance(carry) == 0
        assert ledger.cached_balance(agent_acct) == before       # 300,000 settled, all repaid the carry
        db.session.remove()
    ledger_clean()


def test_earnings_after_a_late_refund_show_what_reached_the_agent(app, client, make_account, provider,
                                                                   ledger_clean):
    """GET /api/agent/{id}/earnings: ``settled`` is what reached the agent's balance, and
    ``lifetime`` the shares of its calls net of refunds: a refund after settlement (carried
    over, then repaid by the next settlement) is not counted as earned and settled."""
    c = Charged(app, client, make_account, provider, "latesee")
    url = f"/api/agent/{c.agent['id']}/earnings"
    with app.app_context():
        assert settlement.settle_month(c.month, now=c.after)["settled"] == 1
        assert calls.refund(c.call_id, "swept") is True          # 30 cents carried over
        db.session.remove()
    body = client.get(url, headers=c.owner.headers).get_json()
    assert (body["accrued_micros"], body["settled_micros"]) == (-300_000, 300_000)
    assert body["lifetime_cents"] == 0                           # its only call was refunded
    with app.app_context():
        c.call()                                                 # 30 cents more, repaying the carry-over
        later = (c.after + timedelta(days=32)).replace(day=1, hour=2)
        assert settlement.settle_month(f"{c.after.year:04d}-{c.after.month:02d}", now=later)["settled"] == 1
        db.session.remove()
    body = client.get(url, headers=c.owner.headers).get_json()
    # 30 cents reached the agent's balance (the first settlement); the second repaid the carry-over
    assert (body["accrued_cents"], body["settled_cents"], body["lifetime_cents"]) == (0, 30, 30)
    assert (body["accrued_micros"], body["settled_micros"]) == (0, 300_000)
    ledger_clean()


def test_statements_after_a_late_refund_show_what_reached_the_agent(app, client, make_account, provider,
                                                                     ledger_clean):
    """A monthly statement (the earnings' ``settlements`` and the ``settlement.completed``
    event) says what reached the agent's balance: a settlement that repaid a carry-over
    (a refund after the previous month was settled) shows that part apart, not as paid,
    so the statements add up to ``settled``."""
    rec = recorder([200])
    with rec as url:
        c = Charged(app, client, make_account, provider, "latestmt", webhook=url + "/agent")
        with app.app_context():
            assert settlement.settle_month(c.month, now=c.after)["settled"] == 1
            assert calls.refund(c.call_id, "swept") is True      # 30 cents carried over
            c.call()                                             # 30 cents more: repays it
            later = (c.after + timedelta(days=32)).replace(day=1, hour=2)
            summary = settlement.settle_month(f"{c.after.year:04d}-{c.after.month:02d}", now=later)
            (run,) = summary["agents"]                      # the operator's (flask settle) view
            assert (summary["settled"], summary["total_cents"]) == (1, 0)
            assert (run["amount_cents"], run["earned_cents"], run["carry_over_repaid_cents"]) == (0, 30, 30)
            db.session.remove()
    body = client.get(f"/api/agent/{c.agent['id']}/earnings", headers=c.owner.headers).get_json()
    newest, first = body["settlements"]
    got = [(s["amount_cents"], s["earned_cents"], s["carry_over_repaid_cents"]) for s in (first, newest)]
    assert got == [(30, 30, 0), (0, 30, 30)]
    assert (newest["amount_micros"], newest["earned_micros"], newest["carry_over_repaid_micros"]) == \
        (0, 300_000, 300_000)
    assert sum(s["amount_micros"] for s in body["settlements"]) == body["settled_micros"] == 300_000
    events = [Webhook(c.agent["webhook_secret"]).verify(r.body, {k.lower(): v for k, v in r.headers.items()})
              for r in rec.requests]
    assert [(e["data"]["amount_cents"], e["data"]["earned_cents"], e["data"]["carry_over_repaid_cents"])
            for e in events if e["type"] == "settlement.completed"] == [(30, 30, 0), (0, 30, 30)]
    ledger_clean()


def test_leaderboard_counts_a_late_refund_against_the_week(app, client, make_account, provider, ledger_clean):
    """A refund after the month was settled takes the share back from the carry-over, not
    from ``earnings:``; it still counts against the week's leaderboard earnings, as any
    refund does (a week spanning a month's end: call, settlement, refund)."""
    c = Charged(app, client, make_account, provider, "lateboard")
    from app.services.agents import earnings

    with app.app_context():
        assert [e["earnings_cents"] for e in earnings.leaderboard(100)["entries"]
                if e["agent_id"] == c.agent["id"]] == [30]
        assert settlement.settle_month(c.month, now=c.after)["settled"] == 1
        assert calls.refund(c.call_id, "swept") is True
        assert ledger.balance(c.carry) == -300_000
        assert [e for e in earnings.leaderboard(100)["entries"] if e["agent_id"] == c.agent["id"]] == []
        db.session.remove()
    ledger_clean()

"""Issue 41 "Done when", tried as a new user would: a person signs up, pays a 20 USD sandbox
checkout saving the card, sets auto top-up at 5 USD → 20 USD and spends below 5 USD with
16 concurrent metered calls: exactly one top-up, the balance right, the history shows it,
its invoice PDF downloads and shows the amount. The two modules called are owned by an
agent and by a plain account, paid out at month end (the scheduler's settlement job) to a
Stripe Connect sandbox destination and to a USDC address (the chain stand-in) once; a
second settlement run pays nothing more, and the money reconciliation is clean."""
from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

from pypdf import PdfReader

from app.extensions import db
from app.scopes import ALL_SCOPES
from app.services.accounts import accounts, keys
from app.services.billing import money_check
from app.services.gateway import catalog
from app.services.money import settlement
from app.tasks.schedule import SCHEDULE
from tests.agentkit import Keypair, register
from tests.api.test_payouts import AGENT_ADDR, _month, node  # noqa: F401
from tests.gateway_helpers import balance_cents, create_module, provider, provider_server  # noqa: F401
from tests.orgkit import h
from tests.publichelpers import smtp, token_in
from tests.support.finalize import drain

PRICE = 180  # cents a call: 16 calls take 30 USD (20 paid + 10 free credit) under 5 USD
JOBS = {name: job for name, _, job in SCHEDULE}


class _Who:
    def __init__(self, account_id, key):
        self.id, self.headers = account_id, h(key)


def _sign_up(app, client, email) -> _Who:
    with smtp(app) as sink:
        assert client.post("/api/signup", json={"email": email}).status_code == 202
        token = token_in(sink.messages[0])
    r = client.post("/api/signup/confirm", json={"token": token})
    assert r.status_code == 201, r.get_json()
    return _Who(r.get_json()["account"]["id"], r.get_json()["key"]["key"])


def _job(app, name):
    """One run of a scheduled job, as the scheduler's worker runs it."""
    with app.app_context():
        out = JOBS[name]()
        db.session.remove()
    return out


def test_a_new_user_gets_one_top_up_and_module_owners_are_paid_out_once(app, client, make_account, provider,
                                                                      node, monkeypatch, ledger_clean):
    # Two modules: one owned by a plain account, one by an agent (of another person).
    seller = make_account(cents=0)
    create_module(app, "pricey", provider, {"ok": (PRICE, "/ok", 30.0)})
    human = make_account()
    agent = register(client, human, Keypair(), name="seller-bot").get_json()
    create_module(app, "botmod", provider, {"ok": (PRICE, "/ok", 30.0)}, owner_agent_id=agent["id"])
    with app.app_context():
        catalog.set_owner_account("pricey", seller.id)
        bot = _Who(agent["account_id"], keys.mint(agent["account_id"], "agent-key", ALL_SCOPES)[1])
        db.session.commit()
        db.session.remove()

    user = _sign_up(app, client, "new.buyer@example.com")
    with app.app_context():  # a 16-call job wants more than the starter plan's 10 calls a second
        accounts.set_plan(user.id, "pro")
        db.session.remove()
    r = client.post("/api/pay/checkout", json={"amount_cents": 2000, "save_method": True}, headers=user.headers)
    assert r.status_code == 200, r.get_json()
    page = urlparse(r.get_json()["url"]).path
    assert b"succeeded" in client.post(page, data={"action": "pay", "payment_method": "pm_card_visa"}).data
    methods = client.get("/api/pay/methods", headers=user.headers).get_json()["methods"]
    assert [(m["payment_method_id"], m["last4"], m["default"]) for m in methods] == [("pm_card_visa", "4242", True)]
    assert balance_cents(app, user.id) == 3000
    r = client.put("/api/pay/auto-topup", headers=user.headers,
                   json={"threshold_cents": 500, "amount_cents": 2000, "monthly_cap_cents": 10_000})
    assert r.status_code == 200 and r.get_json()["method"]["last4"] == "4242"

    def one(i):
        slug = ("pricey", "botmod")[i % 2]
        return slug, app.test_client().post(f"/v1/module/{slug}/call", json={"action": "ok"},
                                            headers=user.headers).status_code

    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(one, range(16)))
    drain(app)
    ok = {slug: sum(1 for s, code in outcomes if s == slug and code == 200) for slug in ("pricey", "botmod")}
    assert {code for _, code in outcomes} <= {200, 502} and sum(ok.values()) >= 14, outcomes  # 502: refunded
    left = 3000 - PRICE * sum(ok.values())
    assert balance_cents(app, user.id) == left < 500
    assert _job(app, "autotopup-start") == 1
    assert _job(app, "autotopup-start") == 0  # one crossing, one top-up
    assert balance_cents(app, user.id) == left + 2000
    hist = client.get("/api/pay/history", headers=user.headers).get_json()["payments"]
    assert [(p["product"], p["kind"], p["amount_cents"], p["status"]) for p in hist] == [
        ("Auto top-up", "charge", 2000, "succeeded"), (None, "checkout", 2000, "succeeded")]
    topup = hist[0]["id"]
    [inv] = [i for i in client.get("/api/pay/invoices", headers=user.headers).get_json()["invoices"]
             if i["payment_id"] == topup]
    assert inv["total"] == "20.00"
    pdf = client.get(f"/api/pay/invoices/{inv['id']}", headers={**user.headers, "Accept": "application/pdf"})
    assert pdf.status_code == 200 and pdf.mimetype == "application/pdf"
    text = "".join(p.extract_text() for p in PdfReader(io.BytesIO(pdf.data)).pages)
    assert inv["number"] in text and "20.00" in text

    # Month end: the owners connect destinations, the scheduler settles and pays out.
    monkeypatch.setitem(app.config, "PAYOUT_MINIMUM_CENTS", 100)  # the operator's minimum
    r = client.put("/api/payouts/destination/stripe_connect", json={"account": "acct_sellerOK01"},
                   headers=seller.headers)
    assert r.status_code == 200, r.get_json()
    r = client.put("/api/payouts/destination/usdc", json={"chain": "base", "address": AGENT_ADDR},
                   headers=bot.headers)
    assert r.status_code == 200, r.get_json()
    month, after = _month()
    monkeypatch.setattr(settlement, "utcnow", lambda: after)  # the clock the job reads: past month end
    assert _job(app, "agent-settlement")["month"] == month
    earned = {who: PRICE * ok[slug] * 30 // 100 for who, slug in (("seller", "pricey"), ("bot", "botmod"))}
    for who, acct, kind in (("seller", seller, "stripe_connect"), ("bot", bot, "usdc")):
        got = client.get("/api/payouts", headers=acct.headers).get_json()
        assert [(p["status"], p["amount_cents"], p["kind"]) for p in got["payouts"]] == \
            [("paid", earned[who], kind)], who
        assert got["owed_cents"] == 0
    assert client.get("/api/payouts", headers=seller.headers).get_json()["payouts"][0]["processor_ref"] \
        .startswith("tr_sbx_")
    assert node.balances[AGENT_ADDR.lower()] == earned["bot"] * 10_000 and len(node.sent) == 1
    # a second settlement run (and payout run) pays nothing more
    again = _job(app, "agent-settlement")
    assert again["settled"] == 0 and again["already_settled"] >= 2
    assert _job(app, "payouts") == {"opened": 0, "sent": 0, "outcomes": {}}
    for acct in (seller, bot):
        assert len(client.get("/api/payouts", headers=acct.headers).get_json()["payouts"]) == 1
    assert len(node.sent) == 1
    with app.app_context():
        report = money_check.reconcile()
        db.session.remove()
    assert report["ok"], report["problems"]
    ledger_clean()

"""Issue 41 items 4 and 5: module owners beyond agents, and payouts as money.

An agent and a plain account own modules; a stranger's calls accrue their 30 %; at month
end the settlement pays it out to their sandbox (or Stripe stand-in) destination once,
with one ledger posting per payout and `flask money reconcile` clean. A failed payout
stays owed and is paid once on retry; below the minimum it carries over; a worker dying
between the processor's answer and the booking neither pays twice nor loses the money."""
from __future__ import annotations

from datetime import timedelta, timezone

import pytest

from app.extensions import db
from app.models import LedgerTransaction, Payout
from app.models.base import utcnow
from app.scopes import ALL_SCOPES
from app.services.accounts import keys
from app.services.billing import money_check, payouts
from app.services.gateway import catalog
from app.services.money import ledger, settlement
from tests.agentkit import Keypair, register
from tests.api.test_keys_limits import _key
from tests.gateway_helpers import call, create_module, provider, provider_server  # noqa: F401
from tests.standins import chain_server, stripe_server, use_chain


class _Key:
    def __init__(self, account_id, key):
        self.id, self.key = account_id, key


def _h(who, **extra):
    return {"Authorization": f"Bearer {who.key}", **extra}


def _month():
    now = utcnow()
    after = (now.replace(day=1) + timedelta(days=32)).replace(day=1, hour=2, tzinfo=timezone.utc)
    return f"{now.year:04d}-{now.month:02d}", after


class Owners:
    """A plain account owning catalog module ``acctmod`` and an agent owning ``agentmod``;
    a stranger called each ``calls`` times at 100 cents (30 cents each accrue)."""

    def __init__(self, app, client, make_account, provider, calls=5):
        self.app, self.client = app, client
        self.seller = make_account(cents=0)
        create_module(app, "acctmod", provider, {"ok": (100, "/ok")})
        with app.app_context():
            catalog.set_owner_account("acctmod", self.seller.id)
            db.session.remove()
        human = make_account()
        agent = register(client, human, Keypair(), name="seller-bot").get_json()
        self.agent_id = agent["id"]
        create_module(app, "agentmod", provider, {"ok": (100, "/ok")}, owner_agent_id=agent["id"])
        with app.app_context():
            self.agent = _Key(agent["account_id"], keys.mint(agent["account_id"], "agent-key", ALL_SCOPES)[1])
            db.session.commit()
            db.session.remove()
        self.payer = make_account(cents=5000)
        for _ in range(calls):
            for slug in ("acctmod", "agentmod"):
                assert call(client, self.payer, {"action": "ok"}, slug=slug).status_code == 200
        self.month, self.after = _month()

    def connect(self, who, account="acct_sellerOK01"):
        r = self.client.put("/api/payouts/destination/stripe_connect", headers=_h(who), json={"account": account})
        assert r.status_code == 200, r.get_json()
        return r.get_json()

    def settle_and_pay(self):
        with self.app.app_context():
            out = settlement.settle_month(self.month, now=self.after)
            ran = payouts.run()
            db.session.remove()
        return out, ran

    def payouts_of(self, who):
        r = self.client.get("/api/payouts", headers=_h(who))
        assert r.status_code == 200, r.get_json()
        return r.get_json()


def _reconcile(app):
    with app.app_context():
        report = money_check.reconcile()
        db.session.remove()
    assert report["ok"], report["problems"]
    return report


def _postings(app, kind="payout"):
    with app.app_context():
        refs = [r for (r,) in db.session.query(LedgerTransaction.ref).filter_by(kind=kind)]
        db.session.remove()
    return refs


@pytest.fixture
def low_minimum(app, monkeypatch):
    monkeypatch.setitem(app.config, "PAYOUT_MINIMUM_CENTS", 30)


def test_agent_and_account_owners_are_paid_out_once(app, client, make_account, provider, low_minimum,
                                                    ledger_clean):
    o = Owners(app, client, make_account, provider)
    earned = client.get("/api/earnings", headers=_h(o.seller)).get_json()
    assert earned["accrued_cents"] == 150 and earned["owed_cents"] == 0
    o.connect(o.seller)
    o.connect(o.agent, "acct_agentOK001")
    agent_balance = client.get("/api/account", headers=_h(o.agent)).get_json()["balance_cents"]
    out, ran = o.settle_and_pay()
    assert out["settled"] == 2 and ran["outcomes"] == {"paid": 2}
    for who, dest in ((o.seller, "acct_sellerOK01"), (o.agent, "acct_agentOK001")):
        got = o.payouts_of(who)
        assert [(p["status"], p["amount_cents"], p["destination"]) for p in got["payouts"]] == \
            [("paid", 150, dest)]
        assert got["payouts"][0]["processor_ref"].startswith("tr_sbx_") and got["owed_cents"] == 0
    # the earnings went out as money, not into the balance
    assert client.get("/api/account", headers=_h(o.agent)).get_json()["balance_cents"] == agent_balance
    earned = client.get("/api/earnings", headers=_h(o.seller)).get_json()
    assert (earned["accrued_cents"], earned["settled_cents"], earned["owed_cents"]) == (0, 150, 0)
    assert [s["amount_cents"] for s in earned["settlements"]] == [150]
    # a replayed settlement run and payout run pay nothing twice
    out, ran = o.settle_and_pay()
    assert out["settled"] == 0 and ran == {"opened": 0, "sent": 0, "outcomes": {}}
    assert len(_postings(app)) == 2 and len(o.payouts_of(o.seller)["payouts"]) == 1
    _reconcile(app)
    ledger_clean()


def test_failed_payout_stays_owed_and_is_paid_once_on_retry(app, client, make_account, provider, low_minimum,
                                                            monkeypatch, ledger_clean):
    o = Owners(app, client, make_account, provider, calls=2)
    o.connect(o.seller, "acct_willfail01")
    o.settle_and_pay()
    got = o.payouts_of(o.seller)
    assert [(p["status"], p["failure_code"], p["attempts"]) for p in got["payouts"]] == \
        [("failed", "account_invalid", 1)]
    assert got["owed_cents"] == 60 and _postings(app) == []
    _reconcile(app)
    # not due yet: the next run leaves it; after the retry delay it is tried again
    with app.app_context():
        assert payouts.run()["sent"] == 0
        db.session.remove()
    o.connect(o.seller, "acct_fixed0001")   # the owner fixes the destination: retried at the next run
    with app.app_context():
        assert payouts.run()["outcomes"] == {"paid": 1}
        assert payouts.run()["sent"] == 0
        db.session.remove()
    got = o.payouts_of(o.seller)
    assert [(p["status"], p["amount_cents"], p["attempts"], p["destination"]) for p in got["payouts"]] == \
        [("paid", 60, 2, "acct_fixed0001")]
    assert got["owed_cents"] == 0 and len(_postings(app)) == 1
    _reconcile(app)
    ledger_clean()


@pytest.fixture
def below_minimum(app, client, make_account, provider, monkeypatch):
    """A seller with a connected destination, 30 cents settled and owed under a 10-dollar
    payout minimum: ``(owners, settlement run, payout run)``."""
    monkeypatch.setitem(app.config, "PAYOUT_MINIMUM_CENTS", 1000)
    o = Owners(app, client, make_account, provider, calls=1)
    o.connect(o.seller)
    return (o, *o.settle_and_pay())


def test_below_minimum_nothing_is_paid_and_it_carries_over(app, client, below_minimum, monkeypatch, ledger_clean):
    o, out, ran = below_minimum
    assert out["settled"] == 2 and ran["opened"] == 0
    got = o.payouts_of(o.seller)
    assert got["payouts"] == [] and got["owed_cents"] == 30 and got["minimum_cents"] == 1000
    r = client.post("/api/payouts", headers=_h(o.seller))
    assert r.status_code == 409 and r.get_json()["error"] == "below_payout_minimum"
    monkeypatch.setitem(app.config, "PAYOUT_MINIMUM_CENTS", 30)   # it carried over; now it is enough
    r = client.post("/api/payouts", headers=_h(o.seller, **{"Idempotency-Key": "po-1"}))
    assert r.status_code == 200 and r.get_json()["status"] == "paid" and r.get_json()["amount_cents"] == 30
    again = client.post("/api/payouts", headers=_h(o.seller, **{"Idempotency-Key": "po-1"}))
    assert again.status_code == 200 and again.get_json() == r.get_json()
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert len(_postings(app)) == 1
    _reconcile(app)
    ledger_clean()


def test_removing_the_destination_keeps_earnings_as_balance(app, client, below_minimum, ledger_clean):
    o = below_minimum[0]
    before = client.get("/api/account", headers=_h(o.seller)).get_json()["balance_cents"]
    r = client.delete("/api/payouts/destination", headers=_h(o.seller))
    assert r.status_code == 200 and r.get_json() == {"kind": None, "moved_to_balance_cents": 30}
    assert client.get("/api/account", headers=_h(o.seller)).get_json()["balance_cents"] == before + 30
    assert client.get("/api/payouts/destination", headers=_h(o.seller)).status_code == 404
    _reconcile(app)
    ledger_clean()


def test_removing_the_destination_again_answers_as_the_first_time(app, client, below_minimum, make_account,
                                                                  ledger_clean):
    """A retried DELETE whose first answer was lost: 200 with the first answer's body, nothing
    moved twice; an account that never had a destination stays 404."""
    o = below_minimum[0]
    first = client.delete("/api/payouts/destination", headers=_h(o.seller))
    assert first.status_code == 200
    balance = client.get("/api/account", headers=_h(o.seller)).get_json()["balance_cents"]
    again = client.delete("/api/payouts/destination", headers=_h(o.seller))
    assert again.status_code == 200 and again.get_json() == first.get_json() == {
        "kind": None, "moved_to_balance_cents": 30}
    assert client.get("/api/account", headers=_h(o.seller)).get_json()["balance_cents"] == balance
    log = client.get("/api/audit", headers=_h(o.seller)).get_json()["entries"]
    assert [e["action"] for e in log].count("payout_destination.remove") == 1
    assert client.delete("/api/payouts/destination", headers=make_account().headers).status_code == 404
    _reconcile(app)
    ledger_clean()


@pytest.mark.parametrize("kind,body", [
    ("stripe_connect", {"account": "bogus"}),
    ("stripe_connect", {}),
    ("stripe_connect", {"account": "acct_fine0001", "chain": "base"}),
    ("usdc", {"address": "0x" + "ab" * 20}),
    ("usdc", {"chain": "base", "address": "0x1234"}),
    ("usdc", {"chain": "solana", "address": "0x" + "ab" * 20}),
])
def test_bad_destination_is_400_and_changes_nothing(app, client, make_account, kind, body):
    _refused_and_unchanged(client, make_account, kind, body, 400)


def test_checksum_mismatch_is_422_and_changes_nothing(app, client, make_account):
    """The documented shape (0x + 40 hex digits) with a broken EIP-55 checksum: well-formed,
    so not a 400 (issue 42 item 12), but not an address: 422 as for wallets."""
    body = {"chain": "base", "address": "0x52908400098527886E0F7030069857D2E4169EE7".replace("E", "e", 1)}
    _refused_and_unchanged(client, make_account, "usdc", body, 422)


def _refused_and_unchanged(client, make_account, kind, body, status):
    owner = make_account()
    good = client.put("/api/payouts/destination/stripe_connect", headers=_h(owner), json={"account": "acct_keepme001"})
    assert good.status_code == 200
    r = client.put(f"/api/payouts/destination/{kind}", headers=_h(owner), json=body)
    assert r.status_code == status, r.get_json()
    assert client.get("/api/payouts/destination", headers=_h(owner)).get_json()["account"] == "acct_keepme001"


def test_worker_killed_between_answer_and_booking_pays_once(app, client, make_account, provider, low_minimum,
                                                            monkeypatch, ledger_clean):
    """Stripe stand-in: the transfer is made, the worker dies before booking it; the
    recovery asks again with the same idempotency key (derived from the payout id), gets
    the same transfer, and books it once."""
    o = Owners(app, client, make_account, provider, calls=2)
    o.connect(o.seller)
    with stripe_server() as fake:
        for key, value in {"PAYMENTS_PROCESSOR": "stripe", "STRIPE_SECRET_KEY": "sk_test_standin",
                           "STRIPE_WEBHOOK_SECRET": fake.webhook_secret, "STRIPE_API_BASE": fake.url}.items():
            monkeypatch.setitem(app.config, key, value)
        real_book = payouts._book

        def dies(*a, **kw):
            raise KeyboardInterrupt("worker killed after the processor answered")

        monkeypatch.setattr(payouts, "_book", dies)
        with app.app_context(), pytest.raises(KeyboardInterrupt):
            settlement.settle_month(o.month, now=o.after)
            payouts.run()
        monkeypatch.setattr(payouts, "_book", real_book)
        with app.app_context():
            row = db.session.query(Payout).one()
            assert row.status == "sending" and _postings(app) == []
            assert payouts.run()["sent"] == 0        # not past the recovery delay: left alone
            report = money_check.reconcile()
            db.session.remove()
        assert report["ok"]
        monkeypatch.setitem(app.config, "PAYOUT_RECOVER_AFTER_SECONDS", 0)
        with app.app_context():
            assert payouts.run()["outcomes"] == {"paid": 1}
            assert payouts.run()["sent"] == 0
            db.session.remove()
        transfers = [p for m, path, p in fake.requests if path == "/v1/transfers"]
    assert len(transfers) == 1 and transfers[0]["destination"] == "acct_sellerOK01"
    got = o.payouts_of(o.seller)["payouts"]
    assert [(p["status"], p["amount_cents"], p["attempts"]) for p in got] == [("paid", 60, 1)]
    assert got[0]["processor_ref"].startswith("tr_test_") and _postings(app) == [f"payout:{got[0]['id']}"]
    _reconcile(app)
    ledger_clean()


def test_reconcile_reports_a_payout_left_sending(app, client, make_account, provider, low_minimum,
                                                 monkeypatch):
    o = Owners(app, client, make_account, provider, calls=1)
    o.connect(o.seller)
    monkeypatch.setattr(payouts, "_ask", lambda p, attempt: (_ for _ in ()).throw(KeyboardInterrupt()))
    with app.app_context(), pytest.raises(KeyboardInterrupt):
        settlement.settle_month(o.month, now=o.after)
        payouts.run()
    monkeypatch.setitem(app.config, "PAYOUT_RECOVER_AFTER_SECONDS", 0)
    with app.app_context():
        report = money_check.reconcile()
        db.session.remove()
    assert [p["check"] for p in report["problems"]] == ["payout_stuck"]


def test_eight_parallel_payout_requests_with_one_key_pay_once(app, client, make_account, provider, low_minimum,
                                                              ledger_clean):
    """Issue 42 item 13: `POST /api/payouts` honours `Idempotency-Key` (platform/idempotency.py)."""
    from tests.support.concurrency import at_once

    o = Owners(app, client, make_account, provider, calls=2)
    o.connect(o.seller)
    with app.app_context():
        settlement.settle_month(o.month, now=o.after)   # settled, not yet paid out
        db.session.remove()
    headers = _h(o.seller, **{"Idempotency-Key": "payout-once"})

    def request():
        r = app.test_client().post("/api/payouts", headers=headers)
        return r.status_code, r.get_json()

    results = at_once(8, request)
    ok = [body for status, body in results if status == 200]
    assert ok and all(status in (200, 409) for status, _ in results), results
    assert all(body == ok[0] for body in ok) and ok[0]["status"] == "paid" and ok[0]["amount_cents"] == 60
    assert len(_postings(app)) == 1 and len(o.payouts_of(o.seller)["payouts"]) == 1
    _reconcile(app)
    ledger_clean()


def test_without_a_live_processor_nothing_is_sent_and_it_stays_owed(app, client, make_account, provider,
                                                                    low_minimum, monkeypatch):
    o = Owners(app, client, make_account, provider, calls=1)
    o.connect(o.seller)
    monkeypatch.setitem(app.config, "PAYMENTS_PROCESSOR", "none")   # production without Stripe
    o.settle_and_pay()
    got = o.payouts_of(o.seller)
    assert [(p["status"], p["attempts"]) for p in got["payouts"]] == [("pending", 0)] and got["owed_cents"] == 30
    _reconcile(app)   # nothing left "sending": nothing was claimed


def test_usdc_destination_is_refused_until_a_payout_wallet_exists(client, make_account):
    """Without PAYOUT_WALLET_KEY (the suite's default) the USDC rail is off: 409."""
    owner = make_account()
    r = client.put("/api/payouts/destination/usdc", headers=_h(owner),
                   json={"chain": "base", "address": "0x52908400098527886E0F7030069857D2E4169EE7"})
    assert r.status_code == 409 and r.get_json()["error"] == "payout_rail_unavailable"
    assert client.get("/api/payouts/destination", headers=_h(owner)).status_code == 404


# --- USDC payouts (the chain stand-in moves the USDC) -------------------------------------

USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
WALLET_KEY = "0x" + "4c" * 32
SELLER_ADDR = "0x52908400098527886E0F7030069857D2E4169EE7"
AGENT_ADDR = "0x8617E340B3D01FA5F11F306F4090FD50E238070D"


@pytest.fixture
def node(app, monkeypatch):
    """The chain stand-in as ``base``'s node, the payout wallet configured and funded."""
    from eth_account import Account

    with chain_server(USDC_BASE) as fake:
        use_chain(monkeypatch, app, fake.url, PAYOUT_WALLET_KEY=WALLET_KEY, CHAIN_CONFIRMATIONS=0)
        fake.payout_wallet = Account.from_key(WALLET_KEY).address
        fake.balances[fake.payout_wallet.lower()] = 1_000_000_000  # 1,000 USDC
        yield fake


def _connect_usdc(o, who, address):
    r = o.client.put("/api/payouts/destination/usdc", headers=_h(who), json={"chain": "base", "address": address})
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["address"] == address and r.get_json()["chain"] == "base"


def _run(app):
    with app.app_context():
        out = payouts.run()
        db.session.remove()
    return out


def test_usdc_owners_are_paid_out_once_on_chain(app, client, make_account, provider, low_minimum, node,
                                                monkeypatch, ledger_clean):
    """A USDC destination connected; month-end settlement pays each owner once by a signed
    USDC transfer from the payout wallet: the address's balance grows by exactly what was
    earned, the payout is paid with the transaction hash, booked once when confirmed."""
    monkeypatch.setitem(app.config, "CHAIN_CONFIRMATIONS", 2)
    o = Owners(app, client, make_account, provider)
    _connect_usdc(o, o.seller, SELLER_ADDR)
    _connect_usdc(o, o.agent, AGENT_ADDR)
    out, ran = o.settle_and_pay()
    # sent and mined, not yet confirmed: still sending, nothing booked
    assert out["settled"] == 2 and ran["outcomes"] == {"sending": 2} and _postings(app) == []
    assert sorted(t["nonce"] for t in node.sent) == [0, 1] and all(t["status"] == 1 for t in node.sent)
    node.block += 2
    monkeypatch.setitem(app.config, "PAYOUT_RECOVER_AFTER_SECONDS", 0)
    assert _run(app)["outcomes"] == {"paid": 2}
    assert len(node.sent) == 2          # confirming sent the same transactions again: nothing moved twice
    for who, addr in ((o.seller, SELLER_ADDR), (o.agent, AGENT_ADDR)):
        assert node.balances[addr.lower()] == 150 * 10_000   # 1.50 USDC, exactly once
        got = o.payouts_of(who)
        [p] = got["payouts"]
        assert (p["status"], p["amount_cents"], p["kind"], p["chain"], p["destination"]) == \
            ("paid", 150, "usdc", "base", addr)
        assert p["processor_ref"] in {t["tx"] for t in node.sent if t["to"] == addr.lower()}
        assert got["owed_cents"] == 0
    assert node.balances[node.payout_wallet.lower()] == 1_000_000_000 - 300 * 10_000
    out, ran = o.settle_and_pay()
    assert out["settled"] == 0 and ran == {"opened": 0, "sent": 0, "outcomes": {}}
    assert len(_postings(app)) == 2 and len(node.sent) == 2
    _reconcile(app)
    ledger_clean()


def test_reverted_usdc_payout_stays_owed_and_a_retry_pays_once(app, client, make_account, provider,
                                                               low_minimum, node, ledger_clean):
    """The payout wallet holds too little USDC: the transfer reverts (the nonce is used, no
    USDC moves), the payout is failed and still owed; once funded, a retry signs a new
    transaction (attempt 2, the next nonce) and pays once."""
    o = Owners(app, client, make_account, provider, calls=2)
    _connect_usdc(o, o.seller, SELLER_ADDR)
    node.balances[node.payout_wallet.lower()] = 10_000   # 0.01 USDC
    o.settle_and_pay()
    got = o.payouts_of(o.seller)
    [p] = got["payouts"]
    assert (p["status"], p["failure_code"], p["attempts"]) == ("failed", "reverted", 1)
    assert got["owed_cents"] == 60 and _postings(app) == [] and node.balances.get(SELLER_ADDR.lower(), 0) == 0
    assert [t["status"] for t in node.sent] == [0]
    _reconcile(app)
    node.balances[node.payout_wallet.lower()] = 1_000_000_000
    r = client.post("/api/payouts", headers=_h(o.seller))
    assert r.status_code == 200, r.get_json()
    assert (r.get_json()["status"], r.get_json()["attempts"], r.get_json()["amount_cents"]) == ("paid", 2, 60)
    assert [(t["nonce"], t["status"]) for t in node.sent] == [(0, 0), (1, 1)]
    assert r.get_json()["processor_ref"] == node.sent[1]["tx"]
    assert node.balances[SELLER_ADDR.lower()] == 60 * 10_000
    assert _run(app)["sent"] == 0 and len(_postings(app)) == 1
    _reconcile(app)
    ledger_clean()


@pytest.mark.parametrize("dies_in", ["_book", "outcome"])
def test_usdc_worker_killed_around_sending_is_booked_once(app, client, make_account, provider, low_minimum,
                                                          node, monkeypatch, ledger_clean, dies_in):
    """``_book``: the transaction is sent and mined, the worker dies before booking it.
    ``outcome``: the worker dies after the claim (the signed transaction stored) before the
    chain hears of it. Either way the recovery sends the SAME stored transaction (found by
    its hash), books it once, and no second transfer is signed."""
    from app.services.billing import usdc_payouts

    o = Owners(app, client, make_account, provider, calls=2)
    _connect_usdc(o, o.seller, SELLER_ADDR)
    target = (payouts, "_book") if dies_in == "_book" else (usdc_payouts, "outcome")
    real = getattr(*target)

    def dies(*a, **kw):
        raise KeyboardInterrupt("worker killed")

    monkeypatch.setattr(*target, dies)
    with app.app_context(), pytest.raises(KeyboardInterrupt):
        settlement.settle_month(o.month, now=o.after)
        payouts.run()
    monkeypatch.setattr(*target, real)
    with app.app_context():
        row = db.session.query(Payout).one()
        stored_hash = row.tx_hash
        assert row.status == "sending" and stored_hash and row.tx_nonce == 0 and _postings(app) == []
        db.session.remove()
    assert [t["tx"] for t in node.sent] == ([stored_hash] if dies_in == "_book" else [])
    assert _run(app)["sent"] == 0        # not past the recovery delay: left alone
    _reconcile(app)
    monkeypatch.setitem(app.config, "PAYOUT_RECOVER_AFTER_SECONDS", 0)
    assert _run(app)["outcomes"] == {"paid": 1}
    assert _run(app)["sent"] == 0
    assert [t["tx"] for t in node.sent] == [stored_hash]      # one transfer, the stored one
    assert node.balances[SELLER_ADDR.lower()] == 60 * 10_000
    [p] = o.payouts_of(o.seller)["payouts"]
    assert (p["status"], p["attempts"], p["processor_ref"]) == ("paid", 1, stored_hash)
    assert _postings(app) == [f"payout:{p['id']}"]
    _reconcile(app)
    ledger_clean()


def test_reconcile_compares_usdc_payouts_with_the_chain(app, client, make_account, provider, low_minimum,
                                                        node):
    """Posted ⇔ confirmed: a paid USDC payout whose transaction the chain no longer shows as
    succeeded (e.g. re-orged away) is reported, as is an unreachable node."""
    o = Owners(app, client, make_account, provider, calls=1)
    _connect_usdc(o, o.seller, SELLER_ADDR)
    o.settle_and_pay()
    [p] = o.payouts_of(o.seller)["payouts"]
    assert p["status"] == "paid"
    _reconcile(app)
    del node.receipts[p["processor_ref"]]
    with app.app_context():
        report = money_check.reconcile()
        db.session.remove()
    assert [(x["check"], x["payout"]) for x in report["problems"]] == [("payout_chain_mismatch", p["id"])]
    node.fail = True
    with app.app_context():
        report = money_check.reconcile()
        db.session.remove()
    assert [x["check"] for x in report["problems"]] == ["payout_chain_unverified"]


def test_usdc_payout_with_its_nonce_taken_fails_and_is_retried(app, client, make_account, provider, low_minimum,
                                                               node, monkeypatch, ledger_clean):
    """The wallet's nonce is used by another transaction before ours lands (the operator
    spent from the wallet): ours can never land, so the payout is failed (``dropped``),
    still owed, and the retry signs a new transaction with the next nonce and pays once."""
    from app.services.billing import chains

    o = Owners(app, client, make_account, provider, calls=1)
    _connect_usdc(o, o.seller, SELLER_ADDR)
    real_send = chains.send_raw_transaction

    def lost(chain, raw):   # the node drops ours; another transaction takes the nonce
        node.nonces[node.payout_wallet.lower()] = node.nonces.get(node.payout_wallet.lower(), 0) + 1
        return None

    monkeypatch.setattr(chains, "send_raw_transaction", lost)
    o.settle_and_pay()
    monkeypatch.setattr(chains, "send_raw_transaction", real_send)
    got = o.payouts_of(o.seller)
    assert [(p["status"], p["failure_code"]) for p in got["payouts"]] == [("failed", "dropped")]
    assert got["owed_cents"] == 30 and node.sent == []
    r = client.post("/api/payouts", headers=_h(o.seller))
    assert r.status_code == 200 and r.get_json()["status"] == "paid" and r.get_json()["attempts"] == 2
    assert [t["nonce"] for t in node.sent] == [1] and node.balances[SELLER_ADDR.lower()] == 30 * 10_000
    _reconcile(app)
    ledger_clean()


@pytest.mark.parametrize("key,ok", [("0x" + "4c" * 32, True), ("4c" * 32, True), ("4c" * 31, False),
                                    ("0x" + "00" * 32, False), ("zz" * 32, False)])
def test_payout_wallet_key_is_checked_at_start_up(monkeypatch, key, ok):
    """A malformed PAYOUT_WALLET_KEY refuses to start (payouts are never left unsendable)."""
    from config import ConfigError, load_config

    monkeypatch.setenv("PAYOUT_WALLET_KEY", key)
    if ok:
        assert load_config({"APP_ENV": "test"})["PAYOUT_WALLET_KEY"] == key
    else:
        with pytest.raises(ConfigError, match="PAYOUT_WALLET_KEY"):
            load_config({"APP_ENV": "test"})


def test_concurrent_usdc_payouts_get_distinct_nonces(app, client, make_account, provider, low_minimum, node,
                                                     monkeypatch, ledger_clean):
    """Two workers send two owners' payouts at the same moment: each transaction gets its
    own nonce of the payout wallet (advisory lock + unique index), both land, each owner is
    paid once."""
    from tests.support.concurrency import at_once

    o = Owners(app, client, make_account, provider, calls=1)
    _connect_usdc(o, o.seller, SELLER_ADDR)
    _connect_usdc(o, o.agent, AGENT_ADDR)
    with app.app_context():
        settlement.settle_month(o.month, now=o.after)
        assert payouts.create_due() == 2
        pids = [p.id for p in db.session.query(Payout).all()]
        db.session.remove()

    def send():
        with app.app_context():
            out = payouts.send(pids.pop())
            db.session.remove()
        return out

    results = at_once(2, send)
    assert sorted(results) in (["paid", "paid"], ["paid", "sending"]), results   # both claimed and sent
    monkeypatch.setitem(app.config, "PAYOUT_RECOVER_AFTER_SECONDS", 0)
    _run(app)   # one that waited behind the other's nonce is read again
    assert sorted(t["nonce"] for t in node.sent) == [0, 1] and all(t["status"] == 1 for t in node.sent)
    for who, addr in ((o.seller, SELLER_ADDR), (o.agent, AGENT_ADDR)):
        assert [p["status"] for p in o.payouts_of(who)["payouts"]] == ["paid"]
        assert node.balances[addr.lower()] == 30 * 10_000
    assert len(_postings(app)) == 2
    _reconcile(app)
    ledger_clean()


def test_removing_the_destination_while_a_worker_claims_the_payout_pays_once(app, client, make_account, provider,
                                                                             low_minimum, monkeypatch,
                                                                             ledger_clean):
    """A payouts worker claims the open payout (``sending``) while ``DELETE
    /api/payouts/destination`` is between its check for a payout being sent and its writes.
    Before: the removal moved the owed earnings to the balance AND the worker's transfer went
    out (the owner was paid twice; the payout then could not be booked and stayed
    ``sending``). Now the removal locks the open payouts first: the claim waits, then finds
    it canceled, and nothing is sent."""
    import threading

    o = Owners(app, client, make_account, provider, calls=2)
    o.connect(o.seller)
    with app.app_context():
        settlement.settle_month(o.month, now=o.after)
        assert payouts.create_due() == 1
        pid = db.session.query(Payout.id).scalar()
        db.session.remove()
    before = client.get("/api/account", headers=_h(o.seller)).get_json()["balance_cents"]
    real_now, claimed, workers = payouts.utcnow, [], []

    def worker():
        with app.app_context():
            claimed.append(payouts._claim(pid, recover_before=real_now()))
            db.session.remove()

    def claim_meanwhile():
        if not workers:   # the removal's first clock reading: a worker claims the payout now
            workers.append(threading.Thread(target=worker))
            workers[0].start()
            workers[0].join(timeout=2)
        return real_now()

    monkeypatch.setattr(payouts, "utcnow", claim_meanwhile)
    r = client.delete("/api/payouts/destination", headers=_h(o.seller))
    monkeypatch.setattr(payouts, "utcnow", real_now)
    workers[0].join(timeout=10)
    with app.app_context():   # the worker goes on: asks the processor and books the answer
        payouts.send(pid, recover_after=0)
        db.session.remove()
    after = client.get("/api/account", headers=_h(o.seller)).get_json()["balance_cents"]
    got = o.payouts_of(o.seller)["payouts"]
    paid_out = sum(p["amount_cents"] for p in got if p["status"] in ("paid", "sending"))
    # the 60 cents owed reach the owner once: as balance, or as a payout, never both
    assert (after - before) + paid_out == 60, (r.get_json(), got, after - before)
    if r.status_code == 200:
        assert [p["status"] for p in got] == ["canceled"] and _postings(app) == []
    _reconcile(app)
    ledger_clean()


def test_the_document_says_a_checksum_mismatch_is_422(client):
    """The USDC destination's ``address`` said a mixed-case address with a wrong checksum is
    400; the route answers 422 (``test_checksum_mismatch_is_422_and_changes_nothing``)."""
    spec = client.get("/openapi.json").get_json()
    text = spec["components"]["schemas"]["UsdcDestinationIn"]["properties"]["address"]["description"]
    assert "422" in text and "400" not in text, text


def test_a_key_with_a_spend_limit_cannot_change_where_payouts_go(client, make_account):
    """Where earnings are paid is a money setting: a key whose spend is limited may not set or
    replace the destination (403 ``beyond_own_limits``, nothing changed); it may keep earnings
    as balance (``DELETE``); an unlimited key sets it."""
    acct = make_account()
    limited = {"Authorization": f"Bearer {_key(client, acct, spend_limit_cents=500)['key']}"}
    put = "/api/payouts/destination/stripe_connect"
    assert client.put(put, json={"account": "acct_ownerOK01"}, headers=acct.headers).status_code == 200
    r = client.put(put, json={"account": "acct_thief0001"}, headers=limited)
    assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits"
    assert "without a spend limit" in r.get_json()["message"]
    r = client.put("/api/payouts/destination/usdc", json={"chain": "base", "address": "0x" + "ab" * 20},
                   headers=limited)
    assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits"
    assert client.get("/api/payouts/destination", headers=acct.headers).get_json()["account"] == "acct_ownerOK01"
    r = client.delete("/api/payouts/destination", headers=limited)
    assert r.status_code == 200 and r.get_json()["kind"] is None

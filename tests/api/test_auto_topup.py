"""Auto top-up (``/api/pay/auto-topup``, app/services/billing/autotopup.py): exactly one
top-up per threshold crossing under concurrent calls and several workers, the sandbox's
success / decline / 3-D Secure, Stripe's off-session PaymentIntent against the stand-in, a
worker killed between the processor's answer and the booking, a replayed webhook, the
monthly cap, disabling after N failures with the owner e-mailed, and the API's rules."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from app.extensions import db
from app.models import Account, AutoTopupRun, OutboxMessage, Payment
from app.models.base import utcnow
from app.services.billing import autotopup
from app.services.billing.processors import PaymentMethodInvalid, SandboxProcessor
from app.services.money import ledger
from tests.api.test_keys_limits import _key, _rotated_then_limited
from tests.api.test_payments_stripe import _deliver, stripe_api  # noqa: F401
from tests.gateway_helpers import balance_cents, create_module, provider, provider_server  # noqa: F401
from tests.support.concurrency import at_once
from tests.support.finalize import drain

RULE = {"threshold_cents": 500, "amount_cents": 2000, "monthly_cap_cents": 10_000}


def _save_card(client, acct, pm="pm_card_visa", headers=None):
    r = client.post("/api/pay/method", json={"payment_method_id": pm}, headers=headers or acct.headers)
    assert r.status_code == 200, r.get_json()


def _put(client, acct, headers=None, **rule):
    return client.put("/api/pay/auto-topup", json={**RULE, **rule}, headers=headers or acct.headers)


def _crossed(app, client, make_account, pm="pm_card_visa", **rule):
    """An account with $10, ``pm`` saved, the rule set, then a $6 charge: under $5."""
    acct = make_account(cents=1000)
    _save_card(client, acct, pm)
    assert _put(client, acct, **rule).status_code == 200
    _spend(app, acct, 600)
    return acct


def _spend(app, acct, cents, mode="live"):
    """A charge of ``cents`` (a posting like a call's), committed."""
    with app.app_context():
        micros = cents * ledger.MICROS_PER_CENT
        ledger.post("charge", [(ledger.customer(acct.id, mode), -micros), (ledger.REVENUE, micros)],
                    account_id=acct.id)
        db.session.commit()
        db.session.remove()


def _start(app) -> int:
    """One tick of the schedule's ``autotopup-start`` (jobs run inline in the suite)."""
    with app.app_context():
        n = autotopup.start_due()
        db.session.remove()
    return n


def _runs(app, acct):
    with app.app_context():
        rows = db.session.execute(select(AutoTopupRun).where(AutoTopupRun.account_id == acct.id)
                                  .order_by(AutoTopupRun.id)).scalars().all()
        out = [(r.status, r.reason, r.payment_id) for r in rows]
        db.session.remove()
    return out


def _mails(app, acct):
    with app.app_context():
        out = db.session.execute(select(OutboxMessage.payload).where(OutboxMessage.account_id == acct.id)
                                 .order_by(OutboxMessage.created_at)).scalars().all()
        db.session.remove()
    return [m["subject"] for m in out]


def _expire_leases(app):
    with app.app_context():
        db.session.execute(update(AutoTopupRun).values(lease_until=utcnow() - timedelta(seconds=1),
                                                       due_at=utcnow() - timedelta(seconds=1)))
        db.session.commit()
        db.session.remove()


def concurrent_calls(app, headers: dict, n: int = 16, slug: str = "meter") -> int:
    """``n`` concurrent calls of ``slug``'s ``ok`` action, then the finalizations drained;
    how many were charged (a call the loaded machine failed, 502, is refunded)."""
    def one(_):
        return app.test_client().post(f"/v1/module/{slug}/call", json={"action": "ok"}, headers=headers).status_code

    with ThreadPoolExecutor(max_workers=n) as pool:
        codes = list(pool.map(one, range(n)))
    ok = codes.count(200)
    assert set(codes) <= {200, 502} and ok >= n - 3, codes
    drain(app)
    return ok


def test_sixteen_concurrent_calls_start_exactly_one_topup(app, client, make_account, provider, monkeypatch,
                                                          ledger_clean):
    acct = make_account(cents=1000, plan="enterprise")
    create_module(app, "meter", provider, {"ok": (40, "/ok", 30.0)})  # a loaded machine: no timeouts
    _save_card(client, acct)
    r = _put(client, acct)
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert body["threshold_cents"] == 500 and body["enabled"] is True and body["runs"] == []
    assert body["method"]["last4"] == "4242"

    ok = concurrent_calls(app, acct.headers)
    left = 1000 - ok * 40
    assert balance_cents(app, acct.id) == left < 500  # under 500: crossed once
    assert [s for s, _, _ in _runs(app, acct)] == ["queued"]
    # Several workers take the same run at once: one charges it.
    with app.app_context():
        run_id = db.session.execute(select(AutoTopupRun.id)).scalar_one()
        db.session.remove()

    def work():
        with app.app_context():
            try:
                return autotopup.run(run_id)
            finally:
                db.session.remove()

    charges = []
    real_charge = SandboxProcessor.charge

    def counted(self, payment, customer_id, pm):
        charges.append(payment.id)
        return real_charge(self, payment, customer_id, pm)

    monkeypatch.setattr(SandboxProcessor, "charge", counted)
    outcomes = at_once(4, work)
    assert len(charges) == 1  # one processor charge, whatever the number of workers
    assert sorted(outcomes).count("succeeded") >= 1 and set(outcomes) <= {"succeeded", "skipped"}
    assert _start(app) == 0  # nothing left to start
    assert balance_cents(app, acct.id) == left + 2000
    runs = _runs(app, acct)
    assert [s for s, _, _ in runs] == ["succeeded"]
    hist = client.get("/api/pay/history", headers=acct.headers).get_json()["payments"]
    assert [(p["id"], p["product"], p["amount_cents"], p["status"]) for p in hist if p["product"] == "Auto top-up"] \
        == [(runs[0][2], "Auto top-up", 2000, "succeeded")]
    view = client.get("/api/pay/auto-topup", headers=acct.headers).get_json()
    assert view["month_cents"] == 2000 and view["runs"][0]["status"] == "succeeded"
    assert view["runs"][0]["payment_id"] == runs[0][2]
    ledger_clean()


def test_a_charge_that_does_not_cross_starts_nothing(app, client, make_account, ledger_clean):
    acct = make_account(cents=1000)
    _save_card(client, acct)
    assert _put(client, acct).status_code == 200
    _spend(app, acct, 400)  # 600: still over
    assert _runs(app, acct) == []
    _spend(app, acct, 200)  # 400: crosses
    _spend(app, acct, 100)  # 300: already under, no second crossing
    assert [s for s, _, _ in _runs(app, acct)] == ["queued"]
    _start(app)
    assert balance_cents(app, acct.id) == 2300
    ledger_clean()


def test_setting_it_under_the_threshold_starts_one_now(app, client, make_account, ledger_clean):
    acct = make_account(cents=300)
    _save_card(client, acct)
    r = _put(client, acct)
    assert r.status_code == 200
    assert balance_cents(app, acct.id) == 2300  # the job ran inline after the commit
    assert [s for s, _, _ in _runs(app, acct)] == ["succeeded"]
    # Setting it again while over the threshold starts nothing.
    assert _put(client, acct).status_code == 200
    assert len(_runs(app, acct)) == 1
    ledger_clean()


def test_decline_retries_then_disables_and_tells_the_owner(app, client, make_account, monkeypatch, ledger_clean):
    monkeypatch.setitem(app.config, "AUTOTOPUP_MAX_FAILURES", 2)
    monkeypatch.setitem(app.config, "AUTOTOPUP_RETRY_SECONDS", 0)
    acct = _crossed(app, client, make_account, "pm_card_chargeDeclined")
    _start(app)
    runs = _runs(app, acct)
    assert [s for s, _, _ in runs] == ["failed", "queued"] and runs[0][1].startswith("generic_decline")
    assert _mails(app, acct) == []
    _start(app)  # the retry: the second failure disables it
    assert [s for s, _, _ in _runs(app, acct)] == ["failed", "failed"]
    view = client.get("/api/pay/auto-topup", headers=acct.headers).get_json()
    assert view["enabled"] is False and view["failures"] == 2 and "2 failed attempts" in view["disabled_reason"]
    assert _mails(app, acct) == ["Auto top-up disabled"]
    with app.app_context():
        assert db.session.get(Account, acct.id).topup_below_micros is None  # the trigger is off
        db.session.remove()
    hist = client.get("/api/pay/history", headers=acct.headers).get_json()["payments"]
    assert [p["status"] for p in hist if p["product"] == "Auto top-up"] == ["failed", "failed"]
    assert balance_cents(app, acct.id) == 400
    _spend(app, acct, 100)
    _start(app)
    assert len(_runs(app, acct)) == 2  # disabled: nothing more starts
    # Turning it on again (a new card) resets the failures.
    _save_card(client, acct)
    body = _put(client, acct).get_json()
    assert body["enabled"] is True and body["failures"] == 0
    assert body["card_needs_authentication"] is False  # a card not known to need 3-D Secure
    assert balance_cents(app, acct.id) == 2300  # under the threshold: one started at once
    ledger_clean()


@pytest.mark.parametrize("processor", ["sandbox", "stripe"])
def test_3ds_required_off_session_asks_the_owner(app, client, make_account, request, processor, ledger_clean):
    if processor == "stripe":
        request.getfixturevalue("stripe_api")
    acct = _crossed(app, client, make_account, "pm_card_authenticationRequired")
    needs = lambda: client.get("/api/pay/auto-topup", headers=acct.headers).get_json()["card_needs_authentication"]  # noqa: E731
    # the sandbox says so of its 3-D Secure test card before any charge; Stripe of no card
    assert needs() is (processor == "sandbox")
    _start(app)
    runs = _runs(app, acct)
    assert runs[0][0] == "requires_action" and runs[0][1].startswith("authentication_required")
    assert _mails(app, acct) == ["Auto top-up needs you to confirm the payment"]
    assert balance_cents(app, acct.id) == 400
    assert needs() is True  # its off-session charge failed so: known now, as the console warns
    ledger_clean()


def test_monthly_cap(app, client, make_account, ledger_clean):
    acct = _crossed(app, client, make_account, monthly_cap_cents=2000)
    _start(app)
    assert balance_cents(app, acct.id) == 2400
    _spend(app, acct, 2000)  # 400: crosses again, but the cap is reached
    _start(app)
    assert [(s, r) for s, r, _ in _runs(app, acct)] == [("succeeded", None), ("skipped", "cap_reached")]
    assert _mails(app, acct) == ["Auto top-up paused: monthly cap reached"]
    assert balance_cents(app, acct.id) == 400
    ledger_clean()


def test_stripe_off_session_intent_killed_worker_and_replayed_webhook(app, client, make_account, stripe_api,
                                                                     monkeypatch, ledger_clean):
    acct = _crossed(app, client, make_account)

    def killed(*args, **kwargs):
        raise SystemExit("worker killed after the processor answered")

    with app.app_context(), monkeypatch.context() as patched:
        patched.setattr(autotopup, "_book", killed)
        run_id = db.session.execute(select(AutoTopupRun.id)).scalar_one()
        with pytest.raises(SystemExit):
            autotopup.run(run_id)
        db.session.remove()
    intents = [(p, params) for _, p, params in stripe_api.requests if p == "/v1/payment_intents"]
    assert len(intents) == 1
    params = intents[0][1]
    assert params["off_session"] == "true" and params["confirm"] == "true" and params["amount"] == "2000"
    assert balance_cents(app, acct.id) == 400  # charged at Stripe, not booked yet
    assert [s for s, _, _ in _runs(app, acct)] == ["processing"]
    # Stripe's webhook arrives (metadata names the payment): it credits the payment once.
    pid = params["metadata"]["payment_id"]
    pi_obj = {"id": "pi_test_%06d" % stripe_api.n, "object": "payment_intent", "amount": 2000,
              "amount_received": 2000, "currency": "usd", "metadata": {"payment_id": pid}}
    event = stripe_api.event("payment_intent.succeeded", pi_obj)
    r = _deliver(client, stripe_api, event)
    assert r.get_json().get("outcome") == "credited", r.get_json()
    assert balance_cents(app, acct.id) == 2400
    # The lease runs out: the run is taken again, charged with the same idempotency key
    # (the stand-in answers the same intent) and closed; nothing more is credited.
    assert _start(app) == 0  # still leased
    _expire_leases(app)
    assert _start(app) == 1
    assert [s for s, _, _ in _runs(app, acct)] == ["succeeded"]
    assert len([p for _, p, _ in stripe_api.requests if p == "/v1/payment_intents"]) == 1  # idempotent replay
    assert _deliver(client, stripe_api, event).get_json()["duplicate"] is True
    again = stripe_api.event("payment_intent.succeeded", pi_obj)  # a new event id, same intent
    assert _deliver(client, stripe_api, again).get_json()["outcome"] == "already_final"
    assert balance_cents(app, acct.id) == 2400
    with app.app_context():
        assert db.session.get(Payment, pid).status == "succeeded"
        db.session.remove()
    ledger_clean()


def test_api_rules(app, client, make_account, ledger_clean):
    acct = make_account(cents=1000, test_key=True, plan="enterprise")
    r = _put(client, acct)
    assert r.status_code == 409 and r.get_json()["error"] == "no_payment_method"
    _save_card(client, acct, "pm_usBankAccount")
    r = _put(client, acct)
    assert r.status_code == 409 and r.get_json()["error"] == "no_payment_method"  # a card is needed
    _save_card(client, acct)
    r = _put(client, acct, monthly_cap_cents=1000)
    assert r.status_code == 422 and "monthly_cap_cents" in r.get_json()["message"]  # two fields related
    # threshold 0: a balance is never under 0, so the rule would be saved and never fire
    for bad in ({"amount_cents": 50}, {"threshold_cents": -1}, {"threshold_cents": 0}, {"threshold_cents": "5"}):
        assert _put(client, acct, **bad).status_code == 400
    assert client.get("/api/pay/auto-topup", headers=acct.headers).status_code == 404
    assert client.delete("/api/pay/auto-topup", headers=acct.headers).status_code == 404
    assert _runs(app, acct) == []
    assert _put(client, acct).status_code == 200
    # The test key's mode has its own rule (and its own sandbox card).
    test_headers = {"Authorization": f"Bearer {acct.test_key}"}
    assert client.get("/api/pay/auto-topup", headers=test_headers).status_code == 404
    # Deleting it turns the trigger off.
    r = client.delete("/api/pay/auto-topup", headers=acct.headers)
    assert r.status_code == 200 and r.get_json() == {"deleted": True}
    with app.app_context():
        assert db.session.get(Account, acct.id).topup_below_micros is None
        db.session.remove()
    _spend(app, acct, 600)
    assert _runs(app, acct) == []
    ledger_clean()


def test_test_mode_rule_tops_up_the_test_balance(app, client, make_account, ledger_clean):
    acct = make_account(cents=1000, test_key=True)
    h = {"Authorization": f"Bearer {acct.test_key}"}
    _save_card(client, acct, headers=h)
    with app.app_context():
        ledger.post("test_grant", [("adjust:test", -10_000_000), (ledger.customer(acct.id, "test"), 10_000_000)])
        db.session.commit()
        db.session.remove()
    assert _put(client, acct, headers=h).status_code == 200
    _spend(app, acct, 600, mode="test")
    _start(app)
    with app.app_context():
        a = db.session.get(Account, acct.id)
        assert (a.balance_micros, a.test_balance_micros) == (10_000_000, 24_000_000)
        db.session.remove()
    ledger_clean()


def test_a_method_the_processor_refuses_fails_the_attempt(app, client, make_account, monkeypatch, ledger_clean):
    """A saved method the processor no longer accepts (detached, expired) is a failed attempt
    counted like a decline, not a processor outage retried forever after each lease."""
    def refused(self, payment, customer_id, pm):
        raise PaymentMethodInvalid("The saved payment method cannot be charged: detached.")

    acct = _crossed(app, client, make_account)
    monkeypatch.setattr(SandboxProcessor, "charge", refused)
    _start(app)
    runs = _runs(app, acct)
    assert runs[0][0] == "failed" and runs[0][1].startswith("payment_method_invalid"), runs
    hist = client.get("/api/pay/history", headers=acct.headers).get_json()["payments"]
    assert [p["status"] for p in hist if p["product"] == "Auto top-up"] == ["failed"]
    assert balance_cents(app, acct.id) == 400
    ledger_clean()


def test_a_topup_the_processor_completes_later_is_closed_by_its_webhook(app, client, make_account, monkeypatch,
                                                                       ledger_clean):
    """An off-session charge the processor answers ``processing`` leaves the run ``pending``;
    the payment's webhook decides it. Before, the run stayed ``pending`` forever: a failed
    payment kept counting against the monthly cap (the next crossing was skipped as
    ``cap_reached`` though nothing had been charged) and never counted as a failure. Now the
    webhook closes the run as the job would have: failed (a failure, retried later), or
    succeeded."""
    from app.services.billing.processors import ChargeResult
    from app.services.billing.sandbox_checkout import sandbox_deliver

    monkeypatch.setattr(SandboxProcessor, "charge",
                        lambda self, payment, customer, pm: ChargeResult("pi_sbx_later" + payment.id[-8:],
                                                                         "processing"))
    acct = _crossed(app, client, make_account, monthly_cap_cents=2000)
    _start(app)
    [(status, _, pid)] = _runs(app, acct)
    assert status == "pending" and balance_cents(app, acct.id) == 400

    def deliver(etype, ok):
        with app.app_context():
            p = db.session.get(Payment, pid)
            obj = {"id": p.provider_id, "object": "payment_intent", "amount": 2000,
                   "amount_received": 2000 if ok else 0, "currency": "usd",
                   "metadata": {"payment_id": p.id, "account_id": p.account_id},
                   "last_payment_error": None if ok else {"code": "card_declined", "message": "Declined later."}}
            out = sandbox_deliver(etype, obj)
            db.session.remove()
        return out

    deliver("payment_intent.payment_failed", ok=False)
    runs = _runs(app, acct)
    assert [s for s, _, _ in runs] == ["failed", "queued"], runs   # a failure, retried after the delay
    got = client.get("/api/pay/auto-topup", headers=acct.headers).get_json()
    assert got["month_cents"] == 0 and got["failures"] == 1
    # the retry is charged (nothing was charged this month: the cap is not reached) and
    # its payment's success webhook closes it
    _expire_leases(app)
    _start(app)
    runs = _runs(app, acct)
    assert [s for s, _, _ in runs] == ["failed", "pending"], runs
    pid = runs[-1][2]
    deliver("payment_intent.succeeded", ok=True)
    assert [s for s, _, _ in _runs(app, acct)] == ["failed", "succeeded"]
    got = client.get("/api/pay/auto-topup", headers=acct.headers).get_json()
    assert got["month_cents"] == 2000 and got["failures"] == 0
    assert balance_cents(app, acct.id) == 2400
    ledger_clean()


def test_setting_the_rule_again_starts_the_waiting_retry_now(app, client, make_account, ledger_clean):
    """After a decline the retry waits ``AUTOTOPUP_RETRY_SECONDS`` (an hour by default). The
    owner saves a good card and sets the rule again: the documented "if the balance is
    already under the threshold, one top-up starts now". Before, the retry already queued
    kept its due time (the new run was dropped by the one-open-run index) and the balance
    stayed under the threshold for the hour."""
    acct = _crossed(app, client, make_account, "pm_card_chargeDeclined")
    _start(app)
    assert [s for s, _, _ in _runs(app, acct)] == ["failed", "queued"]
    _save_card(client, acct)
    assert _put(client, acct).status_code == 200
    _start(app)
    assert [s for s, _, _ in _runs(app, acct)] == ["failed", "succeeded"]
    assert balance_cents(app, acct.id) == 2400
    ledger_clean()


def test_a_crossing_with_the_card_removed_tells_the_owner(app, client, make_account, ledger_clean):
    """The saved card removed after the rule was set (``DELETE /api/pay/methods/{id}``): the
    crossing charges nothing, the run is skipped, and the owner hears of it — before, the
    top-up silently did not happen and the balance ran dry (the run's reason, in GET, was
    the only trace)."""
    acct = make_account(cents=1000)
    _save_card(client, acct)
    assert _put(client, acct).status_code == 200
    assert client.delete("/api/pay/methods/pm_card_visa", headers=acct.headers).status_code == 200
    # the rule shows no card to charge (it showed a method of null fields)
    assert client.get("/api/pay/auto-topup", headers=acct.headers).get_json()["method"] is None
    _save_card(client, acct, "pm_usBankAccount")  # a bank account is not charged by auto top-up either
    assert client.get("/api/pay/auto-topup", headers=acct.headers).get_json()["method"] is None
    _spend(app, acct, 600)
    _start(app)
    assert [s for s, _, _ in _runs(app, acct)] == ["skipped"]
    assert _mails(app, acct) == ["Auto top-up could not run: no saved card"]
    assert balance_cents(app, acct.id) == 400
    ledger_clean()


def test_turning_it_off_again_answers_as_the_first_time(app, client, make_account, ledger_clean):
    """A retried DELETE whose first answer was lost: 200 with the same body, no second audit
    entry; a mode that never had a rule stays 404 (a test key cannot believe it turned the
    live rule off)."""
    acct = make_account(cents=1000, test_key=True)
    _save_card(client, acct)
    assert _put(client, acct).status_code == 200
    for _ in range(2):
        r = client.delete("/api/pay/auto-topup", headers=acct.headers)
        assert r.status_code == 200 and r.get_json() == {"deleted": True}
    log = client.get("/api/audit", headers=acct.headers).get_json()["entries"]
    assert [e["action"] for e in log].count("autotopup.delete") == 1
    test_headers = {"Authorization": f"Bearer {acct.test_key}"}
    assert client.delete("/api/pay/auto-topup", headers=test_headers).status_code == 404
    ledger_clean()


def test_a_key_with_a_spend_limit_cannot_set_auto_top_up(app, client, make_account, ledger_clean):
    """Auto top-up charges the saved card with no one present, past any key's limit: a key whose
    spend is limited (its own limit, or a retiring key's successor's) may not set it: 403
    ``beyond_own_limits`` naming what is needed, nothing set. It may turn it off; an
    unlimited key sets it (docs/decisions.md "Money settings need an unlimited key")."""
    acct = make_account(cents=1000)
    _save_card(client, acct)
    limited = {"Authorization": f"Bearer {_key(client, acct, spend_limit_cents=500)['key']}"}
    old, _new = _rotated_then_limited(client, acct, "day")
    retiring = {"Authorization": f"Bearer {old['key']}"}
    for headers in (limited, retiring):
        r = _put(client, acct, headers=headers)
        assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits", r.get_json()
        assert "without a spend limit" in r.get_json()["message"]
    assert client.get("/api/pay/auto-topup", headers=acct.headers).status_code == 404
    assert _put(client, acct).status_code == 200
    r = client.delete("/api/pay/auto-topup", headers=limited)
    assert r.status_code == 200 and r.get_json() == {"deleted": True}
    ledger_clean()

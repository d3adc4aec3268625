"""Invoices and credit notes (JSON and PDF), saved payment methods, auto top-up and payouts
through the client, against the live server (sandbox processor)."""
from __future__ import annotations

import asyncio

import pytest

from gateway_client import AsyncGateway, Conflict, InvalidRequest, NotFound, PaymentRequired


def paid_checkout(app, gw, cents: int, refund_cents: int | None = None, org_id: str | None = None) -> str:
    """A checkout of ``cents`` paid in the sandbox (and ``refund_cents`` of it refunded): its payment id."""
    from app.extensions import db
    from app.services.billing import sandbox_checkout

    co = gw.pay.checkout(cents, product="credits", org_id=org_id)
    with app.app_context():
        sandbox_checkout.sandbox_checkout_action(co.url.rsplit("/", 1)[1], "pay", "pm_card_visa")
        if refund_cents:
            sandbox_checkout.sandbox_refund(co.payment_id, refund_cents)
        db.session.remove()
    return co.payment_id


def test_invoices_pages_credit_notes_and_pdfs(app, funded, tmp_path):
    _, gw = funded
    first = paid_checkout(app, gw, 500, refund_cents=200)
    second = paid_checkout(app, gw, 700)

    page = gw.invoices.list(limit=1)
    (newest,) = page.invoices
    assert (newest.kind, newest.payment_id, newest.total, newest.credit_notes) == ("payment", second, "7.00", [])
    assert page.next_cursor and newest.document is None  # a list carries no documents
    rest = gw.invoices.list(limit=1, cursor=page.next_cursor)
    (refunded,) = rest.invoices
    assert rest.next_cursor is None and refunded.payment_id == first
    (note,) = refunded.credit_notes
    assert (note.kind, note.total, refunded.credited, refunded.net_total) == ("credit_note", "2.00", "2.00", "3.00")

    full = gw.invoices.get(refunded.id)
    assert full.number == refunded.number and full.document and full.document["number"] == full.number
    assert full.credit_notes == refunded.credit_notes
    credit_note = gw.invoices.get(note.id)
    assert (credit_note.kind, credit_note.credits_invoice_id, credit_note.total) == ("credit_note", refunded.id, "2.00")

    for invoice_id in (refunded.id, note.id):
        path = gw.invoices.pdf(invoice_id, str(tmp_path / f"{invoice_id}.pdf"))
        with open(path, "rb") as fh:
            assert fh.read(5) == b"%PDF-"
    with pytest.raises(NotFound):
        gw.invoices.get("inv_not_mine")
    with pytest.raises(NotFound):
        gw.invoices.pdf("inv_not_mine", str(tmp_path / "none.pdf"))
    assert not (tmp_path / "none.pdf").exists()


def test_saved_payment_methods(funded):
    _, gw = funded
    assert gw.payment_methods.list() == []
    visa = gw.payment_methods.save("pm_card_visa")
    assert (visa.payment_method_id, visa.type, visa.brand, visa.last4) == ("pm_card_visa", "card", "visa", "4242")
    gw.payment_methods.save("pm_card_mastercard")
    assert {m.payment_method_id: m.default for m in gw.payment_methods.list()} == {
        "pm_card_visa": False, "pm_card_mastercard": True}
    assert gw.payment_methods.set_default("pm_card_visa").payment_method_id == "pm_card_visa"
    assert [m.payment_method_id for m in gw.payment_methods.list() if m.default] == ["pm_card_visa"]
    assert gw.payment_methods.delete("pm_card_mastercard") is True
    assert [m.payment_method_id for m in gw.payment_methods.list()] == ["pm_card_visa"]
    assert gw.payment_methods.delete("pm_card_mastercard") is True  # again (a retry): as the first time
    with pytest.raises(NotFound):
        gw.payment_methods.delete("pm_card_amex")  # never saved
    with pytest.raises(NotFound) as exc:
        gw.payment_methods.save("pm_card_unknown")
    assert exc.value.code == "payment_method_not_found"


def test_auto_topup_get_set_disable(funded):
    _, gw = funded
    with pytest.raises(NotFound):
        gw.auto_topup.get()
    with pytest.raises(Conflict) as exc:
        gw.auto_topup.set(threshold_cents=100, amount_cents=500, monthly_cap_cents=2000)
    assert exc.value.code == "no_payment_method"
    gw.payment_methods.save("pm_card_visa")
    with pytest.raises(InvalidRequest):  # the cap is under one top-up: 422
        gw.auto_topup.set(threshold_cents=100, amount_cents=500, monthly_cap_cents=400)
    rule = gw.auto_topup.set(threshold_cents=100, amount_cents=500, monthly_cap_cents=2000)
    assert (rule.threshold_cents, rule.amount_cents, rule.monthly_cap_cents, rule.enabled) == (100, 500, 2000, True)
    assert rule.method and rule.method.last4 == "4242" and rule.runs == []  # the balance (500) is above 100
    assert rule.card_needs_authentication is False and rule.raw["card_needs_authentication"] is False
    assert gw.auto_topup.get() == rule
    assert gw.auto_topup.disable() is True
    assert gw.auto_topup.disable() is True  # again (a retry): as the first time


def test_payouts_and_their_destination(funded):
    _, gw = funded
    sent = []
    gw._http.event_hooks["request"].append(lambda req: sent.append(req.headers.get("Idempotency-Key")))
    listed = gw.payouts.list()
    assert (listed.payouts, listed.destination, listed.owed_cents) == ([], None, 0) and listed.minimum_cents > 0
    with pytest.raises(NotFound):
        gw.payouts.destination()
    with pytest.raises(Conflict) as exc:
        gw.payouts.create()
    assert exc.value.code == "no_payout_destination" and sent[-1].startswith("gwc_")

    dest = gw.payouts.set_stripe_destination("acct_sellerOK01")
    assert (dest.kind, dest.account) == ("stripe_connect", "acct_sellerOK01") and gw.payouts.destination() == dest
    assert gw.payouts.list().destination == dest
    with pytest.raises(Conflict) as exc:
        gw.payouts.create(idempotency_key="payout-1")
    assert exc.value.code == "below_payout_minimum" and sent[-1] == "payout-1"
    with pytest.raises(InvalidRequest):
        gw.payouts.set_usdc_destination("base", "0x123")
    removed = gw.payouts.remove_destination()
    assert (removed.kind, removed.moved_to_balance_cents) == (None, 0)  # kept as balance again
    assert gw.payouts.remove_destination() == removed  # again (a retry): the first answer


def test_async_billing_resources(app, funded, tmp_path):
    acct, gw = funded
    payment_id = paid_checkout(app, gw, 500)

    async def run():
        async with AsyncGateway(acct.key, gw.base_url) as agw:
            page = await agw.invoices.list()
            invoice = await agw.invoices.get(page.invoices[0].id)
            pdf = await agw.invoices.pdf(invoice.id, str(tmp_path / "a.pdf"))
            saved = await agw.payment_methods.save("pm_card_visa")
            rule = await agw.auto_topup.set(threshold_cents=50, amount_cents=500, monthly_cap_cents=500)
            disabled = await agw.auto_topup.disable()
            dest = await agw.payouts.set_stripe_destination("acct_sellerOK02")
            payouts = await agw.payouts.list()
            return invoice, pdf, saved, rule, disabled, dest, payouts

    invoice, pdf, saved, rule, disabled, dest, payouts = asyncio.run(run())
    assert invoice.payment_id == payment_id and invoice.document
    with open(pdf, "rb") as fh:
        assert fh.read(5) == b"%PDF-"
    assert saved.payment_method_id == "pm_card_visa" and rule.method == saved and disabled is True
    assert payouts.destination == dest and dest.account == "acct_sellerOK02"


def test_wallet_fund_charges_the_saved_card_once_per_key(funded):
    """``wallet.fund``: the saved default card is charged off-session, once per
    Idempotency-Key; no card is 409, a declined one 402."""
    _, gw = funded
    with pytest.raises(Conflict) as exc:
        gw.wallet.fund(500)
    assert exc.value.code == "no_payment_method"
    gw.payment_methods.save("pm_card_visa")
    first = gw.wallet.fund(500, idempotency_key="top-up-1")
    again = gw.wallet.fund(500, idempotency_key="top-up-1")
    assert (first.method, first.status, first.amount_cents, first.balance_cents) == ("card", "succeeded", 500, 1000)
    assert again.payment_id == first.payment_id and gw.wallet.balance().credits_cents == 1000
    gw.payment_methods.save("pm_card_chargeDeclined")
    with pytest.raises(PaymentRequired) as exc:
        gw.wallet.fund(500)
    assert exc.value.code == "card_declined" and gw.wallet.balance().credits_cents == 1000


def test_billing_details_are_printed_on_later_invoices(app, funded):
    acct, gw = funded
    assert gw.invoices.billing_details().name is None
    details = gw.invoices.set_billing_details(name="ACME SAS", address="1 rue de la Paix\nParis",
                                              country="FR", tax_id="FR12345678901")
    assert (details.name, details.country, details.tax_id) == ("ACME SAS", "FR", "FR12345678901")
    assert gw.invoices.billing_details() == details
    payment_id = paid_checkout(app, gw, 500)
    (invoice,) = [i for i in gw.invoices.list().invoices if i.payment_id == payment_id]
    buyer = gw.invoices.get(invoice.id).document["buyer"]
    assert (buyer["name"], buyer["tax_id"]) == ("ACME SAS", "FR12345678901")
    cleared = gw.invoices.set_billing_details()  # absent fields are cleared
    assert (cleared.name, cleared.address, cleared.country, cleared.tax_id) == (None, None, None, None)


def test_an_owners_earnings(funded):
    """``payouts.earnings()``: what the account's own catalog modules earned, settled and
    owe to its payout destination (agents: ``agents.earnings``)."""
    acct, gw = funded
    earned = gw.payouts.earnings()
    assert (earned.account_id, earned.agent_id, earned.owed_cents, earned.lifetime_cents) == (acct.id, None, 0, 0)
    assert earned.share_pct > 0 and earned.settlements == []

"""Invoices (docs/payments.md "Invoices"): one numbered, immutable document per payment and per
month of usage; numbers gap-free per seller (concurrent payments, a rolled-back unit of work);
the UPDATE/DELETE refusal; the PDF; exactly one invoice per payment under replayed webhooks;
the monthly job once under retries and racing schedulers; 404s for bad and foreign ids."""
from __future__ import annotations

import io
from datetime import datetime, timezone
from urllib.parse import urlparse

import pytest
from pypdf import PdfReader
from sqlalchemy import text

from app.extensions import db
from tests.api.test_payments_sandbox import _fund
from tests.api.test_console_security import signed_in  # noqa: F401
from tests.api.test_payments_stripe import _deliver, stripe_api  # noqa: F401
from tests.support.concurrency import at_once


def _invoices(client, acct, **params):
    r = client.get("/api/pay/invoices", query_string=params, headers=acct.headers)
    assert r.status_code == 200, r.get_json()
    return r.get_json()


def _pdf_text(data: bytes) -> str:
    return "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(data)).pages)


def _pay_sandbox_checkout(client, acct, cents):
    out = client.post("/api/pay/checkout", json={"amount_cents": cents}, headers=acct.headers).get_json()
    client.post(urlparse(out["url"]).path, data={"action": "pay", "payment_method": "pm_card_visa"})
    return out["payment_id"]


def _seqs(app):
    with app.app_context():
        rows = db.session.execute(text("SELECT seq FROM invoices WHERE series = 'live' ORDER BY seq")).scalars().all()
        db.session.remove()
    return rows


def test_checkout_webhook_replayed_issues_one_invoice_with_pdf(client, account, stripe_api, ledger_clean):
    r = client.put("/api/account/billing-details", headers=account.headers, json={
        "name": "Acme Robotics GmbH", "address": "Hauptstraße 1\n10115 Berlin", "country": "de",
        "tax_id": "DE123456789"})
    assert r.status_code == 200 and r.get_json()["country"] == "DE"
    out = client.post("/api/pay/checkout", json={"amount_cents": 1500}, headers=account.headers).get_json()
    session_id = out["url"].rsplit("/", 1)[1]
    params = next(x for x in stripe_api.requests if x[1] == "/v1/checkout/sessions")[2]
    obj = {"id": session_id, "object": "checkout.session", "amount_total": 1500, "currency": "usd",
           "payment_status": "paid", "payment_intent": "pi_inv_1", "metadata": params["metadata"]}
    event = stripe_api.event("checkout.session.completed", obj)
    assert _deliver(client, stripe_api, event).get_json()["outcome"] == "credited"
    assert _deliver(client, stripe_api, event).get_json()["duplicate"] is True
    # another event for the same payment (a second id) issues nothing either
    again = stripe_api.event("checkout.session.completed", obj)
    assert _deliver(client, stripe_api, again).status_code == 200
    listed = _invoices(client, account)["invoices"]
    assert len(listed) == 1 and listed[0]["payment_id"] == out["payment_id"] and listed[0]["total"] == "15.00"
    inv = client.get(f"/api/pay/invoices/{listed[0]['id']}", headers=account.headers).get_json()
    doc = inv["document"]
    assert doc["buyer"]["name"] == "Acme Robotics GmbH" and doc["buyer"]["tax_id"] == "DE123456789"
    assert doc["total_micros"] == 15_000_000 and doc["lines"][0]["amount"] == "15.00" and doc["currency"] == "USD"
    assert doc["seller"]["name"] and doc["number"] == inv["number"]
    pdf = client.get(f"/api/pay/invoices/{inv['id']}.pdf", headers=account.headers)
    assert pdf.status_code == 200 and pdf.mimetype == "application/pdf" and pdf.data.startswith(b"%PDF")
    words = _pdf_text(pdf.data)
    assert "15.00" in words and inv["number"] in words and "Acme Robotics GmbH" in words and "DE123456789" in words
    negotiated = client.get(f"/api/pay/invoices/{inv['id']}",
                            headers={**account.headers, "Accept": "application/pdf"})
    assert negotiated.mimetype == "application/pdf" and negotiated.data == pdf.data  # the same bytes each time
    # later billing details never change an issued invoice
    client.put("/api/account/billing-details", headers=account.headers, json={"name": "Other Name"})
    assert client.get(f"/api/pay/invoices/{inv['id']}", headers=account.headers).get_json()["document"] == doc
    ledger_clean()


def test_every_payment_gets_a_consecutive_number_and_test_mode_its_own_series(client, make_account, app,
                                                                             ledger_clean):
    acct = make_account(test_key=True)
    first = _pay_sandbox_checkout(client, acct, 500)
    assert _fund(client, acct, 700, "card", with_method="pm_card_visa").status_code == 200
    listed = _invoices(client, acct)["invoices"]
    assert [i["total"] for i in listed] == ["7.00", "5.00"] and listed[1]["payment_id"] == first
    numbers = [int(i["number"].rsplit("-", 1)[1]) for i in listed]
    assert numbers[0] == numbers[1] + 1
    test_headers = {"Authorization": f"Bearer {acct.test_key}"}
    out = client.post("/api/pay/checkout", json={"amount_cents": 200}, headers=test_headers).get_json()
    client.post(urlparse(out["url"]).path, data={"action": "pay", "payment_method": "pm_card_visa"})
    test_list = client.get("/api/pay/invoices", headers=test_headers).get_json()["invoices"]
    assert [i["number"].startswith("INV-TEST-") for i in test_list] == [True] and test_list[0]["mode"] == "test"
    # paging
    page = _invoices(client, acct, limit=1)
    assert len(page["invoices"]) == 1 and page["next_cursor"]
    rest = _invoices(client, acct, limit=1, cursor=page["next_cursor"])
    assert rest["invoices"][0]["payment_id"] == first and rest["next_cursor"] is None
    ledger_clean()


def test_numbers_are_gap_free_under_concurrent_payments_and_a_rollback(client, make_account, app, ledger_clean):
    from app.models import Payment
    from app.services.billing import invoices
    from app.services.platform.uow import unit_of_work

    accts = [make_account() for _ in range(4)]
    for a in accts:
        client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa"}, headers=a.headers)
    before = _seqs(app)
    # a unit of work that issues an invoice and then fails takes its number back
    with app.app_context():
        with pytest.raises(RuntimeError):
            with unit_of_work():
                fake = Payment(id="pay_rolledback", account_id=accts[0].id, method="card", kind="charge",
                               processor="sandbox", mode="live", amount_micros=1_000_000, status="succeeded")
                db.session.add(fake)
                assert invoices.issue_for_payment(fake) is not None
                raise RuntimeError("the unit of work fails after the invoice was numbered")
        db.session.remove()
    assert _seqs(app) == before
    clients = [app.test_client() for _ in range(8)]
    answers = at_once(8, lambda: clients.pop().post(
        "/api/wallet/fund", json={"amount_cents": 100, "method": "card"},
        headers=accts[len(clients) % 4].headers).status_code)
    assert answers == [200] * 8
    seqs = _seqs(app)
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) == len(before) + 8
    ledger_clean()


def test_invoices_are_immutable(client, account, app):
    _pay_sandbox_checkout(client, account, 400)
    with app.app_context():
        for statement in ("UPDATE invoices SET total_micros = 1", "DELETE FROM invoices",
                          "UPDATE invoice_counters SET last_number = last_number"):
            try:
                db.session.execute(text(statement))
                refused = False
            except Exception as exc:  # noqa: BLE001 - the trigger's refusal
                refused = "append-only" in str(exc)
            db.session.rollback()
            assert refused == statement.startswith(("UPDATE invoices", "DELETE")), statement
        assert db.session.execute(text("SELECT count(*), min(total_micros) FROM invoices")).one() == (1, 4_000_000)
        db.session.remove()


def test_bad_and_foreign_ids_are_404(client, make_account):
    owner, other = make_account(), make_account()
    _pay_sandbox_checkout(client, owner, 300)
    inv_id = _invoices(client, owner)["invoices"][0]["id"]
    for path in (f"/api/pay/invoices/{inv_id}", f"/api/pay/invoices/{inv_id}.pdf"):
        r = client.get(path, headers=other.headers)
        assert r.status_code == 404 and r.get_json()["error"] == "not_found", path
    for bad in ("inv_nope", "x" * 40):
        assert client.get(f"/api/pay/invoices/{bad}", headers=owner.headers).status_code == 404
        assert client.get(f"/api/pay/invoices/{bad}.pdf", headers=owner.headers).status_code == 404
    assert _invoices(client, other)["invoices"] == []
    r = client.get("/api/pay/invoices", query_string={"cursor": "abc"}, headers=owner.headers)
    assert r.status_code == 400
    r = client.put("/api/account/billing-details", json={"country": "Germany"}, headers=owner.headers)
    assert r.status_code == 400


def test_billing_details_without_a_body_clear_them_as_documented(client, account):
    """The body is documented optional (schemathesis ST201: the document said required, and a
    PUT without one was answered 200): no body clears the details, as ``{}`` does; a body under
    another media type is still refused."""
    client.put("/api/account/billing-details", json={"name": "Acme", "country": "de"}, headers=account.headers)
    r = client.put("/api/account/billing-details", data="name=Acme", content_type="text/plain",
                   headers=account.headers)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"
    r = client.put("/api/account/billing-details", headers=account.headers)
    assert r.status_code == 200 and (r.get_json()["name"], r.get_json()["country"]) == (None, None)
    op = client.get("/openapi.json").get_json()["paths"]["/api/account/billing-details"]["put"]
    assert op["requestBody"]["required"] is False


def test_x402_and_other_payments_without_one_are_invoiced_by_the_sweep_once(app, make_account):
    from app.models import Payment
    from app.services.billing import invoices

    acct = make_account()
    with app.app_context():
        db.session.add(Payment(id="pay_x402test", account_id=acct.id, method="x402", kind="x402", processor="x402",
                               mode="live", provider_id="x402:base:0xabc:0x1", amount_micros=10_000,
                               status="succeeded", meta={"network": "base"}))
        db.session.commit()
        assert invoices.issue_missing() == 1
        assert invoices.issue_missing() == 0
        inv = db.session.execute(db.select(invoices.Invoice).where(invoices.Invoice.payment_id == "pay_x402test")) \
            .scalar_one()
        assert inv.document["lines"][0]["description"] == "Prepaid credit: x402 payment (base)"
        assert inv.document["total"] == "0.01"
        db.session.remove()


def _usage(app, account_id, product, day, spend_micros, calls=3):
    from tests import usage_seed

    with app.app_context():
        usage_seed.record(account_id, product, spend_micros=spend_micros, calls=calls, at=day)
        db.session.commit()
        db.session.remove()


def test_monthly_usage_invoice_once_per_account_and_month_also_for_organisations(client, app, make_account):
    from app.services.billing import invoices

    person, idle = make_account(), make_account()
    org = client.post("/api/orgs", json={"name": "Acme Org"}, headers=person.headers).get_json()["id"]
    _usage(app, person.id, "weather", datetime(2026, 10, 3, tzinfo=timezone.utc), 1_230_000, calls=41)
    _usage(app, person.id, "chat:gpt-4o-mini", datetime(2026, 10, 9, tzinfo=timezone.utc), 630)
    _usage(app, org, "weather", datetime(2026, 10, 31, tzinfo=timezone.utc), 2_000_000)
    _usage(app, idle.id, "weather", datetime(2026, 11, 1, tzinfo=timezone.utc), 5_000_000)  # November: not yet
    with app.app_context():
        # within the grace period after the month: nothing yet
        assert invoices.issue_usage_due(datetime(2026, 11, 1, 0, 30, tzinfo=timezone.utc)) is None
        now = datetime(2026, 11, 2, tzinfo=timezone.utc)
        db.session.remove()

    def run():
        with app.app_context():
            try:
                return invoices.issue_usage_due(now)["issued"]
            finally:
                db.session.remove()

    assert sorted(at_once(3, run)) in ([0, 0, 2], [0, 1, 1])  # two schedulers and a retry: each once
    assert run() == 0
    listed = _invoices(client, person)["invoices"]
    assert [(i["kind"], i["period"], i["total"]) for i in listed] == [("usage", "2026-10", "1.23063")]
    doc = client.get(f"/api/pay/invoices/{listed[0]['id']}", headers=person.headers).get_json()["document"]
    assert [(line["description"], line["quantity"]) for line in doc["lines"]] == [
        ("Module calls: weather", 41), ("Chat completions: gpt-4o-mini", 3)]
    assert doc["amount_due"] == "0.00" and doc["period"]["month"] == "2026-10"
    org_list = _invoices(client, person, org_id=org)["invoices"]
    assert [(i["kind"], i["total"]) for i in org_list] == [("usage", "2.00")]
    pdf = client.get(f"/api/pay/invoices/{org_list[0]['id']}.pdf", query_string={"org_id": org},
                     headers=person.headers)
    assert "Acme Org" in _pdf_text(pdf.data) and "2.00" in _pdf_text(pdf.data)
    assert _invoices(client, idle)["invoices"] == []


def test_console_billing_lists_invoices_with_downloads_of_ones_own_only(signed_in):
    owner_client, owner = signed_in()
    other_client, _ = signed_in()
    _pay_sandbox_checkout(owner_client, owner, 2500)
    inv = _invoices(owner_client, owner)["invoices"][0]
    page = owner_client.get("/billing").get_data(as_text=True)
    link = f"/billing/invoices/{inv['id']}.pdf"
    assert inv["number"] in page and link in page
    pdf = owner_client.get(link)
    assert pdf.status_code == 200 and pdf.data.startswith(b"%PDF") and "25.00" in _pdf_text(pdf.data)
    assert other_client.get(link).status_code == 404
    assert inv["number"] not in other_client.get("/billing").get_data(as_text=True)


def test_an_auto_top_up_gets_its_invoice(app, client, make_account, ledger_clean):
    from tests.api.test_auto_topup import _crossed, _runs, _start

    acct = _crossed(app, client, make_account)
    assert _start(app) == 1
    (status, _, payment_id), = _runs(app, acct)
    assert status == "succeeded"
    listed = _invoices(client, acct)["invoices"]
    assert [(i["payment_id"], i["total"]) for i in listed] == [(payment_id, "20.00")]
    doc = client.get(f"/api/pay/invoices/{listed[0]['id']}", headers=acct.headers).get_json()["document"]
    assert doc["lines"][0]["description"] == "Prepaid credit: Auto top-up"
    # no billing details: the buyer's name falls back to the e-mail, printed once on the PDF
    assert doc["buyer"]["name"] == doc["buyer"]["email"]
    pdf = client.get(f"/api/pay/invoices/{listed[0]['id']}.pdf", headers=acct.headers)
    assert _pdf_text(pdf.data).count(doc["buyer"]["email"]) == 1
    ledger_clean()


def test_cli_issues_a_months_usage_invoices_once(app, make_account):
    acct = make_account()
    _usage(app, acct.id, "weather", datetime(2026, 9, 14, tzinfo=timezone.utc), 40_000)
    runner = app.test_cli_runner()
    assert "not over" in runner.invoke(args=["payments", "invoice-usage", "--month", "2999-01"]).output
    first = runner.invoke(args=["payments", "invoice-usage", "--month", "2026-09"])
    assert first.exit_code == 0 and '"issued": ["INV-' in first.output, first.output
    assert '"issued": []' in runner.invoke(args=["payments", "invoice-usage", "--month", "2026-09"]).output
    assert '"issued": 0' in runner.invoke(args=["payments", "invoice-missing"]).output


def _sandbox_refund(app, payment_id, cents=None):
    from app.services.billing.sandbox_checkout import sandbox_refund

    with app.app_context():
        out = sandbox_refund(payment_id, cents)["event"]
        db.session.remove()
    return out


def test_a_refund_issues_a_credit_note_and_the_invoice_shows_what_was_paid(client, make_account, app,
                                                                          ledger_clean):
    """A refunded payment keeps its issued invoice (immutable) and gets a numbered credit note
    per refund; the invoice shows the credit and the net amount the customer paid."""
    acct = make_account()
    paid = _pay_sandbox_checkout(client, acct, 2500)
    inv = _invoices(client, acct)["invoices"][0]
    assert inv["credited"] == "0.00" and inv["net_total"] == "25.00" and inv["credit_notes"] == []
    assert _sandbox_refund(app, paid, 1000)["outcome"] == "refunded"
    assert _sandbox_refund(app, paid, 500)["outcome"] == "refunded"
    listed = _invoices(client, acct)["invoices"]
    assert [i["id"] for i in listed] == [inv["id"]]  # credit notes hang on their invoice, not in the list
    inv = client.get(f"/api/pay/invoices/{inv['id']}", headers=acct.headers).get_json()
    assert inv["total"] == "25.00" and inv["credited"] == "15.00" and inv["net_total"] == "10.00"
    notes = inv["credit_notes"]
    assert [n["total"] for n in notes] == ["10.00", "5.00"]
    first, second = (int(n["number"].rsplit("-", 1)[1]) for n in notes)
    assert notes[0]["number"].startswith("CN-") and second == first + 1  # their own gap-free series
    note = client.get(f"/api/pay/invoices/{notes[0]['id']}", headers=acct.headers).get_json()
    doc = note["document"]
    assert note["kind"] == "credit_note" and doc["credits"]["invoice_number"] == inv["number"]
    assert doc["total_micros"] == 10_000_000 and doc["lines"][0]["amount"] == "10.00"
    assert doc["buyer"] == inv["document"]["buyer"] and doc["paid"]["status"] == "refunded"
    words = _pdf_text(client.get(notes[0]["pdf_url"], headers=acct.headers).data)
    assert "CREDIT NOTE" in words and inv["number"] in words and "Total credited: 10.00 USD" in words
    assert "Amount due" not in words
    # a replayed refund event (the same refunded total) issues nothing
    from app.services.billing import payment_events  # noqa: F401
    with app.app_context():
        from app.models import Payment
        from app.services.billing import invoices
        from app.services.platform.uow import unit_of_work

        with unit_of_work():
            assert invoices.issue_credit_note(db.session.get(Payment, paid)) is None
        db.session.remove()
    assert len(client.get(f"/api/pay/invoices/{inv['id']}", headers=acct.headers).get_json()["credit_notes"]) == 2
    # the rest refunded: net 0
    _sandbox_refund(app, paid)
    inv = client.get(f"/api/pay/invoices/{inv['id']}", headers=acct.headers).get_json()
    assert inv["credited"] == "25.00" and inv["net_total"] == "0.00" and len(inv["credit_notes"]) == 3
    assert inv["document"]["total"] == "25.00"  # the issued invoice itself never changes
    ledger_clean()


def test_console_billing_shows_a_refunds_credit_note_and_the_net(signed_in, app):
    owner_client, owner = signed_in()
    paid = _pay_sandbox_checkout(owner_client, owner, 2500)
    _sandbox_refund(app, paid, 1000)
    note = _invoices(owner_client, owner)["invoices"][0]["credit_notes"][0]
    page = owner_client.get("/billing").get_data(as_text=True)
    assert f"Credit note {note['number']}" in page and "net $15.00" in page
    pdf = owner_client.get(f"/billing/invoices/{note['id']}.pdf")
    assert pdf.status_code == 200 and "CREDIT NOTE" in _pdf_text(pdf.data)


def test_a_months_usage_invoice_waits_for_its_pending_calls_so_a_later_refund_is_not_on_it(client, app,
                                                                                           make_account):
    """A call still pending when the month's usage invoice is due may yet be refunded: the
    invoice waits until no call of the month is open, so it never shows a refunded call."""
    from app.models import ModuleCall
    from app.models.base import utcnow
    from app.services.billing import invoices
    from app.services.money import refunds

    acct = make_account()
    now = utcnow()
    month = now.strftime("%Y-%m")
    after = datetime(now.year + (now.month == 12), now.month % 12 + 1, 2, tzinfo=timezone.utc)
    _usage(app, acct.id, "weather", now, 1_000_000, calls=2)
    with app.app_context():
        db.session.add(ModuleCall(id="call_pendinginvoice01", account_id=acct.id, module_id=1, module_slug="weather",
                                  action="forecast", mode="live", status="pending", price_micros=500_000,
                                  charged=False, created_at=now, deadline_at=now))
        db.session.commit()
        assert invoices.issue_usage_due(after) is None  # a call of the month is still open
        assert refunds.refund("call_pendinginvoice01", "swept", now) is True
        assert invoices.issue_usage_due(after) == {"month": month, "issued": 1}
        db.session.remove()
    listed = _invoices(client, acct)["invoices"]
    assert [(i["kind"], i["period"], i["total"]) for i in listed] == [("usage", month, "1.00")]


def test_the_sweep_issues_the_credit_note_of_a_refund_made_before_credit_notes_existed(app, make_account):
    from app.models import Payment
    from app.services.billing import invoices

    acct = make_account()
    with app.app_context():
        db.session.add(Payment(id="pay_oldrefund01", account_id=acct.id, method="card", kind="charge",
                               processor="sandbox", mode="live", amount_micros=10_000_000,
                               refunded_micros=3_000_000, status="partially_refunded"))
        db.session.commit()
        assert invoices.issue_missing() == 2  # its invoice, then its credit note
        assert invoices.issue_missing() == 0
        inv = invoices._payment_invoice("pay_oldrefund01")
        view = invoices.view(inv)
        assert view["credited"] == "3.00" and view["net_total"] == "7.00"
        db.session.remove()

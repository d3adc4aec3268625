"""x402 on SPEC endpoint 1: the 402 payment request, paying with X-Payment /
PAYMENT-SIGNATURE (payloads made by the official x402 client), replay, refusals, and a
provider failure after payment (the payment stays as credit)."""
from __future__ import annotations

import base64
import json

import pytest
from sqlalchemy import select
from eth_account import Account as EthAccount
from x402 import x402ClientSync
from x402.http.utils import decode_payment_required_header, decode_payment_response_header
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner

from app.extensions import db
from app.models import ModuleCall, Payment, X402Authorization
from app.services.money import ledger
from tests.gateway_helpers import balance_cents, call, mod, provider, provider_server  # noqa: F401
from tests.standins import facilitator_server

PAY_TO = "0x000000000000000000000000000000000000f402"


@pytest.fixture
def x402cfg(app, monkeypatch):
    monkeypatch.setitem(app.config, "X402_PAY_TO", PAY_TO)
    monkeypatch.setitem(app.config, "X402_NETWORKS", ["base"])
    assert app.config["X402_FACILITATOR_URL"]  # the stand-in facilitator (tests/conftest.py)
    return app


def _pay(r402, wallet) -> str:
    """What an x402 client sends after this 402: the PAYMENT-SIGNATURE header value."""
    required = decode_payment_required_header(r402.headers["PAYMENT-REQUIRED"])
    client = register_exact_evm_client(x402ClientSync(), EthAccountSigner(wallet))
    payload = client.create_payment_payload(required)
    return base64.b64encode(payload.model_dump_json(by_alias=True, exclude_none=True).encode()).decode()


def test_402_carries_the_x402_payment_request(client, make_account, mod, x402cfg):
    acct = make_account(cents=0)
    r = call(client, acct, {"action": "ok"})
    assert r.status_code == 402
    body = r.get_json()
    assert body["error"] == "payment_required" and "/api/wallet/fund" in body["message"]
    assert r.headers["X-Price-Cents"] == "3" and r.headers["X-Pay-To"] == PAY_TO and r.headers["X-Nonce"]
    assert body["x402Version"] == 1 and body["accepts"][0]["maxAmountRequired"] == "30000"
    assert body["accepts"][0]["resource"].endswith("/v1/module/svc/call")
    v2 = decode_payment_required_header(r.headers["PAYMENT-REQUIRED"])
    req = v2.accepts[0]
    assert (req.scheme, req.network, req.amount) == ("exact", "eip155:8453", "30000")
    assert req.pay_to.lower() == PAY_TO and req.extra == {"name": "USD Coin", "version": "2"}
    # the message names x402 v2's header (it named only v1's X-Payment, which a v2 client
    # reading it would not send), in the body and in the v2 request's `error`
    assert "PAYMENT-SIGNATURE" in body["message"] and "PAYMENT-SIGNATURE" in v2.error


def test_402_carries_the_bazaar_metadata_of_the_action(client, make_account, mod, x402cfg):
    """The x402 Bazaar extension (input/output schema) in the v2 request's ``extensions``
    and, for v1 clients, in each requirement's ``outputSchema``; both as the package reads them."""
    from x402.extensions.bazaar import validate_discovery_extension, validate_discovery_extension_spec
    from x402.extensions.bazaar.types import parse_discovery_extension
    from x402.extensions.bazaar.v1.facilitator import extract_discovery_info_v1

    acct = make_account(cents=0)
    r = call(client, acct, {"action": "ok"})
    ext = decode_payment_required_header(r.headers["PAYMENT-REQUIRED"]).extensions["bazaar"]
    assert ext["info"]["input"] == {"type": "http", "method": "POST", "bodyType": "json", "body": {"action": "ok"}}
    assert ext["info"]["output"]["example"]["module"] == "svc"
    assert ext["schema"]["properties"]["output"]["properties"]["example"]["required"][:2] == ["ok", "module"]
    assert validate_discovery_extension(parse_discovery_extension(ext)).valid
    assert validate_discovery_extension_spec(ext).valid
    # the discovery list names the same metadata
    listed = {i["mcpTool"]: i for i in client.get("/.well-known/x402").get_json()["items"]}
    assert listed["svc__ok"]["extensions"]["bazaar"] == ext
    info = extract_discovery_info_v1(r.get_json()["accepts"][0])
    assert info.input.method == "POST" and info.input.body == {"action": "ok"}
    # a refused payment's fresh request carries it too
    data = json.loads(base64.b64decode(_pay(r, EthAccount.create())))
    data["payload"]["authorization"]["value"] = "10000"
    r = call(client, acct, {"action": "ok"},
             headers={"PAYMENT-SIGNATURE": base64.b64encode(json.dumps(data).encode()).decode()})
    assert r.status_code == 402 and r.get_json()["reason"] == "insufficient_amount"
    assert decode_payment_required_header(r.headers["PAYMENT-REQUIRED"]).extensions["bazaar"] == ext


@pytest.mark.parametrize("header", ["PAYMENT-SIGNATURE", "X-Payment"])
def test_paid_call_credits_then_charges_and_is_single_use(app, client, make_account, mod, x402cfg, header,
                                                          ledger_clean):
    acct = make_account(cents=0)
    wallet = EthAccount.create()
    paid = _pay(call(client, acct, {"action": "ok"}), wallet)
    r = call(client, acct, {"action": "ok"}, headers={header: paid})
    assert r.status_code == 200, r.get_json()
    settle = decode_payment_response_header(r.headers["PAYMENT-RESPONSE"])
    assert settle.success and settle.payer == wallet.address and settle.network == "eip155:8453"
    assert balance_cents(app, acct.id) == 0
    with app.app_context():
        assert ledger.balance(ledger.REVENUE) == 30_000
        p = db.session.query(Payment).filter_by(account_id=acct.id, method="x402").one()
        assert p.status == "succeeded" and p.amount_micros == 30_000
        db.session.remove()
    hist = client.get("/api/pay/history", headers=acct.headers).get_json()["payments"]
    assert hist[0]["method"] == "x402" and hist[0]["amount_micros"] == 30_000
    # The same payment again: refused, nothing charged, a fresh payment request attached.
    r = call(client, acct, {"action": "ok"}, headers={header: paid})
    assert r.status_code == 402 and r.get_json()["error"] == "payment_invalid"
    assert r.get_json()["reason"] == "replayed" and r.headers["PAYMENT-REQUIRED"]
    with app.app_context():
        assert db.session.query(ModuleCall).filter_by(account_id=acct.id).count() == 1
        db.session.remove()
    ledger_clean()


def test_underpayment_and_wrong_recipient_are_refused(app, client, make_account, mod, x402cfg, ledger_clean):
    acct = make_account(cents=0)
    wallet = EthAccount.create()
    r402 = call(client, acct, {"action": "ok"})
    # paid for a cheaper call: 1 cent instead of 3
    cheap = _pay(call(client, acct, {"action": "ok"}), wallet)
    data = json.loads(base64.b64decode(cheap))
    data["payload"]["authorization"]["value"] = "10000"
    r = call(client, acct, {"action": "ok"}, headers={"PAYMENT-SIGNATURE": base64.b64encode(
        json.dumps(data).encode()).decode()})
    assert r.status_code == 402 and r.get_json()["reason"] == "insufficient_amount"
    # the fresh payment request is the one the 402 made: same resource, same Bazaar metadata
    fresh = decode_payment_required_header(r.headers["PAYMENT-REQUIRED"])
    first = decode_payment_required_header(r402.headers["PAYMENT-REQUIRED"])
    assert fresh.resource == first.resource and fresh.extensions == first.extensions
    assert fresh.accepts == first.accepts
    # and x402 v1 clients find it in the body, as in the first 402 (before: no x402Version/accepts)
    body, first_body = r.get_json(), r402.get_json()
    assert (body["x402Version"], body["accepts"]) == (1, first_body["accepts"])
    app.config["X402_PAY_TO"] = "0x" + "ab" * 20
    try:
        r = call(client, acct, {"action": "ok"}, headers={"PAYMENT-SIGNATURE": _pay(r402, wallet)})
    finally:
        app.config["X402_PAY_TO"] = PAY_TO
    assert r.status_code == 402 and r.get_json()["reason"] == "wrong_recipient"
    assert balance_cents(app, acct.id) == 0
    ledger_clean()


def test_refused_settlement_says_so_in_payment_response(app, client, make_account, mod, x402cfg, monkeypatch,
                                                       ledger_clean):
    """The facilitator verifies the payment and then refuses to settle it (the payer's USDC is
    gone): 402 ``payment_invalid`` with its reason, a fresh payment request, and — as x402 v2's
    HTTP transport shows for a failed settlement — ``PAYMENT-RESPONSE`` with ``success:
    false`` and the ``errorReason``. Before, the header was missing: x402's client hooks saw
    no settlement result. Nothing is credited or charged."""
    acct = make_account(cents=0)
    with facilitator_server() as fac:
        monkeypatch.setitem(app.config, "X402_FACILITATOR_URL", fac.url)
        fac.settle = {"success": False, "errorReason": "insufficient_funds", "transaction": "",
                      "network": "eip155:8453"}
        wallet = EthAccount.create()
        r = call(client, acct, {"action": "ok"}, headers={"PAYMENT-SIGNATURE": _pay(call(client, acct, {"action": "ok"}),
                                                                                      wallet)})
    assert r.status_code == 402, r.get_json()
    assert r.get_json()["error"] == "payment_invalid" and r.get_json()["reason"] == "insufficient_funds"
    assert decode_payment_required_header(r.headers["PAYMENT-REQUIRED"]).accepts[0].amount == "30000"
    settle = decode_payment_response_header(r.headers["PAYMENT-RESPONSE"])
    assert settle.success is False and settle.error_reason == "insufficient_funds"
    assert settle.network == "eip155:8453" and settle.payer == wallet.address and settle.transaction == ""
    assert "PAYMENT-RESPONSE" in r.headers["Access-Control-Expose-Headers"]
    assert balance_cents(app, acct.id) == 0
    with app.app_context():
        assert db.session.execute(select(X402Authorization.status).where(
            X402Authorization.account_id == acct.id)).scalars().all() == ["failed"]
        db.session.remove()
    ledger_clean()


def test_wrong_network_is_named_the_way_the_payment_names_it(app, client, make_account, mod, x402cfg, ledger_clean):
    """A v2 payment names networks in CAIP-2 (``eip155:1``); the refusal names it and the
    accepted ones that way (it said "Network `ethereum` is not accepted; use one of base",
    names a v2 client never sent nor can send). Nothing is charged."""
    acct = make_account(cents=0)
    required = decode_payment_required_header(call(client, acct, {"action": "ok"}).headers["PAYMENT-REQUIRED"])
    required.accepts[0].network = "eip155:1"
    required.accepts[0].asset = "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"  # USDC on Ethereum
    payer = register_exact_evm_client(x402ClientSync(), EthAccountSigner(EthAccount.create()))
    payer.set_spend_controls(False)
    payload = payer.create_payment_payload(required)
    r = call(client, acct, {"action": "ok"}, headers={"PAYMENT-SIGNATURE": base64.b64encode(
        payload.model_dump_json(by_alias=True, exclude_none=True).encode()).decode()})
    assert r.status_code == 402 and r.get_json()["reason"] == "unsupported_network"
    assert "`eip155:1`" in r.get_json()["message"] and "eip155:8453" in r.get_json()["message"], r.get_json()
    assert balance_cents(app, acct.id) == 0
    ledger_clean()


def test_provider_failure_after_payment_leaves_credit(app, client, make_account, mod, x402cfg, ledger_clean):
    acct = make_account(cents=0)
    paid = _pay(call(client, acct, {"action": "boom"}), EthAccount.create())
    r = call(client, acct, {"action": "boom"}, headers={"PAYMENT-SIGNATURE": paid})
    assert r.status_code == 502 and r.get_json()["error"] == "provider_error"
    # the payment was settled: the answer says so, as a paid answer and the chat's 502 do
    settle = decode_payment_response_header(r.headers["PAYMENT-RESPONSE"])
    assert settle.success and settle.amount == "30000"
    assert balance_cents(app, acct.id) == 3  # the payment became account credit
    with app.app_context():
        assert ledger.balance(ledger.REVENUE) == 0
        db.session.remove()
    # and that credit pays the next call without any new payment
    assert call(client, acct, {"action": "ok"}).status_code == 200
    assert balance_cents(app, acct.id) == 0
    ledger_clean()


def test_credit_spent_before_the_open_answers_402_and_keeps_the_credit(app, client, make_account, mod,
                                                                       x402cfg, monkeypatch, ledger_clean):
    """The payment is booked as credit in its own unit of work, then the call is opened the
    one way every call is. If a concurrent charge spends the credit in between, the call is
    refused with 402, says the payment was settled (PAYMENT-RESPONSE), and the credit is
    where the concurrent charge put it: no money lost or created, no call written."""
    from app.services.billing import x402

    acct = make_account(cents=0)
    booked = x402.book

    def book_then_spent(pay, call_id=None):  # a concurrent call spends the credit at once
        out = booked(pay, call_id=call_id)
        ledger.post("module_call", [(ledger.customer(acct.id), -30_000), (ledger.REVENUE, 30_000)],
                    ref="call:concurrent", account_id=acct.id)
        return out

    monkeypatch.setattr(x402, "book", book_then_spent)
    paid = _pay(call(client, acct, {"action": "ok"}), EthAccount.create())
    r = call(client, acct, {"action": "ok"}, headers={"PAYMENT-SIGNATURE": paid})
    assert r.status_code == 402 and r.get_json()["error"] == "payment_required"
    assert decode_payment_response_header(r.headers["PAYMENT-RESPONSE"]).success
    assert balance_cents(app, acct.id) == 0
    with app.app_context():
        assert ledger.balance(ledger.REVENUE) == 30_000
        assert db.session.query(Payment).filter_by(account_id=acct.id, method="x402").one().amount_micros == 30_000
        assert db.session.query(ModuleCall).filter_by(account_id=acct.id).count() == 0
        db.session.remove()
    ledger_clean()


def test_payment_signature_is_preferred_over_x_payment(app, client, make_account, mod, x402cfg, ledger_clean):
    """Both payment headers sent: the v2 PAYMENT-SIGNATURE is the one read (x402.header_from,
    and the chat routes), so a stale X-Payment beside it does not sink the call."""
    acct = make_account(cents=0)
    paid = _pay(call(client, acct, {"action": "ok"}), EthAccount.create())
    r = call(client, acct, {"action": "ok"}, headers={"PAYMENT-SIGNATURE": paid, "X-Payment": "bm90IGEgcGF5bWVudA"})
    assert r.status_code == 200, r.get_json()
    assert decode_payment_response_header(r.headers["PAYMENT-RESPONSE"]).success
    ledger_clean()


def test_payment_is_ignored_when_the_balance_covers_the_call(app, client, make_account, mod, x402cfg):
    acct = make_account(cents=10)
    r = call(client, acct, {"action": "ok"}, headers={"X-Payment": "not base64 at all"})
    assert r.status_code == 200 and "PAYMENT-RESPONSE" not in r.headers
    assert balance_cents(app, acct.id) == 7


def test_x402_v1_body_and_x_payment_response(app, client, make_account, mod, x402cfg, ledger_clean):
    """A v1 client reads `accepts` from the body, pays with X-Payment (base64url), and gets
    X-PAYMENT-RESPONSE."""
    from x402.schemas.v1 import PaymentRequiredV1

    acct = make_account(cents=0)
    wallet = EthAccount.create()
    body = call(client, acct, {"action": "ok"}).get_json()
    required = PaymentRequiredV1.model_validate({"x402Version": 1, "accepts": body["accepts"],
                                                 "error": body["message"]})
    payload = register_exact_evm_client(x402ClientSync(), EthAccountSigner(wallet)).create_payment_payload(required)
    header = base64.urlsafe_b64encode(payload.model_dump_json(by_alias=True, exclude_none=True).encode())
    r = call(client, acct, {"action": "ok"}, headers={"X-Payment": header.decode().rstrip("=")})
    assert r.status_code == 200, r.get_json()
    settle = decode_payment_response_header(r.headers["X-PAYMENT-RESPONSE"])
    assert settle.success and settle.network == "base" and settle.payer == wallet.address
    ledger_clean()


def test_without_facilitator_a_live_key_is_not_offered_x402(app, client, make_account, mod, x402cfg,
                                                            monkeypatch, ledger_clean):
    """Sandbox settlement serves test mode only: with no facilitator configured the 402 of a
    live key offers no x402 (no PAYMENT-REQUIRED, no X-Pay-To, no `accepts`), and a payment
    is refused (`facilitator_required`) — nothing reserved, nothing credited."""
    acct = make_account(cents=0)
    paid = _pay(call(client, acct, {"action": "ok"}), EthAccount.create())  # made while x402 was offered
    monkeypatch.setitem(app.config, "X402_FACILITATOR_URL", None)
    r = call(client, acct, {"action": "ok"})
    body = r.get_json()
    assert r.status_code == 402 and body["error"] == "payment_required" and body["pay_to"] is None
    assert "PAYMENT-REQUIRED" not in r.headers and "X-Pay-To" not in r.headers and "accepts" not in body
    assert "X-Payment" not in body["message"] and "/api/wallet/fund" in body["message"]
    r = call(client, acct, {"action": "ok"}, headers={"PAYMENT-SIGNATURE": paid})
    assert r.status_code == 402 and r.get_json()["error"] == "payment_invalid"
    assert r.get_json()["reason"] == "facilitator_required" and "PAYMENT-REQUIRED" not in r.headers
    assert balance_cents(app, acct.id) == 0
    with app.app_context():
        assert db.session.query(X402Authorization).count() == 0
        assert db.session.query(ModuleCall).filter_by(account_id=acct.id).count() == 0
        db.session.remove()
    ledger_clean()

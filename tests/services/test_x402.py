"""x402 verification service: decoding, EIP-3009 signature checks, the refusals, single
use, facilitator settlement and booking. Payloads are made by the official x402 client."""
from __future__ import annotations

import base64
import json
import time

import pytest
from eth_account import Account as EthAccount
from x402 import x402ClientSync
from x402.http.utils import decode_payment_required_header, decode_payment_response_header
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.schemas import PaymentRequired
from x402.schemas.v1 import PaymentRequiredV1

from app.extensions import db
from app.services.platform.uow import unit_of_work
from app.models import Payment, X402Authorization
from app.services.money import ledger
from app.services.billing import x402
from tests.standins import facilitator_server

PAY_TO = "0x000000000000000000000000000000000000f402"


@pytest.fixture
def cfg(app, monkeypatch):
    monkeypatch.setitem(app.config, "X402_PAY_TO", PAY_TO)
    monkeypatch.setitem(app.config, "X402_NETWORKS", ["base", "polygon"])
    # tests below point it at facilitators of their own: restored afterwards, so the
    # suite's stand-in stays the default for the tests that follow (it leaked before)
    monkeypatch.setitem(app.config, "X402_FACILITATOR_URL", app.config["X402_FACILITATOR_URL"])
    with app.app_context():
        yield app
        db.session.remove()


@pytest.fixture
def wallet():
    return EthAccount.create()


def _client(wallet):
    return register_exact_evm_client(x402ClientSync(), EthAccountSigner(wallet))


def _header_v2(wallet, price_cents=5):
    body, headers = x402.payment_required(price_cents, "http://gw.test/v1/module/echo/call")
    required = decode_payment_required_header(headers["PAYMENT-REQUIRED"])
    payload = _client(wallet).create_payment_payload(required)
    return base64.b64encode(payload.model_dump_json(by_alias=True, exclude_none=True).encode()).decode()


def _header_v1(wallet, price_cents=5):
    body, _ = x402.payment_required(price_cents, "http://gw.test/v1/module/echo/call")
    payload = _client(wallet).create_payment_payload(PaymentRequiredV1.model_validate(body))
    return base64.urlsafe_b64encode(payload.model_dump_json(by_alias=True, exclude_none=True).encode()).decode().rstrip("=")


def _mutate(header: str, fn) -> str:
    data = json.loads(base64.b64decode(header + "=" * (-len(header) % 4), altchars=b"-_"))
    fn(data)
    return base64.b64encode(json.dumps(data).encode()).decode()


def test_payment_request_shapes(cfg):
    body, headers = x402.payment_required(7, "http://gw.test/v1/module/echo/call", error="Balance is zero")
    v2 = decode_payment_required_header(headers["PAYMENT-REQUIRED"])
    assert isinstance(v2, PaymentRequired) and v2.x402_version == 2
    req = v2.accepts[0]
    assert (req.scheme, req.network, req.amount, req.pay_to) == ("exact", "eip155:8453", "70000", PAY_TO)
    assert req.asset == "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
    assert req.extra == {"name": "USD Coin", "version": "2"} and req.max_timeout_seconds == 300
    assert [a.network for a in v2.accepts] == ["eip155:8453", "eip155:137"]
    v1 = PaymentRequiredV1.model_validate(body)
    assert v1.accepts[0].network == "base" and v1.accepts[0].max_amount_required == "70000"


@pytest.mark.parametrize("make", [_header_v2, _header_v1])
def test_client_payload_verifies(cfg, wallet, make):
    facts = x402.verify(x402.decode(make(wallet)), 50_000)
    assert facts["payer"] == wallet.address and facts["value"] == 50_000 and facts["chain"] == "base"


@pytest.mark.parametrize("value", ["", "%%%", "bm90IGpzb24", base64.b64encode(b"[1,2]").decode(),
                                   base64.b64encode(b'{"x402Version": 2}').decode(), "A" * 9000])
def test_undecodable_is_400(cfg, value):
    with pytest.raises(x402.InvalidPayment) as exc:
        x402.decode(value)
    assert exc.value.status == 400 and exc.value.code == "invalid_payment"


@pytest.mark.parametrize("mutation,reason", [
    (lambda d: d["payload"]["authorization"].update(to="0x" + "12" * 20), "wrong_recipient"),
    (lambda d: d["payload"]["authorization"].update(value="49999"), "insufficient_amount"),
    (lambda d: d["payload"]["authorization"].update(validBefore=str(int(time.time()) - 1)), "expired"),
    (lambda d: d["payload"]["authorization"].update(validAfter=str(int(time.time()) + 600)), "not_yet_valid"),
    (lambda d: d["accepted"].update(network="eip155:1"), "unsupported_network"),
    (lambda d: d["accepted"].update(scheme="upto"), "unsupported_scheme"),
    (lambda d: d["accepted"].update(asset="0x" + "34" * 20), "wrong_asset"),
    (lambda d: d["payload"].update(signature="0x" + "00" * 65), "invalid_signature"),
    (lambda d: d["payload"]["authorization"].update(value="60000"), "invalid_signature"),  # tampered
])
def test_refusals_are_402_with_reason(cfg, wallet, mutation, reason):
    header = _mutate(_header_v2(wallet), mutation)
    with pytest.raises(x402.PaymentInvalid) as exc:
        x402.verify(x402.decode(header), 50_000)
    assert exc.value.status == 402 and exc.value.code == "payment_invalid" and exc.value.reason == reason


def test_sandbox_settlement_credits_test_money_only(cfg, make_account, wallet, ledger_clean):
    """A test-mode payment settles locally (sandbox) and credits the test balance
    (``acct_test:``) from ``external:sandbox``; the live balance never moves."""
    acct = make_account(cents=0)
    header = _header_v2(wallet, 5)
    pay = x402.accept(header, account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x", mode="test")
    assert pay.sandbox and pay.value_atomic == 50_000
    pid = x402.book(pay, call_id="call_1")
    db.session.commit()
    payment = db.session.get(Payment, pid)
    assert (payment.status, payment.mode, payment.processor) == ("succeeded", "test", "sandbox")
    assert ledger.balance(ledger.customer(acct.id, "test")) == 50_000
    assert ledger.balance(ledger.customer(acct.id)) == 0 and ledger.cached_balance(acct.id) == 0
    assert ledger.balance(ledger.external("sandbox")) == -50_000
    assert db.session.execute(db.select(X402Authorization.status)).scalar_one() == "settled"
    resp = decode_payment_response_header(x402.response_headers(pay)["PAYMENT-RESPONSE"])
    assert resp.success and resp.payer == wallet.address and resp.network == "eip155:8453"
    with pytest.raises(x402.PaymentInvalid) as exc:
        x402.accept(header, account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
    assert exc.value.reason == "replayed"
    ledger_clean()


def test_live_payment_without_facilitator_is_refused(cfg, make_account, wallet):
    """No facilitator: x402 is not offered, and a live payment is refused before anything is
    reserved or credited (sandbox settlement never serves live money)."""
    acct = make_account(cents=0)
    header = _header_v2(wallet, 5)
    cfg.config["X402_FACILITATOR_URL"] = None
    assert not x402.offered() and x402.payment_required(5, "http://gw.test/x") == ({}, {})
    with pytest.raises(x402.PaymentInvalid) as exc:
        x402.accept(header, account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
    assert exc.value.reason == "facilitator_required" and "X402_FACILITATOR_URL" in exc.value.message
    assert db.session.query(X402Authorization).count() == 0 and ledger.balance(ledger.customer(acct.id)) == 0


def test_test_mode_reservation_is_never_submitted_to_a_facilitator(cfg, make_account, wallet):
    """A sandbox reservation whose booking never committed: reconciliation releases it
    without asking the facilitator to settle it (that would move real USDC for play money)."""
    acct = make_account(cents=0)
    with facilitator_server() as fac:
        cfg.config["X402_FACILITATOR_URL"] = fac.url
        x402.accept(_header_v2(wallet), account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x",
                    mode="test")  # the process dies before booking
        assert x402.reconcile(older_than_seconds=0)["released"] == 1
        assert fac.calls == []
    assert db.session.execute(db.select(X402Authorization.status)).scalar_one() == "released"


def test_facilitator_verify_and_settle(cfg, make_account, wallet, ledger_clean):
    acct = make_account(cents=0)
    with facilitator_server() as fac:
        cfg.config["X402_FACILITATOR_URL"] = fac.url
        pay = x402.accept(_header_v2(wallet), account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
        assert [p for p, _ in fac.calls] == ["/verify", "/settle"]
        assert fac.calls[1][1]["paymentRequirements"]["payTo"] == PAY_TO
        assert not pay.sandbox and len(pay.transaction) == 66  # the facilitator's settlement tx hash
        x402.book(pay)
        db.session.commit()
        assert ledger.balance(ledger.external("x402")) == -50_000

        fac.settle = {"success": False, "errorReason": "insufficient_funds", "transaction": "", "network": "x"}
        with pytest.raises(x402.PaymentInvalid) as exc:
            x402.accept(_header_v2(wallet), account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
        assert exc.value.reason == "insufficient_funds"
        fac.verify = {"isValid": False, "invalidReason": "invalid_exact_evm_payload_signature"}
        with pytest.raises(x402.PaymentInvalid):
            x402.accept(_header_v2(wallet), account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
    statuses = sorted(db.session.execute(db.select(X402Authorization.status)).scalars())
    assert statuses == ["failed", "failed", "settled"]
    ledger_clean()


def test_settled_but_unbooked_becomes_credit(cfg, make_account, wallet, ledger_clean):
    acct = make_account(cents=0)
    with facilitator_server() as fac:
        cfg.config["X402_FACILITATOR_URL"] = fac.url
        x402.accept(_header_v2(wallet), account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
    # the process dies here: never booked
    assert x402.book_orphans(older_than_seconds=0) == 1
    assert x402.book_orphans(older_than_seconds=0) == 0
    assert ledger.balance(ledger.customer(acct.id)) == 50_000
    ledger_clean()


def test_header_from_prefers_payment_signature():
    assert x402.header_from({"X-Payment": "a", "PAYMENT-SIGNATURE": "b"}) == "b"
    assert x402.header_from({"X-Payment": "a"}) == "a"
    assert x402.header_from({}) is None


def test_accept_then_book_credits_once_and_a_replay_is_refused(cfg, make_account, wallet, ledger_clean):
    """The gateway seam (module call and chat alike): the payment is accepted (verified,
    reserved, settled) with no transaction open and booked as a credit in a unit of work
    of its own; the charge follows on the balance. A replay of the header is refused."""
    acct = make_account(cents=0)
    header = _header_v2(wallet, 5)
    with pytest.raises(ledger.InsufficientFunds):
        ledger.post("module_call", [(ledger.customer(acct.id), -50_000), (ledger.REVENUE, 50_000)],
                    ref="call:c1", account_id=acct.id)
    db.session.rollback()
    pay = x402.accept(header, account_id=acct.id, price_micros=50_000, mode="live",
                      resource_url="http://gw.test/x")
    with unit_of_work():
        x402.book(pay, call_id="c1")
    assert pay.booked and ledger.balance(ledger.customer(acct.id)) == 50_000
    ledger.post("module_call", [(ledger.customer(acct.id), -50_000), (ledger.REVENUE, 50_000)],
                ref="call:c1", account_id=acct.id)
    db.session.commit()
    assert ledger.balance(ledger.customer(acct.id)) == 0 and ledger.balance(ledger.REVENUE) == 50_000
    with pytest.raises(x402.PaymentInvalid) as exc:
        x402.accept(header, account_id=acct.id, price_micros=50_000, mode="live",
                    resource_url="http://gw.test/x")
    assert exc.value.reason == "replayed"
    assert db.session.query(Payment).filter_by(method="x402").count() == 1
    ledger_clean()


def test_a_settled_payment_whose_booking_never_committed_is_booked_by_the_sweep(
        cfg, make_account, wallet, ledger_clean):
    """Settled but the process died before its booking committed: the sweep books it as
    credit (reservation and settlement commit in their own units of work)."""
    acct = make_account(cents=0)
    with facilitator_server() as fac:
        cfg.config["X402_FACILITATOR_URL"] = fac.url
        x402.accept(_header_v2(wallet), account_id=acct.id, price_micros=50_000, mode="live",
                    resource_url="http://gw.test/x")
    booked = x402.book_orphans(older_than_seconds=0)
    assert booked == 1 and ledger.balance(ledger.customer(acct.id)) == 50_000
    ledger_clean()


def test_without_pay_to_x402_is_off(cfg, wallet):
    header = _header_v2(wallet)
    cfg.config["X402_PAY_TO"] = None
    assert x402.payment_required(5, "http://gw.test/x") == ({}, {})
    with pytest.raises(x402.PaymentInvalid) as exc:
        x402.verify(x402.decode(header), 50_000)
    assert exc.value.reason == "x402_disabled"


@pytest.mark.parametrize("status, answer", [
    (500, {"error": "internal error"}),                       # a crash after submitting the transfer
    (502, {"success": False, "errorReason": "upstream_timeout", "transaction": "", "network": "x"}),
    (200, {"ok": True}),                                      # not a SettleResponse at all
])
def test_settle_answer_that_is_not_a_verdict_keeps_the_authorization_reserved(cfg, make_account, wallet,
                                                                              status, answer, ledger_clean):
    """A /settle answer that is a server error or no SettleResponse says nothing about whether
    the transfer was submitted: the authorization stays ``reserved`` (as when the facilitator
    does not answer) so reconciliation settles it again and books it; marking it ``failed``
    would lose the payer's USDC if it had moved."""
    acct = make_account(cents=0)
    with facilitator_server() as fac:
        cfg.config["X402_FACILITATOR_URL"] = fac.url
        fac.settle, fac.settle_status = answer, status
        with pytest.raises(x402.SettlementUnavailable) as exc:
            x402.accept(_header_v2(wallet), account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
        assert exc.value.reason == "settlement_unavailable" and exc.value.status == 503
        # a reconciliation run from now, and no fresh payment request: paying again would pay twice
        assert int(exc.value.headers["Retry-After"]) == cfg.config["X402_RECONCILE_AFTER_SECONDS"] + 60
        assert "PAYMENT-REQUIRED" not in exc.value.headers and "Do not pay again" in exc.value.message
        assert db.session.execute(db.select(X402Authorization.status)).scalar_one() == "reserved"
        fac.settle, fac.settle_status = None, 200  # the facilitator answers again: settled, booked
        assert x402.reconcile(older_than_seconds=0)["booked"] == 1
    assert ledger.balance(ledger.customer(acct.id)) == 50_000
    ledger_clean()


def test_the_same_payment_sent_again_before_its_settlement_is_known_is_no_new_payment_request(
        cfg, make_account, wallet, ledger_clean):
    """After ``settlement_unavailable`` the authorization stays reserved; the client that
    sends the same payment again (a retry of the identical request, the same MCP ``_meta``)
    before reconciliation resolved it is told the same — 503, ``Retry-After``, do not pay
    again — not 402 ``replayed`` with a fresh payment request, which invited paying twice."""
    acct = make_account(cents=0)
    header = _header_v2(wallet)
    with facilitator_server() as fac:
        cfg.config["X402_FACILITATOR_URL"] = fac.url
        fac.settle, fac.settle_status = {"error": "internal error"}, 500
        with pytest.raises(x402.SettlementUnavailable):
            x402.accept(header, account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
        with pytest.raises(x402.SettlementUnavailable) as again:
            x402.accept(header, account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
        assert again.value.status == 503 and int(again.value.headers["Retry-After"]) > 0
        assert "PAYMENT-REQUIRED" not in again.value.headers and "Do not pay again" in again.value.message
        assert [path for path, _ in fac.calls].count("/settle") == 1  # the second was not sent on
        fac.settle, fac.settle_status = None, 200
        assert x402.reconcile(older_than_seconds=0)["booked"] == 1
        _single_use_from_now(header, acct)  # booked
    assert ledger.balance(ledger.customer(acct.id)) == 50_000
    ledger_clean()


def _single_use_from_now(header, acct) -> None:
    """``header``'s authorization was settled: sent again it is ``replayed``, whatever the
    facilitator would say."""
    with pytest.raises(x402.PaymentInvalid) as again:
        x402.accept(header, account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
    assert again.value.reason == "replayed"


def test_unreachable_facilitator_is_not_called_a_refusal(cfg, make_account, wallet):
    """No facilitator answered /verify: the message says so (nothing was charged; the same
    payment may be sent again), not that the facilitator refused the payment."""
    acct = make_account(cents=0)
    cfg.config["X402_FACILITATOR_URL"] = "http://127.0.0.1:9"  # nothing listens there
    with pytest.raises(x402.FacilitatorUnavailable) as exc:
        x402.accept(_header_v2(wallet), account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
    assert exc.value.reason == "facilitator_unavailable" and exc.value.status == 503
    assert exc.value.headers == {"Retry-After": "5"}  # a server's outage: no fresh payment request
    assert "refused" not in exc.value.message and "did not answer" in exc.value.message
    assert "same payment may be sent again" in exc.value.message
    assert ledger.balance(ledger.customer(acct.id)) == 0


def test_no_verify_verdict_releases_the_authorization_for_a_retry(cfg, make_account, wallet, ledger_clean):
    """Nothing moves at /verify and /settle was never sent, so an authorization the
    facilitator gave no verdict on is not spent: the client retries the SAME header once
    the facilitator answers and is settled and booked once (before: ``replayed``, and the
    client had to sign a new authorization)."""
    acct = make_account(cents=0)
    header = _header_v2(wallet)
    cfg.config["X402_FACILITATOR_URL"] = "http://127.0.0.1:9"  # nothing listens there
    with pytest.raises(x402.FacilitatorUnavailable) as exc:
        x402.accept(header, account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
    assert exc.value.reason == "facilitator_unavailable"
    assert db.session.execute(db.select(db.func.count()).select_from(X402Authorization)).scalar_one() == 0
    with facilitator_server() as fac:
        cfg.config["X402_FACILITATOR_URL"] = fac.url
        pay = x402.accept(header, account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
        with unit_of_work():
            x402.book(pay)
        _single_use_from_now(header, acct)  # settled
    assert ledger.balance(ledger.customer(acct.id)) == 50_000
    ledger_clean()


def test_a_verify_server_error_releases_the_authorization_too(cfg, make_account, wallet):
    """A 5xx from /verify is no verdict either (``_facilitator``): released, not failed."""
    acct = make_account(cents=0)
    with facilitator_server() as fac:
        cfg.config["X402_FACILITATOR_URL"] = fac.url
        fac.verify, fac.verify_status = {"error": "overloaded"}, 503
        with pytest.raises(x402.FacilitatorUnavailable) as exc:
            x402.accept(_header_v2(wallet), account_id=acct.id, price_micros=50_000, resource_url="http://gw.test/x")
    assert exc.value.reason == "facilitator_unavailable"
    assert db.session.execute(db.select(db.func.count()).select_from(X402Authorization)).scalar_one() == 0


def test_the_facilitator_is_sent_the_requirement_the_402_described(cfg, make_account, wallet, ledger_clean):
    """x402 v1: the requirement sent to the facilitator's /verify and /settle is the one the
    402 offered for that resource, its description included. Until 2026-11-29 it always said
    "Module call" (a chat completion's and every module's own description were lost)."""
    acct = make_account(cents=0)
    with facilitator_server() as fac:
        cfg.config["X402_FACILITATOR_URL"] = fac.url
        pay = x402.accept(_header_v1(wallet), account_id=acct.id, price_micros=50_000,
                          resource_url="http://gw.test/v1/chat/completions", description="Chat completion")
        offered = x402.payment_required(5, "http://gw.test/v1/chat/completions", "Chat completion")[0]["accepts"][0]
        for path, body in fac.calls:
            sent = body["paymentRequirements"]
            assert (sent["description"], sent["resource"]) == (offered["description"], offered["resource"]), path
        x402.book(pay)
        db.session.commit()
    ledger_clean()

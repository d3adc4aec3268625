"""Outside money credited once (issue 15): an agent pays a call by x402 from its connected
wallet through a facilitator; the settlement's on-chain Transfer reaches the deposit
address the watcher scans; the account is credited once (one book of outside money).
A facilitator that settles and then never answers: the authorization stays ``reserved``
and reconciliation books it (chain or facilitator) as account credit, once. Oversized
values: above the price refused, 2^63 a 400, the ledger check clean."""
from __future__ import annotations

import base64
import json

import pytest
from eth_account import Account as EthAccount

from app.extensions import db
from app.models import ExternalCredit, X402Authorization
from app.services.billing import x402
from tests.api.test_module_call_x402 import PAY_TO, _pay
from tests.api.test_wallet import USDC_BASE, connect_evm
from tests.gateway_helpers import balance_cents, call, mod, provider, provider_server  # noqa: F401
from tests.standins import chain_server, facilitator_server


@pytest.fixture
def rails(app, monkeypatch):
    """x402 with a facilitator that moves the USDC on the stand-in chain (as a real one
    does), and the deposit watcher scanning the same pay-to address."""
    with chain_server(USDC_BASE) as node, facilitator_server() as fac:
        for key, value in {"X402_PAY_TO": PAY_TO, "X402_NETWORKS": ["base"], "X402_FACILITATOR_URL": fac.url,
                           "RPC_URLS": {"base": node.url, "ethereum": None, "polygon": None, "solana": None},
                           "USDC_DEPOSIT_ADDRESS": PAY_TO, "CHAIN_CONFIRMATIONS": 0,
                           "CHAIN_WATCH_LOOKBACK_BLOCKS": 100, "X402_FACILITATOR_TIMEOUT_SECONDS": 1.0}.items():
            monkeypatch.setitem(app.config, key, value)

        def move_usdc(body, tx):
            auth = body["paymentPayload"]["payload"]["authorization"]
            node.transfer_with_authorization(auth["from"], auth["to"], int(auth["value"]), auth["nonce"],
                                             block=node.block, tx=tx)
        fac.on_settle = move_usdc
        yield node, fac


def _watch(app):
    res = app.test_cli_runner().invoke(args=["payments", "watch-usdc"])
    assert res.exit_code == 0, res.output


def _credits(app) -> list[tuple[str, int]]:
    with app.app_context():
        out = [(c.ref, c.amount_micros) for c in db.session.query(ExternalCredit).order_by(ExternalCredit.id)]
        db.session.remove()
    return out


def test_x402_from_connected_wallet_and_watcher_credited_once(app, client, make_account, mod, rails,
                                                              ledger_clean):
    node, fac = rails
    acct = make_account(cents=0)
    eth, r = connect_evm(client, acct)
    assert r.status_code == 200, r.get_json()
    r = call(client, acct, {"action": "ok"}, headers={"PAYMENT-SIGNATURE": _pay(call(client, acct, {"action": "ok"}),
                                                                                eth)})
    assert r.status_code == 200, r.get_json()
    assert balance_cents(app, acct.id) == 0  # paid 3 cents, charged 3 cents
    node.block += 5
    _watch(app)  # the watcher sees the settlement's Transfer from the connected wallet
    assert balance_cents(app, acct.id) == 0  # not credited a second time
    nonce = fac.calls[-1][1]["paymentPayload"]["payload"]["authorization"]["nonce"].lower()
    assert _credits(app) == [(f"x402:base:{eth.address.lower()}:{nonce}", 30_000)]
    ledger_clean()


def test_settle_hangs_then_reconciled_once(app, client, make_account, mod, rails, ledger_clean):
    """The facilitator settles and never answers: the call is refused, the authorization
    stays reserved; the watcher leaves it to x402; reconciliation asks the chain
    (``authorizationState``) and books it as account credit, once."""
    node, fac = rails
    acct = make_account(cents=0)
    eth, _ = connect_evm(client, acct)
    fac.settle_delay = 3.0  # longer than X402_FACILITATOR_TIMEOUT_SECONDS
    r = call(client, acct, {"action": "ok"}, headers={"PAYMENT-SIGNATURE": _pay(call(client, acct, {"action": "ok"}),
                                                                                eth)})
    assert r.status_code == 503 and r.get_json()["reason"] == "settlement_unavailable"
    # a server's outage, not a refused payment: retry later, no fresh payment request to pay twice with
    assert r.get_json()["error"] == "settlement_unavailable" and int(r.headers["Retry-After"]) > 0
    assert "PAYMENT-REQUIRED" not in r.headers and "accepts" not in r.get_json()
    with app.app_context():
        assert db.session.query(X402Authorization).one().status == "reserved"
        db.session.remove()
    node.block += 5
    _watch(app)
    assert balance_cents(app, acct.id) == 0  # the watcher does not credit our reserved authorization
    with app.app_context():
        assert x402.reconcile(older_than_seconds=0) == {"booked": 1, "released": 0, "pending": 0, "already": 0}
        assert x402.reconcile(older_than_seconds=0)["booked"] == 0
        assert db.session.query(X402Authorization).one().status == "settled"
        db.session.remove()
    assert balance_cents(app, acct.id) == 3  # the payer's money stays as balance
    assert len(_credits(app)) == 1
    ledger_clean()


def test_settle_unanswered_without_chain_asks_the_facilitator(app, client, make_account, mod, rails, ledger_clean):
    node, fac = rails
    app.config["RPC_URLS"] = {"base": None, "ethereum": None, "polygon": None, "solana": None}
    acct = make_account(cents=0)
    fac.settle_delay = 3.0
    r = call(client, acct, {"action": "ok"},
             headers={"PAYMENT-SIGNATURE": _pay(call(client, acct, {"action": "ok"}), EthAccount.create())})
    assert r.status_code == 503  # settlement_unavailable
    fac.settle_delay = 0.0
    with app.app_context():
        assert x402.reconcile(older_than_seconds=0)["booked"] == 1
        db.session.remove()
    assert balance_cents(app, acct.id) == 3
    # a refused one is released, nothing booked
    other = make_account(cents=0)
    fac.settle_delay = 3.0
    call(client, other, {"action": "ok"}, headers={"PAYMENT-SIGNATURE": _pay(call(client, other, {"action": "ok"}),
                                                                             EthAccount.create())})
    fac.settle_delay, fac.on_settle = 0.0, None
    fac.settle = {"success": False, "errorReason": "invalid_exact_evm_payload_authorization_valid_before"}
    with app.app_context():
        assert x402.reconcile(older_than_seconds=0)["released"] == 1
        db.session.remove()
    assert balance_cents(app, acct.id) == 3 and balance_cents(app, other.id) == 0
    ledger_clean()


def test_oversize_values_refused_and_ledger_check_clean(app, client, make_account, mod, rails, ledger_clean):
    acct = make_account(cents=0)
    wallet = EthAccount.create()
    r402 = call(client, acct, {"action": "ok"})
    # A genuine signature for 9.2e18 atomic USDC on a 3-cent call: `exact` pays the price, no more.
    required = r402.headers["PAYMENT-REQUIRED"]
    from x402.http.utils import decode_payment_required_header
    req = decode_payment_required_header(required)
    req.accepts[0].amount = str(2**63 - 1)
    from x402 import x402ClientSync
    from x402.mechanisms.evm.exact.register import register_exact_evm_client
    from x402.mechanisms.evm.signers import EthAccountSigner
    greedy = x402ClientSync()
    greedy.set_spend_controls(False)  # a client that signs whatever it is asked
    payload = register_exact_evm_client(greedy, EthAccountSigner(wallet)).create_payment_payload(req)
    big = base64.b64encode(payload.model_dump_json(by_alias=True, exclude_none=True).encode()).decode()
    r = call(client, acct, {"action": "ok"}, headers={"PAYMENT-SIGNATURE": big})
    assert r.status_code == 402 and r.get_json()["reason"] == "amount_exceeds_price"
    data = json.loads(base64.b64decode(big))
    data["payload"]["authorization"]["value"] = str(2**63)
    r = call(client, acct, {"action": "ok"}, headers={"PAYMENT-SIGNATURE": base64.b64encode(
        json.dumps(data).encode()).decode()})
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_payment"
    assert balance_cents(app, acct.id) == 0
    res = app.test_cli_runner().invoke(args=["ledger", "check"])
    assert res.exit_code == 0, res.output
    ledger_clean()


def _v1_header(client, acct) -> str:
    """An X-Payment (x402 v1) header for the 402 of a call: its requirement names the
    call's resource URL."""
    from x402 import x402ClientSync
    from x402.mechanisms.evm.exact.register import register_exact_evm_client
    from x402.mechanisms.evm.signers import EthAccountSigner
    from x402.schemas.v1 import PaymentRequiredV1

    body = call(client, acct, {"action": "ok"}).get_json()
    required = PaymentRequiredV1.model_validate({"x402Version": 1, "accepts": body["accepts"],
                                                 "error": body["message"]})
    payload = register_exact_evm_client(x402ClientSync(), EthAccountSigner(EthAccount.create())) \
        .create_payment_payload(required)
    return base64.urlsafe_b64encode(payload.model_dump_json(by_alias=True, exclude_none=True).encode()).decode()


def test_a_v1_payment_settled_but_unanswered_is_booked_with_its_own_requirement(app, client, make_account, mod,
                                                                                 rails, ledger_clean):
    """The facilitator settled an X-Payment (v1) payment (the USDC moved) and answered too
    late. Reconciliation must ask it again with the same requirement — the call's resource
    URL, not BASE_URL: with BASE_URL it was another request, the facilitator answered
    "nonce already used" and the authorization was RELEASED (the payer's money gone,
    nothing credited)."""
    node, fac = rails
    app.config["RPC_URLS"] = {"base": None, "ethereum": None, "polygon": None, "solana": None}
    acct = make_account(cents=0)
    fac.settle_delay = 3.0  # settles, then answers after X402_FACILITATOR_TIMEOUT_SECONDS (1 s)
    r = call(client, acct, {"action": "ok"}, headers={"X-Payment": _v1_header(client, acct)})
    assert r.status_code == 503 and r.get_json()["reason"] == "settlement_unavailable"
    assert len(fac.facilitator.settled) == 1
    fac.settle_delay = 0.0
    with app.app_context():
        row = db.session.query(X402Authorization).one()
        assert row.resource_url.endswith("/v1/module/svc/call") and row.price_micros == 30_000
        out = x402.reconcile(older_than_seconds=0)
        db.session.remove()
    assert out["booked"] == 1 and balance_cents(app, acct.id) == 3, out
    ledger_clean()


def test_a_nonce_the_facilitator_calls_used_is_never_released(app, client, make_account, mod, rails,
                                                              ledger_clean):
    """A reserved authorization whose re-settlement the facilitator refuses as "nonce already
    used" has most likely moved the payer's USDC (its settlement's answer was lost): it
    stays reserved (reported as stuck) until the chain can tell, instead of being released."""
    node, fac = rails
    app.config["RPC_URLS"] = {"base": None, "ethereum": None, "polygon": None, "solana": None}
    acct = make_account(cents=0)
    fac.settle_delay = 3.0
    call(client, acct, {"action": "ok"}, headers={"X-Payment": _v1_header(client, acct)})
    fac.settle_delay = 0.0
    fac.settle = {"success": False, "errorReason": "invalid_exact_evm_nonce_already_used"}
    with app.app_context():
        assert x402.reconcile(older_than_seconds=0) == {"booked": 0, "released": 0, "pending": 1, "already": 0}
        assert db.session.query(X402Authorization.status).scalar() == "reserved"
        db.session.remove()
    # once the chain can tell (RPC configured), the used authorization is booked
    app.config["RPC_URLS"] = {"base": node.url, "ethereum": None, "polygon": None, "solana": None}
    with app.app_context():
        assert x402.reconcile(older_than_seconds=0)["booked"] == 1
        db.session.remove()
    assert balance_cents(app, acct.id) == 3
    ledger_clean()

"""x402 on the chat host (docs/chat.md, docs/payments.md "x402"): the official x402 HTTP
client (``x402_requests`` + an eth-account wallet, nothing of ours on the client side) pays
for a chat completion against a real server (werkzeug on loopback, the thin entry in front:
it steps aside to Flask for requests carrying a payment header), settled by the tests'
stand-in facilitator. Scheme ``exact``: the 402 asks for the hold rounded up to cents; the
payment is credited to the balance, the hold taken and settled to the exact cost; the rest
stays in the balance. Figures as in tests/api/test_chat.py: m-small with max_tokens 100
holds 630 micros (402: 1 cent = 10,000 atomic USDC) and costs 200 micros at ``cheap``."""
from __future__ import annotations


import pytest
import requests
from eth_account import Account as EthAccount
from sqlalchemy import select
from x402 import x402ClientSync
from x402.extensions.bazaar import validate_discovery_extension, validate_discovery_extension_spec
from x402.extensions.bazaar.v1.facilitator import extract_discovery_info_v1
from x402.http.clients.requests import x402_requests
from x402.http.utils import decode_payment_required_header, decode_payment_response_header
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner

from app.extensions import db
from app.models import ChatCompletion, LedgerTransaction, Payment
from app.services.money import ledger
from tests.chatfakes import fakes, live_server, upstreams  # noqa: F401

MSGS = [{"role": "user", "content": "hello there"}]
BODY = {"model": "m-small", "max_tokens": 100, "messages": MSGS}


@pytest.fixture(scope="module")
def url(app):
    with live_server(app, "chat-x402-server") as base:
        yield base


def paying_session(wallet) -> requests.Session:
    return x402_requests(register_exact_evm_client(x402ClientSync(), EthAccountSigner(wallet)))


def books(app, account_id) -> dict:
    with app.app_context():
        kinds = db.session.execute(select(LedgerTransaction.kind).where(
            LedgerTransaction.account_id == account_id).order_by(LedgerTransaction.id)).scalars().all()
        pays = db.session.execute(select(Payment.method, Payment.amount_micros, Payment.status)
                                  .where(Payment.account_id == account_id)).all()
        rows = db.session.execute(select(ChatCompletion.status, ChatCompletion.hold_micros,
                                         ChatCompletion.cost_micros)
                                  .where(ChatCompletion.account_id == account_id)).all()
        out = {"balance": ledger.balance(ledger.customer(account_id)), "revenue": ledger.balance(ledger.REVENUE),
               "held": ledger.balance("hold:chat"), "kinds": kinds, "payments": [tuple(p) for p in pays],
               "completions": [tuple(r) for r in rows]}
        db.session.remove()
    return out


def test_chat_402_carries_bazaar_metadata(app, url, fakes, make_account):
    poor = make_account(cents=0)
    r = requests.post(url + "/v1/chat/completions", json=BODY, headers=poor.headers)
    assert r.status_code == 402 and "PAYMENT-SIGNATURE" in r.json()["error"]["message"]
    v2 = decode_payment_required_header(r.headers["PAYMENT-REQUIRED"])
    assert v2.accepts[0].amount == "10000" and v2.resource.url.endswith("/v1/chat/completions")
    ext = v2.extensions["bazaar"]
    assert ext["info"]["input"]["type"] == "http" and ext["info"]["input"]["method"] == "POST"
    assert ext["schema"]["properties"]["input"]["properties"]["body"]["required"] == ["model", "messages"]
    assert validate_discovery_extension(ext).valid and validate_discovery_extension_spec(ext).valid
    # x402 v1's place for the same metadata: each requirement's outputSchema
    info = extract_discovery_info_v1(r.json()["accepts"][0])
    assert info is not None and info.input.method == "POST" and info.input.body["model"] == "auto"


def _paid_by_x402(app, url: str, path: str, body: dict, poor) -> requests.Response:
    """``poor`` (no balance) sends ``body`` to ``path`` through the official x402 client with
    a fresh wallet: answered 200, settled for 10,000 micros by that wallet, and the ledger
    says what the receipt says — 10,000 credited, a hold settled to 200, the remaining 9,800
    in the payer's balance."""
    wallet = EthAccount.create()
    r = paying_session(wallet).post(url + path, json=body, headers=poor.headers)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["cost_micros"] == 200
    settle = decode_payment_response_header(r.headers["PAYMENT-RESPONSE"])
    assert settle.success and settle.payer == wallet.address and settle.amount == "10000"
    b = books(app, poor.id)
    assert b["payments"] == [("x402", 10_000, "succeeded")]
    assert b["kinds"] == ["x402_payment", "chat_hold", "chat_settle"]
    assert (b["balance"], b["revenue"], b["held"]) == (9_800, 200, 0)
    return r


def test_official_x402_client_pays_for_a_completion(app, url, fakes, make_account, ledger_clean):
    poor = make_account(cents=0)
    r = _paid_by_x402(app, url, "/v1/chat/completions", BODY, poor)
    assert r.json()["choices"][0]["message"]["content"] == "Hello from cheap"
    assert books(app, poor.id)["completions"] == [("settled", 630, 200)]  # 630 held

    # the same payment again, from an account that cannot pay: refused, nothing moves
    sent = r.request.headers["PAYMENT-SIGNATURE"]
    other = make_account(cents=0)
    again = requests.post(url + "/v1/chat/completions", json=BODY, headers={**other.headers,
                                                                          "PAYMENT-SIGNATURE": sent})
    assert again.status_code == 402, again.text
    assert again.json()["error"]["code"] == "payment_invalid" and again.json()["reason"] == "replayed"
    assert again.headers["PAYMENT-REQUIRED"]
    b2 = books(app, other.id)
    assert (b2["balance"], b2["kinds"], b2["payments"], b2["completions"]) == (0, [], [], [])
    # the remainder pays the next completion without a payment
    assert requests.post(url + "/v1/chat/completions", json=BODY, headers=poor.headers).status_code == 200
    assert books(app, poor.id)["balance"] == 9_600
    assert fakes.cheap.calls == 2
    ledger_clean()


def test_official_x402_client_pays_for_a_messages_api_message(app, url, fakes, make_account, ledger_clean):
    """``/v1/messages`` answers a short balance with the same 402 as chat completions, which
    offers an x402 payment ("retry with a PAYMENT-SIGNATURE"): the retry carrying it is
    honoured there too (it was ignored: the paying client got the same 402 again)."""
    poor = make_account(cents=0)
    body = {"model": "m-small", "max_tokens": 100, "messages": MSGS}
    r = _paid_by_x402(app, url, "/v1/messages", body, poor)
    assert r.json()["type"] == "message" and r.json()["content"] == [{"type": "text", "text": "Hello from cheap"}]
    ledger_clean()


def test_the_messages_api_402_names_v1_messages(app, url, fakes, make_account, ledger_clean):
    """The 402 of ``/v1/messages`` asks to pay for ``/v1/messages`` (v2 ``resource``, v1
    ``accepts[].resource``, the description and the Bazaar metadata: Anthropic's request,
    ``max_tokens`` required, and its message object): it named ``/v1/chat/completions``,
    so an x402 client (or a Bazaar index) was told to pay for another route. A refused
    payment there asks again for ``/v1/messages``."""
    base = app.config["BASE_URL"].rstrip("/")  # the gateway's public URL, named in x402 requests
    poor = make_account(cents=0)
    body = {"model": "m-small", "max_tokens": 100, "messages": MSGS}
    r = requests.post(url + "/v1/messages", json=body, headers=poor.headers)
    assert r.status_code == 402 and r.json()["type"] == "error"
    v2 = decode_payment_required_header(r.headers["PAYMENT-REQUIRED"])
    assert v2.resource.url == base + "/v1/messages" and "Messages" in v2.resource.description
    assert [a["resource"] for a in r.json()["accepts"]] == [base + "/v1/messages"] * len(r.json()["accepts"])
    ext = v2.extensions["bazaar"]
    assert validate_discovery_extension(ext).valid and validate_discovery_extension_spec(ext).valid
    assert ext["schema"]["properties"]["input"]["properties"]["body"]["required"] == ["model", "max_tokens",
                                                                                       "messages"]
    assert ext["info"]["output"]["example"]["type"] == "message"
    # a payment refused on /v1/messages: the fresh request names /v1/messages too
    required = decode_payment_required_header(r.headers["PAYMENT-REQUIRED"])
    required.accepts[0].amount = "5000"
    client = register_exact_evm_client(x402ClientSync(), EthAccountSigner(EthAccount.create()))
    from x402.http.utils import encode_payment_signature_header

    bad = requests.post(url + "/v1/messages", json=body, headers={
        **poor.headers, "PAYMENT-SIGNATURE": encode_payment_signature_header(client.create_payment_payload(required))})
    assert bad.status_code == 402 and bad.json()["error"]["code"] == "payment_invalid", bad.text
    assert decode_payment_required_header(bad.headers["PAYMENT-REQUIRED"]).resource.url == base + "/v1/messages"
    assert books(app, poor.id)["payments"] == []
    # chat completions still names its own path
    r = requests.post(url + "/v1/chat/completions", json=body, headers=poor.headers)
    assert decode_payment_required_header(r.headers["PAYMENT-REQUIRED"]).resource.url == base + "/v1/chat/completions"
    ledger_clean()


def test_provider_failure_after_payment_leaves_the_credit(app, url, fakes, make_account, ledger_clean):
    fakes.cheap.mode = fakes.pricey.mode = "503"
    poor = make_account(cents=0)
    wallet = EthAccount.create()
    r = paying_session(wallet).post(url + "/v1/chat/completions", json=BODY, headers=poor.headers)
    assert r.status_code == 502 and r.json()["error"]["code"] == "provider_error"
    settle = decode_payment_response_header(r.headers["PAYMENT-RESPONSE"])  # the payment was taken ...
    assert settle.success and settle.amount == "10000"
    b = books(app, poor.id)  # ... and is all in the balance: the hold was released
    assert b["kinds"] == ["x402_payment", "chat_hold", "chat_release"]
    assert b["completions"] == [("released", 630, 0)]
    assert (b["balance"], b["revenue"], b["held"]) == (10_000, 0, 0)
    ledger_clean()


def test_undervalued_payment_is_refused(app, url, fakes, make_account, ledger_clean):
    poor = make_account(cents=0)
    r402 = requests.post(url + "/v1/chat/completions", json=BODY, headers=poor.headers)
    required = decode_payment_required_header(r402.headers["PAYMENT-REQUIRED"])
    required.accepts[0].amount = "5000"  # half a cent, validly signed
    client = register_exact_evm_client(x402ClientSync(), EthAccountSigner(EthAccount.create()))
    payload = client.create_payment_payload(required)
    from x402.http.utils import encode_payment_signature_header

    r = requests.post(url + "/v1/chat/completions", json=BODY,
                      headers={**poor.headers, "PAYMENT-SIGNATURE": encode_payment_signature_header(payload)})
    assert r.status_code == 402 and r.json()["reason"] == "insufficient_amount"
    b = books(app, poor.id)
    assert (b["balance"], b["kinds"], b["payments"], b["completions"]) == (0, [], [], [])
    assert fakes.cheap.calls == 0
    ledger_clean()


def test_paid_stream_settles_and_keeps_the_rest(app, url, fakes, make_account, ledger_clean):
    poor = make_account(cents=0)
    r = paying_session(EthAccount.create()).post(url + "/v1/chat/completions", json={**BODY, "stream": True},
                                                 headers=poor.headers)
    assert r.status_code == 200 and r.headers["PAYMENT-RESPONSE"]
    assert r.text.rstrip().endswith("data: [DONE]")
    b = books(app, poor.id)
    assert b["kinds"] == ["x402_payment", "chat_hold", "chat_settle"] and b["held"] == 0
    assert b["balance"] == 10_000 - b["completions"][0][2]
    ledger_clean()

"""Endpoints 17–20: wallet connect (EIP-4361 / ed25519), balance via JSON-RPC, USDC
deposit instructions and the chain watcher, ledger transactions."""
from __future__ import annotations

from app.tasks import job_paths as as_paths
import base58
import pytest
from eth_account import Account as EthAccount
from eth_account.messages import encode_defunct
from nacl.signing import SigningKey

from app.services.billing import wallets
from tests.standins import chain_server, use_chain

USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
PAY_TO = "0x00000000000000000000000000000000000A1B2C"


@pytest.fixture
def chain(app, monkeypatch):
    with chain_server(USDC_BASE) as node:
        use_chain(monkeypatch, app, node.url, solana=node.url, USDC_DEPOSIT_ADDRESS=PAY_TO,
                  WALLET_BALANCE_CACHE_SECONDS=15, CHAIN_CONFIRMATIONS=3, CHAIN_WATCH_LOOKBACK_BLOCKS=100)
        wallets._local_cache.clear()
        yield node


def _message(client, acct, chain, address):
    r = client.get("/api/wallet/connect/message", query_string={"chain": chain, "address": address},
                   headers=acct.headers)
    assert r.status_code == 200, r.get_json()
    return r.get_json()


def connect_evm(client, acct, eth=None, chain="base"):
    eth = eth or EthAccount.create()
    msg = _message(client, acct, chain, eth.address)
    sig = eth.sign_message(encode_defunct(text=msg["message"])).signature.hex()
    r = client.post("/api/wallet/connect", json={"chain": chain, "address": eth.address, "signature": "0x" + sig},
                    headers=acct.headers)
    return eth, r


def test_connect_evm_message_is_eip4361_and_single_use(client, account):
    eth = EthAccount.create()
    msg = _message(client, account, "base", eth.address.lower())
    text = msg["message"]
    assert " wants you to sign in with your Ethereum account:\n" + eth.address + "\n" in text
    assert f"Nonce: {msg['nonce']}" in text and "Chain ID: 8453" in text and "Version: 1" in text
    assert "Expiration Time: " in text and msg["address"] == eth.address
    sig = "0x" + eth.sign_message(encode_defunct(text=text)).signature.hex()
    body = {"chain": "base", "address": eth.address, "signature": sig}
    r = client.post("/api/wallet/connect", json=body, headers=account.headers)
    assert r.status_code == 200 and r.get_json()["chain"] == "base" and r.get_json()["connected"] is True
    r = client.post("/api/wallet/connect", json=body, headers=account.headers)  # replay
    assert r.status_code == 409 and r.get_json()["error"] == "nonce_invalid"


def test_connect_refusals(client, make_account):
    acct, other = make_account(), make_account()
    eth, mallory = EthAccount.create(), EthAccount.create()
    msg = _message(client, acct, "base", eth.address)
    # wrong chain: the message was issued for base
    sig = "0x" + eth.sign_message(encode_defunct(text=msg["message"])).signature.hex()
    r = client.post("/api/wallet/connect", json={"chain": "polygon", "address": eth.address, "signature": sig},
                    headers=acct.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "nonce_invalid"
    # signed by another key
    bad = "0x" + mallory.sign_message(encode_defunct(text=msg["message"])).signature.hex()
    r = client.post("/api/wallet/connect", json={"chain": "base", "address": eth.address, "signature": bad},
                    headers=acct.headers)
    assert r.status_code == 401 and r.get_json()["error"] == "signature_invalid"
    # malformed input
    for body in ({"chain": "base", "address": "0x123", "signature": sig},
                 {"chain": "bitcoin", "address": eth.address, "signature": sig},
                 {"chain": "base", "address": eth.address},
                 {"chain": "solana", "address": eth.address, "signature": sig}):
        r = client.post("/api/wallet/connect", json=body, headers=acct.headers)
        assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", body
    _, r = connect_evm(client, acct, eth)
    assert r.status_code == 200
    # the same address for another account
    _, r = connect_evm(client, other, eth)
    assert r.status_code == 409 and r.get_json()["error"] == "conflict"
    # another account cannot use a message issued to acct
    msg = _message(client, acct, "base", mallory.address)
    sig = "0x" + mallory.sign_message(encode_defunct(text=msg["message"])).signature.hex()
    r = client.post("/api/wallet/connect", json={"chain": "base", "address": mallory.address, "signature": sig,
                                                  "nonce": msg["nonce"]}, headers=other.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "nonce_invalid"


def test_connect_solana(client, account, chain):
    key = SigningKey.generate()
    address = base58.b58encode(bytes(key.verify_key)).decode()
    msg = _message(client, account, "solana", address)
    assert "with your Solana account:\n" + address in msg["message"]
    sig = base58.b58encode(key.sign(msg["message"].encode()).signature).decode()
    r = client.post("/api/wallet/connect", json={"chain": "solana", "address": address,
                                                  "signature": "base58:" + sig}, headers=account.headers)
    assert r.status_code == 200 and r.get_json()["address"] == address
    chain.spl[address] = 7_250_000
    bal = client.get("/api/wallet/balance", headers=account.headers).get_json()
    assert bal == {"credits_cents": 1000, "usdc": "7.250000", "chain": "solana", "address": address,
                   "connected": True}


def test_balance_without_and_with_wallet(client, account, chain):
    r = client.get("/api/wallet/balance", headers=account.headers)
    assert r.get_json() == {"credits_cents": 1000, "usdc": "0.000000", "chain": None, "address": None,
                            "connected": False}
    eth, r = connect_evm(client, account)
    chain.balances[eth.address.lower()] = 12_345_678
    bal = client.get("/api/wallet/balance", headers=account.headers).get_json()
    assert bal["usdc"] == "12.345678" and bal["chain"] == "base"
    chain.balances[eth.address.lower()] = 1
    calls = chain.calls.count("eth_call")
    assert client.get("/api/wallet/balance", headers=account.headers).get_json()["usdc"] == "12.345678"
    assert chain.calls.count("eth_call") == calls  # served from the cache


def test_balance_rpc_down_is_503(client, account, chain):
    connect_evm(client, account)
    chain.fail = True
    r = client.get("/api/wallet/balance", headers=account.headers)
    assert r.status_code == 503 and r.get_json()["error"] == "service_unavailable"


def test_real_usdc_never_lands_on_the_test_balance(app, client, make_account, chain, ledger_clean):
    """A test key announcing a USDC deposit got the real deposit address and a pending test-
    mode payment, and the watcher then credited the customer's real USDC to the TEST balance
    (play money; the live balance got nothing). Announcing is live-only now; a test-mode
    payment left from before is never matched: the transfer is credited live."""
    acct = make_account(test_key=True)
    eth, r = connect_evm(client, acct)
    assert r.status_code == 200
    r = client.post("/api/wallet/fund", json={"amount_cents": 500, "method": "usdc"},
                    headers={"Authorization": f"Bearer {acct.test_key}"})
    assert r.status_code == 403 and "live key" in r.get_json()["message"], r.get_json()
    from app.extensions import db
    from app.models import Payment
    from app.ids import new_id

    with app.app_context():  # an announcement made by a test key before the fix
        db.session.add(Payment(id=new_id("pay"), account_id=acct.id, method="usdc", kind="deposit",
                               processor="chain", mode="test", amount_micros=5_000_000, status="pending",
                               meta={"chain": "base", "from": eth.address, "pay_to": PAY_TO}))
        db.session.commit()
        db.session.remove()
    chain.transfer(eth.address, PAY_TO, 5_000_000, block=995, tx="0x" + "ab" * 32, log_index=1)
    chain.block = 1000
    res = app.test_cli_runner().invoke(args=["payments", "watch-usdc"])
    assert res.exit_code == 0, res.output
    live = client.get("/api/wallet/balance", headers=acct.headers).get_json()["credits_cents"]
    test = client.get("/api/wallet/balance",
                      headers={"Authorization": f"Bearer {acct.test_key}"}).get_json()["credits_cents"]
    assert (live, test) == (1000 + 500, 0)
    ledger_clean()


def test_fund_usdc_needs_wallet_then_watcher_credits_once(app, client, account, chain, ledger_clean):
    r = client.post("/api/wallet/fund", json={"amount_cents": 250, "method": "usdc"}, headers=account.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "wallet_not_connected"
    eth, _ = connect_evm(client, account)
    r = client.post("/api/wallet/fund", json={"amount_cents": 250, "method": "usdc"}, headers=account.headers)
    assert r.status_code == 200
    out = r.get_json()
    dep = out["deposit"]
    assert out["status"] == "pending" and dep["amount_atomic"] == "2500000" and dep["amount_usdc"] == "2.500000"
    assert dep["pay_to"].lower() == PAY_TO.lower() and dep["token"] == USDC_BASE and dep["chain_id"] == 8453
    assert dep["from"] == eth.address and dep["reference"] == out["payment_id"]

    stranger = EthAccount.create().address
    chain.transfer(eth.address, PAY_TO, 2_500_000, block=995, tx="0x" + "11" * 32, log_index=4)
    chain.transfer(eth.address, PAY_TO, 9_000_000, block=996, tx="0x" + "22" * 32, log_index=0, removed=True)
    chain.transfer(stranger, PAY_TO, 1_000_000, block=996, tx="0x" + "33" * 32)
    chain.transfer(eth.address, PAY_TO, 1_000_000, block=997, tx="0x" + "44" * 32, status=0)
    chain.transfer(eth.address, PAY_TO, 3_000_000, block=999, tx="0x" + "55" * 32)  # not yet confirmed
    chain.transfer(eth.address, "0x" + "99" * 20, 3_000_000, block=995, tx="0x" + "66" * 32)  # elsewhere
    chain.block = 1000
    runner = app.test_cli_runner()
    res = runner.invoke(args=["payments", "watch-usdc"])
    assert res.exit_code == 0, res.output
    assert client.get("/api/account", headers=account.headers).get_json()["balance_cents"] == 1250
    hist = client.get("/api/pay/history", headers=account.headers).get_json()["payments"]
    assert hist[0]["id"] == out["payment_id"] and hist[0]["status"] == "succeeded" and hist[0]["method"] == "usdc"

    # Rescanning the same range (cursor reset, e.g. a restored backup) credits nothing again.
    from app.extensions import db
    from app.models import ChainCursor

    with app.app_context():
        db.session.get(ChainCursor, "base").last_block = 0
        db.session.commit()
    runner.invoke(args=["payments", "watch-usdc"])
    assert client.get("/api/account", headers=account.headers).get_json()["balance_cents"] == 1250
    # Once confirmed, the unannounced 3 USDC transfer is credited too.
    chain.block = 1010
    runner.invoke(args=["payments", "watch-usdc"])
    assert client.get("/api/account", headers=account.headers).get_json()["balance_cents"] == 1550
    ledger_clean()


def test_watcher_runs_from_the_schedule(app, client, account, chain):
    from app.tasks.chain_watch import watch_usdc_deposits
    from app.tasks.schedule import SCHEDULE

    assert ("watch-usdc-deposits", 30, "app.tasks.chain_watch.watch_usdc_deposits") in as_paths(SCHEDULE)
    eth, _ = connect_evm(client, account)
    chain.transfer(eth.address, PAY_TO, 100_000_000, block=990, tx="0x" + "77" * 32)
    with app.app_context():
        out = watch_usdc_deposits()
    assert out[0]["credited"] == 1
    chain.fail = True
    with app.app_context():
        assert watch_usdc_deposits() == []  # node down: skipped, nothing raised


def test_transactions_paginated_newest_first(client, account):
    client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa"}, headers=account.headers)
    for cents in (100, 200, 300):
        client.post("/api/wallet/fund", json={"amount_cents": cents, "method": "card"}, headers=account.headers)
    r = client.get("/api/wallet/transactions", query_string={"limit": 2}, headers=account.headers)
    page = r.get_json()
    assert [t["amount_cents"] for t in page["transactions"]] == [300, 200]
    assert page["transactions"][0]["type"] == "credit" and page["transactions"][0]["payment_id"]
    page2 = client.get("/api/wallet/transactions", query_string={"limit": 2, "cursor": page["next_cursor"]},
                       headers=account.headers).get_json()
    assert [t["amount_cents"] for t in page2["transactions"]] == [100, 1000]
    assert page2["next_cursor"] is None
    r = client.get("/api/wallet/transactions", query_string={"cursor": "abc"}, headers=account.headers)
    assert r.status_code == 400


def test_bola_wallet(client, make_account, chain):
    alice, bob = make_account(), make_account()
    eth, _ = connect_evm(client, alice)
    bal = client.get("/api/wallet/balance", headers=bob.headers).get_json()
    assert bal["connected"] is False
    txs = client.get("/api/wallet/transactions", headers=bob.headers).get_json()["transactions"]
    assert [t["kind"] for t in txs] == ["promo_grant"]

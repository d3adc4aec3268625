"""Wallet-connect nonces are single-use tokens: a wrong signature does not burn the
message, the nonce is never stored in plain text, spent nonces are purged, and a message
is only good for the account, chain and address it was issued for."""
from __future__ import annotations

from datetime import timedelta

from eth_account import Account as EthAccount
from eth_account.messages import encode_defunct
from sqlalchemy import func, select

from app.extensions import db
from app.models import SingleUseToken
from app.services.platform import tokens
from tests.services.test_tokens import stored_anywhere
from tests.support.rows import expire


def _message(client, acct, address, chain="base"):
    r = client.get("/api/wallet/connect/message", query_string={"chain": chain, "address": address},
                   headers=acct.headers)
    assert r.status_code == 200, r.get_json()
    return r.get_json()


def _sig(eth, text: str) -> str:
    return "0x" + eth.sign_message(encode_defunct(text=text)).signature.hex()


def test_wrong_signature_does_not_consume_the_message(client, account):
    eth, mallory = EthAccount.create(), EthAccount.create()
    msg = _message(client, account, eth.address)
    for body in ({"signature": _sig(mallory, msg["message"])},                      # another key
                 {"signature": _sig(eth, msg["message"] + " ")},                    # another text
                 {"signature": _sig(mallory, msg["message"]), "nonce": msg["nonce"]}):
        r = client.post("/api/wallet/connect", json={"chain": "base", "address": eth.address, **body},
                        headers=account.headers)
        assert r.status_code == 401 and r.get_json()["error"] == "signature_invalid", body
    r = client.post("/api/wallet/connect", json={"chain": "base", "address": eth.address,
                                                  "signature": _sig(eth, msg["message"])},
                    headers=account.headers)
    assert r.status_code == 200, r.get_json()


def test_nonce_not_stored_in_plain_text(app, client, account):
    eth = EthAccount.create()
    msg = _message(client, account, eth.address)
    assert msg["nonce"] in msg["message"]
    with app.app_context():
        assert stored_anywhere(msg["nonce"]) == []
        assert stored_anywhere(msg["message"]) == []
        row = db.session.execute(select(SingleUseToken)).scalar_one()
        assert row.purpose == tokens.WALLET_CONNECT and row.token_hash != msg["nonce"]
        db.session.remove()
    # the server still rebuilds the message when the client sends no nonce (SPEC body)
    r = client.post("/api/wallet/connect", json={"chain": "base", "address": eth.address,
                                                  "signature": _sig(eth, msg["message"])},
                    headers=account.headers)
    assert r.status_code == 200


def test_replay_and_explicit_nonce(client, account):
    eth = EthAccount.create()
    first, second = _message(client, account, eth.address), _message(client, account, eth.address)
    body = {"chain": "base", "address": eth.address, "signature": _sig(eth, first["message"]),
            "nonce": first["nonce"]}
    assert client.post("/api/wallet/connect", json=body, headers=account.headers).status_code == 200
    r = client.post("/api/wallet/connect", json=body, headers=account.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "nonce_invalid"
    # the second message is still good
    r = client.post("/api/wallet/connect", json={**body, "signature": _sig(eth, second["message"]),
                                                  "nonce": second["nonce"]}, headers=account.headers)
    assert r.status_code == 200


def test_expired_message_refused_and_spent_nonces_purged(app, client, account):
    eth = EthAccount.create()
    msg = _message(client, account, eth.address)
    expire(app, SingleUseToken)
    r = client.post("/api/wallet/connect", json={"chain": "base", "address": eth.address,
                                                  "signature": _sig(eth, msg["message"])},
                    headers=account.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "nonce_invalid"
    expire(app, SingleUseToken, ago=timedelta(days=2))
    with app.app_context():
        assert tokens.purge() == 1
        assert db.session.execute(select(func.count()).select_from(SingleUseToken)).scalar_one() == 0
        db.session.remove()

"""Endpoint 8: register (idempotent on pubkey, own account without promo credit)."""
from __future__ import annotations

import os
import re

import base58
import pytest
from nacl.bindings import crypto_core_ed25519_is_valid_point

from app.blueprints.fields import HTTPS_PATTERN
from app.extensions import db
from app.models import Account, Agent
from tests.agentkit import Keypair, register, session_headers


def test_register_creates_agent_and_account(app, client, account):
    kp = Keypair()
    r = register(client, account, kp, name="Scraper", webhook="http://127.0.0.1:9/hook")
    assert r.status_code == 201, r.get_json()
    body = r.get_json()
    assert set(body) == {"id", "name", "pubkey", "webhook", "account_id", "webhook_secret"}
    assert body["id"].startswith("agt_") and body["name"] == "Scraper"
    assert body["pubkey"] == kp.pubkey and body["webhook"] == "http://127.0.0.1:9/hook"
    assert body["webhook_secret"].startswith("whsec_")
    with app.app_context():
        acct = db.session.get(Account, body["account_id"])
        assert acct.kind == "agent" and acct.agent_id == body["id"]
        assert acct.owner_account_id == account.id and acct.balance_micros == 0 and acct.email is None
        from app.services.money import ledger
        assert ledger.balance(ledger.customer(acct.id)) == 0  # no promotional grant


def test_register_is_idempotent_on_pubkey(app, client, make_account):
    owner, other = make_account(), make_account()
    kp = Keypair()
    first = register(client, owner, kp, name="a").get_json()
    again = register(client, owner, kp, name="renamed", webhook="http://127.0.0.1:9/x")
    assert again.status_code == 201
    assert again.get_json()["id"] == first["id"] and again.get_json()["name"] == "renamed"
    assert again.get_json()["account_id"] == first["account_id"]
    r = register(client, other, kp)
    assert r.status_code == 409 and r.get_json()["error"] == "conflict"
    with app.app_context():
        assert db.session.query(Agent).count() == 1
        assert db.session.query(Account).filter_by(kind="agent").count() == 1


def _invalid_point() -> bytes:
    while True:
        raw = os.urandom(32)
        if not crypto_core_ed25519_is_valid_point(raw):
            return raw


@pytest.mark.parametrize("pubkey", [
    "abc", "ed25519:", "ed25519:0OIl", "ed25519:" + base58.b58encode(b"\x01" * 31).decode(),
    "ed25519:" + base58.b58encode(b"\x01" * 33).decode(), "rsa:" + base58.b58encode(b"\x01" * 32).decode(),
    "ed25519:" + base58.b58encode(b"\x00" * 32).decode(),  # small-order point
])
def test_bad_pubkeys_are_refused(client, account, pubkey):
    """Off the documented pattern: 400 `invalid_request`; of its shape but not a key (not
    32 bytes, a small-order point): 422 `unprocessable` (issue 42 item 12)."""
    from app.blueprints.agents.schemas import PUBKEY_PATTERN

    r = client.post("/api/agent/register", json={"name": "x", "pubkey": pubkey}, headers=account.headers)
    expected = (422, "unprocessable") if re.fullmatch(PUBKEY_PATTERN, pubkey) else (400, "invalid_request")
    assert (r.status_code, r.get_json()["error"]) == expected
    assert "pubkey" in r.get_json()["message"]


def test_off_curve_pubkey_is_422(client, account):
    pk = "ed25519:" + base58.b58encode(_invalid_point()).decode()
    r = client.post("/api/agent/register", json={"name": "x", "pubkey": pk}, headers=account.headers)
    assert r.status_code == 422 and r.get_json()["error"] == "unprocessable"


@pytest.mark.parametrize("body", [{"pubkey": "x"}, {"name": "", "pubkey": "x"}, {"name": "n" * 101, "pubkey": "x"}])
def test_validation(client, account, body):
    assert client.post("/api/agent/register", json=body, headers=account.headers).status_code == 400


def test_webhook_must_be_https_and_public(app, client, account):
    kp = Keypair()
    app.config["ALLOW_PRIVATE_URLS"] = False
    try:
        for url in ("http://example.com/hook", "https://127.0.0.1/hook", "https://10.0.0.8/x",
                    "https://[::1]/x", "ftp://x/y", "not a url", "https://user:pw@127.0.0.1/"):
            r = register(client, account, kp, webhook=url)
            # off the published pattern 400; of its shape, refused by the SSRF guard, 422
            assert r.status_code == (422 if re.fullmatch(HTTPS_PATTERN, url) else 400), (url, r.get_json())
            assert "webhook" in r.get_json()["message"], url
    finally:
        app.config["ALLOW_PRIVATE_URLS"] = True
    with app.app_context():
        assert db.session.query(Agent).count() == 0


def test_scope_and_sessions(client, make_account):
    limited = make_account(scopes=["agent:read"])
    r = register(client, limited, Keypair())
    assert r.status_code == 403 and r.get_json()["error"] == "insufficient_scope"
    owner = make_account()
    kp = Keypair()
    register(client, owner, kp)
    headers = session_headers(client, kp)
    r = client.post("/api/agent/register", json={"name": "child", "pubkey": Keypair().pubkey},
                    headers=headers)
    assert r.status_code == 403 and r.get_json()["error"] == "forbidden"
    assert client.post("/api/agent/register", json={"name": "x", "pubkey": kp.pubkey}).status_code == 401


def test_a_key_whose_base58_is_shorter_than_43_characters_registers_and_signs_in(client, account):
    """The base58 of 32 bytes is 32 to 44 characters (each leading zero byte is one '1'):
    about one key in half a million starts with 0x00 0x01…0x1f or two zero bytes and spells
    42 characters or fewer. The pattern said 43–44, so such an agent was 400 at register
    (the seed below, found by search, gives `ed25519:1xPKh4JZ…` of 42 characters)."""
    from nacl.signing import SigningKey

    from app.blueprints.agents.schemas import PUBKEY_PATTERN

    kp = Keypair(SigningKey(bytes.fromhex("3caa89f8b8a4e01011e683342a7df1f7c8902c2eadfabaca32ec7c827a631679")))
    assert len(kp.pubkey) == len("ed25519:") + 42 and bytes(kp.sk.verify_key)[0] == 0
    r = register(client, account, kp)
    assert r.status_code == 201, r.get_json()
    assert r.get_json()["pubkey"] == kp.pubkey
    assert session_headers(client, kp)["Authorization"].startswith("Bearer svc_sess_")
    shortest = "ed25519:" + base58.b58encode(b"\x00" * 31 + b"\x01").decode()  # 32 characters
    assert re.fullmatch(PUBKEY_PATTERN, shortest) and not re.fullmatch(PUBKEY_PATTERN, shortest[:-1])

"""Test helpers for agents: ed25519 keypairs (PyNaCl), register, sign in, simulated
module-call charges posted exactly as the gateway posts them (30% to the owner)."""
from __future__ import annotations

import base58
from nacl.signing import SigningKey

from app.extensions import db
from app.services.money import ledger


class Keypair:
    def __init__(self, sk: SigningKey | None = None):
        self.sk = sk or SigningKey.generate()

    @property
    def pubkey(self) -> str:
        return "ed25519:" + base58.b58encode(bytes(self.sk.verify_key)).decode()

    def sign(self, nonce: str) -> str:
        return "base58:" + base58.b58encode(self.sk.sign(nonce.encode("utf-8")).signature).decode()


def register(client, owner, kp: Keypair, name="bot", webhook=None):
    body = {"name": name, "pubkey": kp.pubkey}
    if webhook is not None:
        body["webhook"] = webhook
    return client.post("/api/agent/register", json=body, headers=owner.headers)


def nonce(client) -> str:
    r = client.get("/api/agent/nonce")
    assert r.status_code == 200, r.get_json()
    return r.get_json()["nonce"]


def sign_in(client, kp: Keypair):
    n = nonce(client)
    return client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": n,
                                                  "signature": kp.sign(n)})


def session_headers(client, kp: Keypair) -> dict:
    r = sign_in(client, kp)
    assert r.status_code == 200, r.get_json()
    return {"Authorization": f"Bearer {r.get_json()['session']}"}


def checked_session(r, agent_id: str) -> dict:
    """The bearer headers of a sign-in answer ``r`` (Ed25519 or SIWX), once its shape is
    checked: ``agent_id``'s session, one hour, of the documented form."""
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert set(body) == {"agent_id", "session", "expires_in"}
    assert body["agent_id"] == agent_id and body["expires_in"] == 3600
    assert body["session"].startswith("svc_sess_") and len(body["session"]) == 9 + 32 + 6
    return {"Authorization": f"Bearer {body['session']}"}


def charge(payer_account_id: str, owner_agent_id: str | None, price_cents: int, *, at=None,
           ref=None) -> int:
    """Post a module-call charge like the gateway: payer −P, revenue 0.7P, earnings 0.3P."""
    p = ledger.cents_to_micros(price_cents)
    share = p * 3 // 10 if owner_agent_id else 0
    legs = [(ledger.customer(payer_account_id), -p), (ledger.REVENUE, p - share)]
    if share:
        legs.append((ledger.earnings(owner_agent_id), share))
    txn = ledger.post("module_call", legs, ref=ref, account_id=payer_account_id, created_at=at)
    db.session.commit()
    return txn


def refund(payer_account_id: str, owner_agent_id: str, price_cents: int, *, at=None) -> int:
    p = ledger.cents_to_micros(price_cents)
    share = p * 3 // 10
    txn = ledger.post("module_call_refund", [(ledger.customer(payer_account_id), p),
                                             (ledger.REVENUE, -(p - share)),
                                             (ledger.earnings(owner_agent_id), -share)],
                      account_id=payer_account_id, created_at=at)
    db.session.commit()
    return txn

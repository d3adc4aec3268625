"""Agent sessions and sign-in nonces are never stored or logged in plaintext."""
from __future__ import annotations

import logging

from tests.agentkit import Keypair, register
from tests.e2e.test_secrets_at_rest import dump_database


def test_sessions_and_nonces_not_stored_or_logged(app, client, account, caplog):
    caplog.set_level(logging.DEBUG)
    kp = Keypair()
    ag = register(client, account, kp).get_json()
    nonce = client.get("/api/agent/nonce").get_json()["nonce"]
    r = client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": nonce, "signature": kp.sign(nonce)})
    session = r.get_json()["session"]
    pending_nonce = client.get("/api/agent/nonce").get_json()["nonce"]
    assert client.get(f"/api/agent/{ag['id']}/usage",
                      headers={"Authorization": f"Bearer {session}"}).status_code == 200
    dump, logs = dump_database(app), caplog.text
    for secret in (session, session[9:], nonce, nonce[2:], pending_nonce, pending_nonce[2:]):
        assert secret not in dump and secret not in logs
    assert ag["id"] in dump  # sanity: the dump is real

"""Issue 42 item 10: secrets are shown once. An agent's webhook secret is in the response
that created the agent only: re-registering the same public key (with another key of the
account) answers null, and the list of builds does not repeat their signing secrets."""
from __future__ import annotations

from tests.agentkit import Keypair, register, session_headers


def test_re_registering_an_agent_does_not_reveal_its_secret(client, account):
    kp = Keypair()
    first = register(client, account, kp, webhook="http://127.0.0.1:9/a")
    assert first.status_code == 201 and first.get_json()["webhook_secret"].startswith("whsec_")
    other = client.post("/api/keys", json={"name": "other"}, headers=account.headers).get_json()["key"]
    again = client.post("/api/agent/register", json={"name": "bot", "pubkey": kp.pubkey},
                        headers={"Authorization": f"Bearer {other}"})
    assert again.status_code == 201 and again.get_json()["id"] == first.get_json()["id"]
    assert again.get_json()["webhook_secret"] is None
    assert first.get_json()["webhook_secret"] not in again.get_data(as_text=True)


def test_build_secrets_are_not_listed_again(client, account):
    kp = Keypair()
    register(client, account, kp, webhook="http://127.0.0.1:9/a")
    headers = session_headers(client, kp)
    r = client.post("/api/agent/build", json={"slug": "once-bot", "price_cents": 2, "actions": ["go"],
                                              "webhook": "http://127.0.0.1:9/m", "description": "d"},
                    headers=headers)
    assert r.status_code == 202 and r.get_json()["webhook_secret"].startswith("whsec_")
    secret = r.get_json()["webhook_secret"]
    for h in (headers, account.headers):
        listed = client.get("/api/agent/builds", headers=h)
        assert listed.status_code == 200 and listed.get_json()["builds"][0]["slug"] == "once-bot"
        assert secret not in listed.get_data(as_text=True) and "webhook_secret" not in listed.get_json()["builds"][0]

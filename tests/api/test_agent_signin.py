"""Endpoints 6–7: nonce and ed25519 sign-in, sessions — replay, expiry, wrong key,
malformed input, concurrent use of one nonce, rate limit."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import base58
import pytest

from app.extensions import db
from app.ids import sha256_hex
from app.models import AgentSession, SingleUseToken
from tests.support.concurrency import at_once
from tests.agentkit import Keypair, checked_session, nonce, register, session_headers, sign_in
from tests.support.rows import expire


@pytest.fixture
def agent(client, account):
    kp = Keypair()
    r = register(client, account, kp)
    assert r.status_code == 201, r.get_json()
    return kp, r.get_json()


def _expire(app, n: str):
    expire(app, SingleUseToken, SingleUseToken.token_hash == sha256_hex(n))


def test_nonce_shape(client):
    r = client.get("/api/agent/nonce")
    assert r.status_code == 200
    body = r.get_json()
    assert set(body) == {"nonce", "expires_at"}
    assert body["nonce"].startswith("n_") and len(body["nonce"]) == 34
    exp = datetime.fromisoformat(body["expires_at"])
    assert timedelta(minutes=4) < exp - datetime.now(timezone.utc) <= timedelta(minutes=5)
    assert nonce(client) != body["nonce"]


def test_sign_in_and_use_session(client, agent):
    kp, ag = agent
    headers = checked_session(sign_in(client, kp), ag["id"])
    r = client.get(f"/api/agent/{ag['id']}/usage", headers=headers)
    assert r.status_code == 200 and r.get_json()["agent_id"] == ag["id"]
    # sessions act as the agent's account, with session scopes only
    r = client.get("/api/keys", headers=headers)
    assert r.status_code == 403 and r.get_json()["error"] == "insufficient_scope"


def test_session_stored_hashed(app, client, agent):
    kp, _ = agent
    token = sign_in(client, kp).get_json()["session"]
    with app.app_context():
        row = db.session.query(AgentSession).one()
        assert row.token_hash == sha256_hex(token) and token not in str(row.__dict__)


def test_replay_is_refused(client, agent):
    kp, _ = agent
    n = nonce(client)
    body = {"pubkey": kp.pubkey, "nonce": n, "signature": kp.sign(n)}
    assert client.post("/api/agent/signin", json=body).status_code == 200
    r = client.post("/api/agent/signin", json=body)
    assert r.status_code == 401 and r.get_json()["error"] == "nonce_used"


def test_expired_nonce(app, client, agent):
    kp, _ = agent
    n = nonce(client)
    _expire(app, n)
    r = client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": n, "signature": kp.sign(n)})
    assert r.status_code == 401 and r.get_json()["error"] == "nonce_expired"


def test_wrong_key(client, agent):
    kp, _ = agent
    other = Keypair()
    n = nonce(client)
    r = client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": n, "signature": other.sign(n)})
    assert r.status_code == 401 and r.get_json()["error"] == "invalid_signature"
    # signature over a different nonce
    r = client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": n,
                                               "signature": kp.sign(nonce(client))})
    assert r.status_code == 401 and r.get_json()["error"] == "invalid_signature"
    # the refused attempts did not burn the nonce
    r = client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": n, "signature": kp.sign(n)})
    assert r.status_code == 200


def test_unknown_agent_and_unknown_nonce(client, agent):
    stranger = Keypair()
    n = nonce(client)
    r = client.post("/api/agent/signin", json={"pubkey": stranger.pubkey, "nonce": n,
                                               "signature": stranger.sign(n)})
    assert r.status_code == 401 and r.get_json()["error"] == "unknown_agent"
    kp, _ = agent
    forged = "n_" + "A" * 32
    r = client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": forged,
                                               "signature": kp.sign(forged)})
    assert r.status_code == 401 and r.get_json()["error"] == "unknown_nonce"


def _malformed_cases(kp: Keypair, n: str):
    raw_pk = kp.pubkey.split(":", 1)[1]
    sig = kp.sign(n)
    raw_sig = sig.split(":", 1)[1]
    short_pk = base58.b58encode(bytes(kp.sk.verify_key)[:31]).decode()
    return [
        {"pubkey": raw_pk, "signature": sig},                       # no ed25519: prefix
        {"pubkey": "ed25519 " + raw_pk, "signature": sig},
        {"pubkey": "ED25519:" + raw_pk, "signature": sig},
        {"pubkey": "ed25519:" + raw_pk[:-1] + "0", "signature": sig},   # '0' is not base58
        {"pubkey": "ed25519:" + raw_pk + "O", "signature": sig},
        {"pubkey": "ed25519:" + short_pk, "signature": sig},            # 31 bytes
        {"pubkey": "ed25519:1" + raw_pk, "signature": sig},             # 33 bytes / non-canonical
        {"pubkey": "ed25519:", "signature": sig},
        {"pubkey": kp.pubkey + " ", "signature": sig},
        {"pubkey": kp.pubkey, "signature": raw_sig},                    # no base58: prefix
        {"pubkey": kp.pubkey, "signature": "base64:" + raw_sig},
        {"pubkey": kp.pubkey, "signature": "base58:" + raw_sig[:-3]},   # short
        {"pubkey": kp.pubkey, "signature": "base58:" + raw_sig + "l"},  # 'l' is not base58
        {"pubkey": kp.pubkey, "signature": "base58:"},
        {"pubkey": kp.pubkey, "signature": "base58:" + raw_sig, "nonce": "x_" + n[2:]},
        {"pubkey": kp.pubkey, "signature": "base58:" + raw_sig, "nonce": n + "A"},
    ]


def test_malformed_is_401(client, agent):
    kp, _ = agent
    n = nonce(client)
    for case in _malformed_cases(kp, n):
        body = {"nonce": n, **case}
        r = client.post("/api/agent/signin", json=body)
        assert r.status_code == 401, (case, r.get_json())
        assert r.get_json()["error"] == "malformed_signin", case
    # none of it consumed the nonce
    r = client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": n, "signature": kp.sign(n)})
    assert r.status_code == 200


@pytest.mark.parametrize("body", [{}, {"pubkey": "x", "nonce": "y"}, {"pubkey": 1, "nonce": "n", "signature": "s"},
                                  {"pubkey": "x" * 201, "nonce": "n", "signature": "s"}])
def test_missing_or_wrong_type_fields_are_400(client, body):
    r = client.post("/api/agent/signin", json=body)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"


def test_expired_and_unknown_sessions_are_401(app, client, agent):
    kp, ag = agent
    headers = session_headers(client, kp)
    url = f"/api/agent/{ag['id']}/earnings"
    assert client.get(url, headers=headers).status_code == 200
    expire(app, AgentSession)
    from app import auth
    auth.clear_cache()
    r = client.get(url, headers=headers)
    assert r.status_code == 401 and r.get_json()["error"] == "unauthorized"
    from app.ids import new_secret
    r = client.get(url, headers={"Authorization": f"Bearer {new_secret('svc_sess_')}"})
    assert r.status_code == 401


def test_concurrent_sign_ins_with_one_nonce(app, agent):
    kp, _ = agent
    client = app.test_client()
    n = nonce(client)
    body = {"pubkey": kp.pubkey, "nonce": n, "signature": kp.sign(n)}
    def attempt():
        r = app.test_client().post("/api/agent/signin", json=body)
        return r.status_code, (r.get_json() or {}).get("error")

    results = at_once(8, attempt)
    assert sorted(s for s, _ in results) == [200] + [401] * 7, results
    assert {e for s, e in results if s == 401} == {"nonce_used"}
    with app.app_context():
        assert db.session.query(AgentSession).count() == 1


def test_nonce_rate_limited_per_ip(client):
    codes = [client.get("/api/agent/nonce").status_code for _ in range(30)]
    assert codes == [200] * 30
    r = client.get("/api/agent/nonce")
    assert r.status_code == 429
    body = r.get_json()
    assert body["error"] == "rate_limited" and body["request_id"] == r.headers["X-Request-Id"]
    assert int(r.headers["Retry-After"]) > 0
    # another client IP is not affected
    r = client.get("/api/agent/nonce", environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert r.status_code == 200


def test_the_documented_session_scopes_are_the_sessions_scopes(client, agent):
    """The Session's description in /openapi.json names exactly the scopes a session holds
    (it named four of the seven: an agent developer read that a session cannot see its
    account or wallet, nor fund itself, which it can)."""
    from app.scopes import ALL_SCOPES, SESSION_SCOPES

    doc = client.get("/openapi.json").get_json()["components"]["schemas"]["AgentSession"]
    described = doc["properties"]["session"]["description"]
    assert {s for s in ALL_SCOPES if f"`{s}`" in described} == set(SESSION_SCOPES), described
    r = client.get("/api/wallet/balance", headers=session_headers(client, agent[0]))
    assert r.status_code == 200, r.get_json()


def test_nonces_and_sessions_are_never_cached(client, agent):
    """A GET of a nonce carried no Cache-Control, so a caching proxy in front of two agents
    could hand both the same nonce (one then fails `nonce_used`), and the sign-in's session
    token could be stored on the way; every answer of /api/agent/* is now `no-store`."""
    kp, body = agent
    r = client.get("/api/agent/nonce")
    assert r.headers.get("Cache-Control") == "no-store"
    n = r.get_json()["nonce"]
    r = client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": n, "signature": kp.sign(n)})
    assert r.status_code == 200 and r.headers.get("Cache-Control") == "no-store"
    r = client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": n, "signature": kp.sign(n)})
    assert r.status_code == 401 and r.headers.get("Cache-Control") == "no-store"
    r = client.get(f"/api/agent/{body['id']}/earnings", headers=session_headers(client, kp))
    assert r.status_code == 200 and r.headers.get("Cache-Control") == "no-store"

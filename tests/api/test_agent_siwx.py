"""Sign-In-With-X (CAIP-122 / SIWE) for agents with an EVM wallet: registration with a
CAIP-10 pubkey, the challenge, sign-in with a real eth-account wallet through the x402
package's client helpers (``create_siwx_payload``, ``encode_siwx_header``), the session on
the account routes, and every refusal (replay, tampering, expiry, wrong domain, another
signer, unknown address) changing nothing. Verification never leaves the machine."""
from __future__ import annotations

import asyncio
import base64
import json
import secrets
import socket
import string
from datetime import datetime, timedelta
from urllib.parse import urlparse

import pytest
from eth_account import Account
from sqlalchemy import func, select
from x402.extensions.sign_in_with_x import create_siwx_payload, encode_siwx_header

from app.extensions import db
from app.ids import sha256_hex
from app.models import AgentSession, SingleUseToken
from app.models.base import utcnow
from tests.agentkit import Keypair, checked_session
from tests.support.concurrency import at_once
from tests.support.rows import expire

CHAIN = "eip155:8453"


@pytest.fixture
def base(app):
    """This API's origin as the app knows it (BASE_URL): the SIWE domain and uri."""
    u = urlparse(app.config["BASE_URL"])
    return f"{u.scheme}://{u.netloc}"


@pytest.fixture
def wallet():
    return Account.create()


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """Sign-in must never reach the network: only loopback and Unix sockets are allowed."""
    real = socket.socket.connect

    def connect(self, address):
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"network call to {address}")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


def register(client, owner, pubkey, name="evm-bot"):
    return client.post("/api/agent/register", json={"name": name, "pubkey": pubkey}, headers=owner.headers)


def caip10(wallet, chain=CHAIN) -> str:
    return f"{chain}:{wallet.address}"


@pytest.fixture
def agent(client, account, wallet):
    r = register(client, account, caip10(wallet))
    assert r.status_code == 201, r.get_json()
    return r.get_json()


def challenge(client, base) -> dict:
    r = client.get("/api/agent/siwx", base_url=base)
    assert r.status_code == 200, r.get_json()
    return r.get_json()


def signed_header(wallet, info: dict, request_url: str, chain=CHAIN) -> str:
    """The official client's path: choose a chain, sign, encode the SIGN-IN-WITH-X header."""
    payload = asyncio.run(create_siwx_payload({**info, "chainId": chain, "type": "eip191"}, wallet, request_url))
    return encode_siwx_header(payload)


def post(client, base, header):
    return client.post("/api/agent/siwx", base_url=base, headers={"SIGN-IN-WITH-X": header})


def sign_in(client, base, wallet, chain=CHAIN, **override):
    info = challenge(client, base)["info"]
    info.update(override)
    return post(client, base, signed_header(wallet, info, base + "/api/agent/siwx", chain)), info


def decode(header: str) -> dict:
    return json.loads(base64.b64decode(header))


def encode(payload: dict) -> str:
    return base64.b64encode(json.dumps(payload).encode()).decode()


def sessions(app) -> int:
    with app.app_context():
        n = db.session.scalar(select(func.count()).select_from(AgentSession))
        db.session.remove()
        return n


def iso(dt: datetime) -> str:
    return dt.replace(microsecond=0).isoformat().replace("+00:00", "Z")


# --- registration ------------------------------------------------------------------------

def test_register_evm_identity_checksummed_and_idempotent(client, make_account, wallet):
    owner = make_account()
    lower = f"{CHAIN}:{wallet.address.lower()}"
    r = register(client, owner, lower)
    assert r.status_code == 201, r.get_json()
    ag = r.get_json()
    assert ag["pubkey"] == caip10(wallet)  # stored with the EIP-55 address
    again = register(client, owner, caip10(wallet), name="renamed")
    assert again.status_code == 201 and again.get_json()["id"] == ag["id"]
    assert again.get_json()["name"] == "renamed"
    other = register(client, make_account(), caip10(wallet))
    assert other.status_code == 409 and other.get_json()["error"] == "conflict"
    # the same wallet on another supported chain is another CAIP-10 account
    assert register(client, owner, caip10(wallet, "eip155:84532")).get_json()["id"] != ag["id"]


@pytest.mark.parametrize("pubkey", [
    "eip155:8453:0x" + "g" * 40,           # not hex
    "eip155:8453:0x" + "a" * 39,           # short
    "eip155:08453:0x" + "a" * 40,          # leading zero chain id
    "eip155::0x" + "a" * 40,
    "eip155:8453:" + "a" * 40,             # no 0x
])
def test_register_malformed_evm_pubkeys_are_400(client, account, pubkey):
    r = register(client, account, pubkey)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", r.get_json()


def test_register_bad_checksum_and_unsupported_chain_are_422(client, account, wallet):
    addr = wallet.address
    i = next(i for i, c in enumerate(addr[2:], 2) if c.isalpha())
    typo = addr[:i] + addr[i].swapcase() + addr[i + 1:]  # mixed case, wrong EIP-55 checksum
    r = register(client, account, f"{CHAIN}:{typo}")
    assert r.status_code == 422 and "checksum" in r.get_json()["message"]
    r = register(client, account, caip10(wallet, "eip155:999"))
    assert r.status_code == 422 and "not supported" in r.get_json()["message"]


def test_openapi_documents_siwx(client):
    doc = client.get("/openapi.json").get_json()
    assert "eip155:" in doc["components"]["schemas"]["Register"]["properties"]["pubkey"]["pattern"]
    post_op = doc["paths"]["/api/agent/siwx"]["post"]
    (param,) = [p for p in post_op["parameters"] if p["in"] == "header"]
    assert param["name"] == "SIGN-IN-WITH-X" and param["required"] is True
    assert "AgentSession" in json.dumps(post_op["responses"]["200"])
    assert "get" in doc["paths"]["/api/agent/siwx"]


# --- challenge and sign-in ---------------------------------------------------------------

def test_challenge_is_the_extensions_shape(client, base):
    ch = challenge(client, base)
    assert set(ch) == {"info", "supportedChains", "schema"}
    info = ch["info"]
    assert info["domain"] == urlparse(base).netloc and info["uri"] == base + "/api/agent/siwx"
    assert info["version"] == "1" and info["nonce"].isalnum() and len(info["nonce"]) == 32
    issued = datetime.fromisoformat(info["issuedAt"].replace("Z", "+00:00"))
    expires = datetime.fromisoformat(info["expirationTime"].replace("Z", "+00:00"))
    assert expires - issued == timedelta(minutes=5)
    assert {"chainId": CHAIN, "type": "eip191"} in ch["supportedChains"]
    assert "signature" in ch["schema"]["required"]
    assert challenge(client, base)["info"]["nonce"] != info["nonce"]


def test_sign_in_gives_the_same_session_as_ed25519(app, client, base, wallet, agent):
    r, _ = sign_in(client, base, wallet)
    headers = checked_session(r, agent["id"])
    me = client.get("/api/account", headers=headers)
    assert me.status_code == 200, me.get_json()
    assert me.get_json()["agent_id"] == agent["id"] and me.get_json()["id"] == agent["account_id"]
    assert client.get(f"/api/agent/{agent['id']}/usage", headers=headers).status_code == 200
    r = client.get("/api/keys", headers=headers)  # session scopes only, as for ed25519
    assert r.status_code == 403 and r.get_json()["error"] == "insufficient_scope"


def test_replay_is_refused_and_changes_nothing(app, client, base, wallet, agent):
    info = challenge(client, base)["info"]
    header = signed_header(wallet, info, base + "/api/agent/siwx")
    assert post(client, base, header).status_code == 200
    n = sessions(app)
    r = post(client, base, header)
    assert r.status_code == 401 and r.get_json()["error"] == "nonce_used"
    assert sessions(app) == n


def test_gateway_nonce_and_siwx_nonce_are_one_token(app, client, base, account, wallet, agent):
    """The SIWE nonce is the gateway nonce without ``n_``: consuming one consumes the other."""
    kp = Keypair()
    assert register(client, account, kp.pubkey, name="ed-bot").status_code == 201
    n = client.get("/api/agent/nonce").get_json()["nonce"]
    info = challenge(client, base)["info"]
    info["nonce"] = n[2:]
    assert post(client, base, signed_header(wallet, info, base + "/api/agent/siwx")).status_code == 200
    r = client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": n, "signature": kp.sign(n)})
    assert r.status_code == 401 and r.get_json()["error"] == "nonce_used"
    # and the other way round: an ed25519 sign-in consumes the challenge's nonce
    info = challenge(client, base)["info"]
    n = "n_" + info["nonce"]
    r = client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": n, "signature": kp.sign(n)})
    assert r.status_code == 200, r.get_json()
    _refused(app, client, base, signed_header(wallet, info, base + "/api/agent/siwx"), "nonce_used")


def _refused(app, client, base, header, code):
    n = sessions(app)
    r = post(client, base, header)
    assert r.status_code == 401, r.get_json()
    assert r.get_json()["error"] == code, r.get_json()
    assert sessions(app) == n
    return r


def test_tampered_message_is_refused_without_consuming_the_nonce(app, client, base, wallet, agent):
    info = challenge(client, base)["info"]
    header = signed_header(wallet, info, base + "/api/agent/siwx")
    for field, value in (("statement", "Send all funds."), ("issuedAt", iso(utcnow() - timedelta(seconds=5))),
                         ("signature", "0x" + "11" * 65)):
        bad = {**decode(header), field: value}
        _refused(app, client, base, encode(bad), "invalid_signature")
    # the untampered message still signs in: the refusals consumed nothing
    assert post(client, base, header).status_code == 200


def test_signature_by_another_address_is_refused(app, client, base, wallet, agent):
    info = challenge(client, base)["info"]
    forged = decode(signed_header(Account.create(), info, base + "/api/agent/siwx"))
    forged["address"] = wallet.address  # claims the registered wallet, signed by another
    _refused(app, client, base, encode(forged), "invalid_signature")


def test_unregistered_address_and_other_chain_are_unknown_agents(app, client, base, wallet, agent):
    info = challenge(client, base)["info"]
    _refused(app, client, base, signed_header(Account.create(), info, base + "/api/agent/siwx"), "unknown_agent")
    # registered on Base, signing for Ethereum mainnet: another CAIP-10 account
    _refused(app, client, base, signed_header(wallet, info, base + "/api/agent/siwx", "eip155:1"), "unknown_agent")
    # the nonce was not consumed by those refusals
    assert post(client, base, signed_header(wallet, info, base + "/api/agent/siwx")).status_code == 200


def test_unsupported_chain_is_refused(app, client, base, wallet, agent):
    info = challenge(client, base)["info"]
    _refused(app, client, base, signed_header(wallet, info, base + "/api/agent/siwx", "eip155:999"),
             "siwx_unsupported_chain")


def test_wrong_domain_is_refused(app, client, base, wallet, agent):
    info = challenge(client, base)["info"]
    evil = {**info, "domain": "evil.example", "uri": "https://evil.example/api/agent/siwx"}
    _refused(app, client, base, signed_header(wallet, evil, "https://evil.example/api/agent/siwx"),
             "siwx_wrong_domain")
    # the API's host but another origin in the uri (checked before the signature)
    other_origin = {**decode(signed_header(wallet, info, base + "/api/agent/siwx")),
                    "uri": info["uri"].replace("http", "ftp", 1)}
    _refused(app, client, base, encode(other_origin), "siwx_wrong_domain")


def test_expired_and_stale_messages_are_refused(app, client, base, wallet, agent):
    info = challenge(client, base)["info"]
    url = base + "/api/agent/siwx"
    now = utcnow()
    expired = {**info, "expirationTime": iso(now - timedelta(seconds=1))}
    _refused(app, client, base, signed_header(wallet, expired, url), "siwx_message_expired")
    stale = {**info, "issuedAt": iso(now - timedelta(minutes=6)), "expirationTime": iso(now + timedelta(minutes=5))}
    _refused(app, client, base, signed_header(wallet, stale, url), "siwx_message_expired")
    future = {**info, "issuedAt": iso(now + timedelta(minutes=2))}
    _refused(app, client, base, signed_header(wallet, future, url), "siwx_message_expired")
    not_yet = {**info, "notBefore": iso(now + timedelta(minutes=2))}
    _refused(app, client, base, signed_header(wallet, not_yet, url), "siwx_message_expired")


def test_unknown_and_expired_nonces_are_refused(app, client, base, wallet, agent):
    url = base + "/api/agent/siwx"
    info = challenge(client, base)["info"]
    made_up = {**info, "nonce": "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(32))}
    _refused(app, client, base, signed_header(wallet, made_up, url), "unknown_nonce")
    expire(app, SingleUseToken, SingleUseToken.token_hash == sha256_hex("n_" + info["nonce"]))
    _refused(app, client, base, signed_header(wallet, info, url), "nonce_expired")


@pytest.mark.parametrize("header", [
    "bm90IGpzb24=",                                     # base64 of "not json"
    base64.b64encode(b'{"domain": "x"}').decode(),     # missing fields
    base64.b64encode(b"\xff\xfe").decode(),            # not UTF-8
    "abc",                                              # bad padding
    base64.b64encode(b"[" * 5000).decode(),            # nested beyond the JSON parser's recursion
])
def test_malformed_header_is_refused(app, client, base, header):
    _refused(app, client, base, header, "malformed_signin")


def test_missing_or_non_base64_header_is_400(client, base):
    r = client.post("/api/agent/siwx", base_url=base)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"
    r = post(client, base, "not base64!")
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"


def test_ed25519_signin_with_an_evm_pubkey_is_malformed(client, wallet, agent):
    n = client.get("/api/agent/nonce").get_json()["nonce"]
    r = client.post("/api/agent/signin", json={"pubkey": caip10(wallet), "nonce": n, "signature": "base58:1"})
    assert r.status_code == 401 and r.get_json()["error"] == "malformed_signin"


def test_concurrent_sign_ins_with_one_message(app, base, wallet, agent):
    """Of eight concurrent sign-ins with one signed message exactly one gets a session."""
    client = app.test_client()
    info = challenge(client, base)["info"]
    header = signed_header(wallet, info, base + "/api/agent/siwx")
    def attempt():
        r = post(app.test_client(), base, header)
        return r.status_code, (r.get_json() or {}).get("error")

    results = at_once(8, attempt)
    assert sorted(results, key=str).count((200, None)) == 1, results
    assert all(r == (401, "nonce_used") for r in results if r[0] != 200), results
    assert sessions(app) == 1

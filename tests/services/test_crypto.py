"""platform.crypto: canonical base58, ed25519, EVM recovery (EIP-191 / EIP-712), Standard
Webhooks signing — and the strict base58 rule now applies to Solana wallet connect too."""
from __future__ import annotations

from datetime import datetime, timezone

import base58
import pytest
from eth_account import Account as EthAccount
from eth_account.messages import encode_defunct, encode_typed_data
from nacl.signing import SigningKey
from standardwebhooks import Webhook, WebhookVerificationError

from app.services.platform import crypto

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_base58_round_trip_and_exact_length():
    raw = bytes(range(1, 33))
    text = crypto.b58encode(raw)
    assert crypto.b58decode(text, 32) == raw
    assert crypto.b58decode(text, 31) is None and crypto.b58decode(text, 33) is None


@pytest.mark.parametrize("mangle", [
    lambda t: "1" + t,            # an extra leading zero byte: decodes, but not to `size` bytes
    lambda t: t + " ",            # trailing whitespace (base58 itself would strip it)
    lambda t: " " + t,
    lambda t: t + "\n",
    lambda t: t[:5] + "0" + t[6:],  # '0', 'O', 'I', 'l' are not in the alphabet
    lambda t: t[:5] + "l" + t[6:],
    lambda t: t.replace(t[3], "\u0661", 1),   # a non-ASCII digit
    lambda t: "",
])
def test_base58_refuses_non_canonical(mangle):
    text = crypto.b58encode(bytes(range(1, 33)))
    assert crypto.b58decode(mangle(text), 32) is None


def test_base58_refuses_text_whose_reencoding_differs():
    raw = b"\x00" + bytes(range(1, 32))
    text = crypto.b58encode(raw)
    assert text.startswith("1") and crypto.b58decode(text, 32) == raw
    # base58 drops trailing whitespace silently; the canonical decoder does not
    assert base58.b58decode(text + "\n") == raw
    assert crypto.b58decode(text + "\n", 32) is None
    assert crypto.b58decode(None, 32) is None and crypto.b58decode("2" * 101, 32) is None


def test_ed25519_good_and_bad():
    sk = SigningKey.generate()
    pk = bytes(sk.verify_key)
    sig = sk.sign(b"hello").signature
    assert crypto.ed25519_key_is_valid(pk)
    assert crypto.ed25519_verify(pk, b"hello", sig)
    assert not crypto.ed25519_verify(pk, b"hellO", sig)
    assert not crypto.ed25519_verify(bytes(SigningKey.generate().verify_key), b"hello", sig)
    assert not crypto.ed25519_verify(pk, b"hello", sig[:-1])
    assert not crypto.ed25519_verify(pk[:31], b"hello", sig)
    assert not crypto.ed25519_key_is_valid(pk[:31])
    assert not crypto.ed25519_key_is_valid(bytes.fromhex("02" + "00" * 30 + "80"))


def test_evm_personal_message_recovery():
    acct = EthAccount.create()
    text = "example.org wants you to sign in with your Ethereum account:\n" + acct.address
    sig = acct.sign_message(encode_defunct(text=text)).signature
    raw = crypto.evm_signature("0x" + sig.hex())
    assert raw == bytes(sig) and crypto.evm_signature(sig.hex()) == raw
    assert crypto.recover_personal_message(text, raw) == acct.address
    assert crypto.recover_personal_message(text + ".", raw) != acct.address
    assert crypto.evm_signature("0x" + sig.hex()[:-2]) is None
    assert crypto.evm_signature("0x" + "zz" * 65) is None and crypto.evm_signature(None) is None
    assert crypto.recover_personal_message(text, b"\x00" * 64 + b"\x05") is None


def test_evm_typed_data_recovery():
    acct = EthAccount.create()
    typed = {
        "types": {"EIP712Domain": [{"name": "name", "type": "string"}, {"name": "chainId", "type": "uint256"}],
                  "Mail": [{"name": "to", "type": "address"}, {"name": "amount", "type": "uint256"}]},
        "primaryType": "Mail",
        "domain": {"name": "Test", "chainId": 8453},
        "message": {"to": acct.address, "amount": 5},
    }
    sig = bytes(EthAccount.sign_message(encode_typed_data(full_message=typed), acct.key).signature)
    assert crypto.recover_typed_data(typed, sig) == acct.address
    assert crypto.recover_typed_data({**typed, "message": {"to": acct.address, "amount": 6}}, sig) != acct.address
    assert crypto.recover_typed_data({"types": {}}, sig) is None


def test_webhook_signature_verifies_with_standardwebhooks():
    ts = datetime.now(timezone.utc).replace(microsecond=0)
    body = b'{"type":"call","data":{"a":1}}'
    headers = crypto.webhook_headers("msg_1", ts, body, SECRET)
    assert headers["webhook-id"] == "msg_1" and headers["webhook-timestamp"] == str(int(ts.timestamp()))
    assert Webhook(SECRET).verify(body, headers) == {"type": "call", "data": {"a": 1}}
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body.replace(b"1", b"2"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "A" * 32).verify(body, headers)
    assert "webhook-signature" not in crypto.webhook_headers("msg_1", ts, body, None)
    assert crypto._signer(SECRET) is crypto._signer(SECRET)  # one signer per secret


def test_solana_connect_refuses_non_canonical_signature(client, account):
    """Wallet connect used a lenient base58 (surrounding whitespace accepted); the one
    canonical decoder applies to it now."""
    key = SigningKey.generate()
    address = base58.b58encode(bytes(key.verify_key)).decode()
    r = client.get("/api/wallet/connect/message", query_string={"chain": "solana", "address": address},
                   headers=account.headers)
    assert r.status_code == 200, r.get_json()
    sig = base58.b58encode(key.sign(r.get_json()["message"].encode()).signature).decode()
    # Whitespace breaks the schema's pattern: 400. A leading "1" (an extra zero byte) keeps
    # the pattern while the string is at most 88 characters, and is then 422 (schema-valid,
    # not the canonical spelling of 64 bytes); a signature's base58 is 87 or 88 characters,
    # so which one applies depends on the key drawn. A truncated signature is always 422.
    cases = [("base58:" + sig + "\n", 400), (" " + sig, 400), ("base58:" + sig[:-2], 422),
             ("base58:1" + sig, 422 if len(sig) + 1 <= 88 else 400)]
    for bad, status in cases:
        r = client.post("/api/wallet/connect", json={"chain": "solana", "address": address, "signature": bad},
                        headers=account.headers)
        error = "invalid_request" if status == 400 else "unprocessable"
        assert r.status_code == status and r.get_json()["error"] == error, (bad, r.get_json())
    r = client.post("/api/wallet/connect", json={"chain": "solana", "address": address,
                                                  "signature": "base58:" + sig}, headers=account.headers)
    assert r.status_code == 200

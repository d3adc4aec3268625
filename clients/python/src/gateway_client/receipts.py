"""Offline verification of call receipts (receipt versions 1 and 2).

A receipt signs the canonical JSON of the call's facts ``{"v", "kid", "call_id",
"account_id", "actor", "actor_account_id", "module", "action", "cost_cents",
"result_sha256", "ok", "mode", "ts"}`` (version 2; version 1 has no ``actor`` and
``actor_account_id``): ``account_id`` paid, ``actor`` is the credential that acted (API key
or agent session id) and ``actor_account_id`` the person behind it (an organisation key's
member); ``result_sha256`` = SHA-256 hex of the canonical JSON of ``result``; canonical
JSON = sorted keys, no spaces, UTF-8. ``hash`` is the SHA-256 hex of those bytes and ``sig``
the base64 ed25519 signature over them, by the key ``kid`` published at
``GET /api/receipts/keys``. Nothing here talks to the network.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any, Mapping

from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from gateway_client.errors import ReceiptInvalid

RECEIPT_VERSION = 2
VERSIONS = (1, 2)


def canonical(obj: Any) -> bytes:
    """The canonical JSON bytes the gateway hashes and signs."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def signed_facts(response: Mapping[str, Any]) -> dict[str, Any]:
    """The facts a call response's receipt signs, rebuilt from the response's fields."""
    try:
        r = response["receipt"]
        facts = {"v": r.get("v", 1), "kid": r["kid"], "call_id": response["call_id"],
                 "account_id": r["account_id"], "module": response["module"], "action": r["action"],
                 "cost_cents": response["cost_cents"],
                 "result_sha256": hashlib.sha256(canonical(response["result"])).hexdigest(),
                 "ok": response["ok"], "mode": r["mode"], "ts": r["ts"]}
        if facts["v"] == 2:
            facts.update(actor=r["actor"], actor_account_id=r["actor_account_id"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ReceiptInvalid(f"not a call response with a receipt: {exc!r}") from None
    # the values as signed, not lookalikes: "false" or 1 is not false/true, 2.9 or "2" not 2
    if not isinstance(facts["ok"], bool) or type(facts["cost_cents"]) is not int:
        raise ReceiptInvalid("`ok` must be a boolean and `cost_cents` an integer, as the receipt signs them")
    return facts


def verify(response: Mapping[str, Any], public_keys: Mapping[str, str]) -> bool:
    """Verify a call response (as returned by the gateway) against ``public_keys``
    (kid → base64 ed25519 public key). True, or raises ``ReceiptInvalid``."""
    facts = signed_facts(response)
    if isinstance(facts["v"], bool) or facts["v"] not in VERSIONS:
        raise ReceiptInvalid(f"unsupported receipt version {facts['v']!r}")
    msg = canonical(facts)
    receipt = response["receipt"]
    if hashlib.sha256(msg).hexdigest() != receipt.get("hash"):
        raise ReceiptInvalid("receipt hash does not match the response's fields (tampered)")
    pub = public_keys.get(facts["kid"])
    if pub is None:
        raise ReceiptInvalid(f"unknown receipt key id {facts['kid']!r}")
    try:
        VerifyKey(base64.b64decode(pub)).verify(msg, base64.b64decode(str(receipt.get("sig"))))
    except (BadSignatureError, ValueError, binascii.Error) as exc:
        raise ReceiptInvalid("receipt signature does not verify") from exc
    return True

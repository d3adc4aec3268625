"""Demo x402 facilitator: ``POST /verify`` and ``POST /settle`` for the ``exact`` EVM scheme
(EIP-3009 ``transferWithAuthorization`` of USDC), offline.

It checks what a real facilitator checks before it submits the transfer — the payload
and requirements parse as x402 types, scheme ``exact``, network and asset as required,
``to`` = ``payTo``, ``value`` = the amount, the validity window, and the EIP-712
signature recovered locally against ``from`` (the ``x402`` package's EIP-3009 hashing and
EOA verification) — and "settles" by recording the authorization (single use) and
answering a deterministic transaction hash. No chain is touched and no USDC moves: this is
the facilitator of ``make run`` (deploy/run-local.d/30-demo-facilitator.sh sets the dev
server's ``X402_FACILITATOR_URL``, and ``RPC_URL_BASE`` to its stand-in chain, ``POST /rpc``)
and the tests' stand-in (tests/standins.py), never a production one. Settling an authorization it already settled answers the same settlement
again (idempotent, which the gateway's x402 reconciliation relies on); a different payload
for a used nonce is refused.

Run: ``python -m demo.facilitator --port 8791``.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time

from pydantic import ValidationError
from x402.mechanisms.evm import V1_NETWORK_CHAIN_IDS
from x402.mechanisms.evm.constants import (ERR_AUTHORIZATION_VALUE_MISMATCH, ERR_INVALID_SIGNATURE,
                                           ERR_NETWORK_MISMATCH, ERR_NONCE_ALREADY_USED,
                                           ERR_RECIPIENT_MISMATCH, ERR_UNSUPPORTED_SCHEME,
                                           ERR_VALID_AFTER_FUTURE, ERR_VALID_BEFORE_EXPIRED)
from x402.mechanisms.evm.eip712 import hash_eip3009_authorization
from x402.mechanisms.evm.types import ExactEIP3009Payload
from x402.mechanisms.evm.utils import get_evm_chain_id
from x402.mechanisms.evm.verify import verify_eoa_signature
from x402.schemas import PaymentPayload, PaymentRequirements, SettleResponse, VerifyResponse
from x402.schemas.v1 import PaymentPayloadV1, PaymentRequirementsV1

from demo import JSONHandler, serve_main


# EIP-3009 ``authorizationState(address,bytes32)`` (app.services.billing.chains)
AUTHORIZATION_STATE = "0xe94a0102"


def _chain_id(network: str) -> int:
    return V1_NETWORK_CHAIN_IDS[network] if network in V1_NETWORK_CHAIN_IDS else get_evm_chain_id(network)


class Facilitator:
    """The facilitator's state: the authorizations it settled (``(payer, nonce)`` → the
    settlement answer). ``answer(path, body)`` serves one request."""

    def __init__(self):
        self.settled: dict[tuple[str, str], dict] = {}
        self.lock = threading.Lock()

    @staticmethod
    def _parse(body: dict):
        """(version, payload, requirements, authorization, signature) of a request."""
        version = body.get("x402Version")
        if version == 1:
            payload = PaymentPayloadV1.model_validate(body["paymentPayload"])
            req = PaymentRequirementsV1.model_validate(body["paymentRequirements"])
        else:
            payload = PaymentPayload.model_validate(body["paymentPayload"])
            req = PaymentRequirements.model_validate(body["paymentRequirements"])
        evm = ExactEIP3009Payload.from_dict(payload.payload)
        return version, payload, req, evm.authorization, evm.signature or ""

    def check(self, body: dict) -> tuple[str | None, str | None]:
        """(invalid reason or None, payer)."""
        try:
            version, payload, req, auth, signature = self._parse(body)
            chain_id = _chain_id(req.network)
            value, valid_after, valid_before = int(auth.value), int(auth.valid_after), int(auth.valid_before)
            sig = bytes.fromhex(signature.removeprefix("0x"))
        except (KeyError, TypeError, ValueError, ValidationError):
            return "invalid_payload", None
        payer = auth.from_address
        if payload.get_scheme() != "exact" or req.scheme != "exact":
            return ERR_UNSUPPORTED_SCHEME, payer
        if payload.get_network() != req.network:
            return ERR_NETWORK_MISMATCH, payer
        if auth.to.lower() != req.pay_to.lower():
            return ERR_RECIPIENT_MISMATCH, payer
        if value != int(req.get_amount()):  # `exact`: the price, no more and no less
            return ERR_AUTHORIZATION_VALUE_MISMATCH, payer
        now = int(time.time())
        if valid_after > now:
            return ERR_VALID_AFTER_FUTURE, payer
        if valid_before <= now:
            return ERR_VALID_BEFORE_EXPIRED, payer
        extra = req.get_extra() or {}
        try:
            digest = hash_eip3009_authorization(auth, chain_id, req.asset, extra.get("name", ""),
                                                extra.get("version", ""))
            valid = verify_eoa_signature(digest, sig, payer)
        except ValueError:
            valid = False
        return (None if valid else ERR_INVALID_SIGNATURE), payer

    def verify(self, body: dict) -> dict:
        reason, payer = self.check(body)
        done = self.settled.get(self._key(body))
        if reason is None and done is not None and done["_body"] != body:
            reason = ERR_NONCE_ALREADY_USED
        return VerifyResponse(is_valid=reason is None, invalid_reason=reason, payer=payer).model_dump(
            by_alias=True, exclude_none=True)

    @staticmethod
    def _key(body: dict) -> tuple[str, str]:
        auth = (body.get("paymentPayload") or {}).get("payload", {}).get("authorization", {})
        return str(auth.get("from", "")).lower(), str(auth.get("nonce", "")).lower()

    def settle(self, body: dict, on_settle=None) -> dict:
        """Settle once: the first settlement of an authorization records it (and calls
        ``on_settle(body, transaction)``, e.g. to move USDC on a stand-in chain); the same
        request again answers the same settlement."""
        reason, payer = self.check(body)
        network = str((body.get("paymentRequirements") or {}).get("network", ""))
        key = self._key(body)
        with self.lock:
            done = self.settled.get(key)
            if done is not None:
                if done["_body"] == body:
                    return done["answer"]
                reason = ERR_NONCE_ALREADY_USED
            if reason is not None:
                return SettleResponse(success=False, error_reason=reason, payer=payer, transaction="",
                                      network=network).model_dump(by_alias=True, exclude_none=True)
            tx = "0x" + hashlib.sha256(f"{key[0]}:{key[1]}".encode()).hexdigest()
            answer = SettleResponse(success=True, payer=payer, transaction=tx, network=network,
                                    amount=str(body["paymentRequirements"].get("amount")
                                               or body["paymentRequirements"].get("maxAmountRequired"))
                                    ).model_dump(by_alias=True, exclude_none=True)
            self.settled[key] = {"_body": body, "answer": answer}
            if on_settle is not None:
                on_settle(body, tx)
        return answer

    def rpc(self, call: dict) -> dict:
        """The stand-in chain (``POST /rpc``, EVM JSON-RPC): ``make run``'s ``RPC_URL_BASE``, so
        what asks a chain (x402 reconciliation, the deposit watcher, wallet balances) asks
        this local one, never a public network. Its used EIP-3009 authorizations
        (``authorizationState``) are the ones this facilitator settled; it holds no USDC
        (``balanceOf`` 0) and no transfers (no logs, no receipts); its height grows with time."""
        method, params = call.get("method"), call.get("params") or [{}]
        if method == "eth_chainId":
            result = hex(8453)
        elif method == "eth_blockNumber":
            result = hex(int(time.time()) // 2)
        elif method == "eth_getLogs":
            result = []
        elif method == "eth_getTransactionReceipt":
            result = None
        elif method == "eth_call" and isinstance(params[0], dict):
            data = str(params[0].get("data") or "").lower()
            used = data.startswith(AUTHORIZATION_STATE) and \
                ("0x" + data[10:74][-40:], "0x" + data[74:138]) in self.settled
            result = "0x" + format(int(used), "064x")
        else:
            return {"jsonrpc": "2.0", "id": call.get("id"),
                    "error": {"code": -32601, "message": f"the demo chain does not serve {method}"}}
        return {"jsonrpc": "2.0", "id": call.get("id"), "result": result}

    def answer(self, path: str, body) -> tuple[int, dict]:
        if not isinstance(body, dict):
            return 400, {"error": "a JSON object is required"}
        if path.rstrip("/").endswith("/rpc"):
            return 200, self.rpc(body)
        if path.endswith("/verify"):
            return 200, self.verify(body)
        if path.endswith("/settle"):
            return 200, self.settle(body)
        if path.endswith("/supported"):
            return 200, {"kinds": [{"x402Version": v, "scheme": "exact", "network": n}
                                   for v, n in ((2, "eip155:8453"), (1, "base"))]}
        return 404, {"error": f"no such endpoint {path}"}


class FacilitatorHandler(JSONHandler):
    facilitator = Facilitator()

    def do_POST(self):
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null") if length <= 1 << 20 else None
        except ValueError:
            body = None
        self._json(*self.facilitator.answer(self.path, body))

    def do_GET(self):
        self._json(*self.facilitator.answer(self.path, {}))


def main(argv: list[str] | None = None) -> None:
    serve_main(FacilitatorHandler, description=__doc__.splitlines()[0], port=8791, label="demo x402 facilitator", argv=argv)


if __name__ == "__main__":
    main()

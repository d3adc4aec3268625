"""x402 payment payloads: read the ``X-Payment`` / ``PAYMENT-SIGNATURE`` header, decode it
(base64 or base64url, bounded: the ``x402`` package's ``decode_payment_signature_header``
takes neither base64url nor a size limit), parse it as the package's ``PaymentPayload`` /
``PaymentPayloadV1`` and ``ExactEIP3009Payload``, and verify the EIP-3009
``TransferWithAuthorization`` against a price (the package's EIP-712 hash and EOA signature
check). Pure checks: nothing here writes to the database.
"""
from __future__ import annotations

import base64
import binascii
import json
import time
from typing import TYPE_CHECKING

from eth_utils import is_hex_address, to_checksum_address
from pydantic import ValidationError
from x402.schemas import PaymentPayload
from x402.schemas.v1 import PaymentPayloadV1

from app.errors import DomainError
from app.services.billing import chains
from app.services.platform import crypto
from app.services.billing.x402.requirements import PAYMENT_HEADERS, enabled, networks, pay_to

if TYPE_CHECKING:
    from x402.mechanisms.evm.types import ExactEIP3009Payload

MAX_HEADER_BYTES = 8192
INT64_LIMIT = 2**63


VALID_BEFORE_MARGIN_SECONDS = 6  # an authorization must stay valid while it is settled


class InvalidPayment(DomainError):
    status, code, message = 400, "invalid_payment", "The payment header could not be decoded."
    description = "The X-Payment header could not be decoded."


class PaymentInvalid(DomainError):
    status, code, message = 402, "payment_invalid", "The payment was refused."
    description = "The X-Payment authorization was refused (amount, recipient, expiry, replay)."

    def __init__(self, reason: str, message: str, **kw):
        extra = {"reason": reason, **(kw.pop("extra", None) or {})}
        super().__init__(message, extra=extra, **kw)
        self.reason = reason


class FacilitatorUnavailable(DomainError):
    status, code, message = 503, "facilitator_unavailable", "The payment facilitator did not answer."
    description = ("x402: the facilitator gave no verdict on the payment (no answer or a server error at "
                   "/verify): nothing moved and nothing was charged; send the same payment again after "
                   "`Retry-After`.")

    def __init__(self, message: str, retry_after: int):
        super().__init__(message, headers={"Retry-After": str(retry_after)}, extra={"reason": self.code})
        self.reason = self.code


class SettlementUnavailable(FacilitatorUnavailable):
    code, message = "settlement_unavailable", "The payment facilitator gave no settlement verdict."
    description = ("x402: the facilitator gave no verdict on the settlement (no answer or a server error at "
                   "/settle), so whether the USDC moved is not known yet: the authorization stays reserved and "
                   "nothing was charged. If it settled, reconciliation credits it to the balance within minutes; "
                   "do not pay again: retry the call after `Retry-After`, it is then paid from the balance. The "
                   "same payment sent again before then is answered this too.")


def header_from(headers) -> str | None:
    """The payment header of a request (``PAYMENT-SIGNATURE`` preferred, else ``X-Payment``)."""
    for name in PAYMENT_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None


def decode(value: str) -> dict:
    """base64 or base64url JSON → dict; 400 ``invalid_payment`` otherwise."""
    value = (value or "").strip()
    if not value or len(value) > MAX_HEADER_BYTES:
        raise InvalidPayment("The payment header is empty or too large.")
    padded = (value + "=" * (-len(value) % 4)).encode()
    raw = None
    for altchars in (None, b"-_"):
        try:
            raw = base64.b64decode(padded, altchars=altchars, validate=True)
            break
        except (binascii.Error, ValueError):
            continue
    if raw is None:
        raise InvalidPayment("The payment header is not base64 or base64url.")
    try:
        data = json.loads(raw)
    except ValueError:
        raise InvalidPayment("The payment header does not contain JSON.") from None
    if not isinstance(data, dict):
        raise InvalidPayment("The payment header must be a JSON object.")
    parse(data)
    return data


def parse(data: dict) -> tuple[PaymentPayload | PaymentPayloadV1, ExactEIP3009Payload]:
    """The decoded payload as the ``x402`` package's types: the v1 or v2 ``PaymentPayload``
    and its ``exact`` EVM (EIP-3009) payload. 400 ``invalid_payment`` when it is not one."""
    try:
        payload = (PaymentPayloadV1 if data.get("x402Version") == 1 else PaymentPayload).model_validate(data)
    except ValidationError:
        raise InvalidPayment("The payment header is not an x402 v1/v2 exact EVM payment payload.") from None
    inner = payload.payload
    auth = inner.get("authorization")
    if data.get("x402Version") not in (1, 2) or not isinstance(auth, dict) or not isinstance(inner.get("signature"), str):
        raise InvalidPayment("The payment header is not an x402 v1/v2 exact EVM payment payload.")
    for key in ("from", "to", "value", "validAfter", "validBefore", "nonce"):
        if not isinstance(auth.get(key), (str, int)) or isinstance(auth.get(key), bool):
            raise InvalidPayment(f"The payment authorization lacks `{key}`.")
    from x402.mechanisms.evm.types import ExactEIP3009Payload  # evm: see verify()

    return payload, ExactEIP3009Payload.from_dict(inner)


def _int(value, name: str) -> int:
    try:
        out = int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise InvalidPayment(f"The payment authorization `{name}` is not an integer.") from None
    if out < 0 or out >= INT64_LIMIT:  # every amount and time we store is a signed 64-bit integer
        raise InvalidPayment(f"The payment authorization `{name}` is out of range (0 to 2^63-1).")
    return out


def _network_of(payload: PaymentPayload | PaymentPayloadV1) -> tuple[str, str | None, str]:
    """(chain name, asset named by the payload or None, scheme)."""
    network = str(payload.get_network())
    chain = next((c for c, v in chains.CAIP2.items() if v == network), network)
    asset = payload.accepted.asset if isinstance(payload, PaymentPayload) else None
    return chain, asset, str(payload.get_scheme())


def verify(data: dict, price_micros: int) -> dict:
    """Check a decoded payload locally; returns the authorization facts. 402 when refused."""
    if not enabled():
        raise PaymentInvalid("x402_disabled", "x402 payments are not enabled on this deployment (X402_PAY_TO).")
    payload, evm = parse(data)
    chain, asset, scheme = _network_of(payload)
    if scheme != "exact":
        raise PaymentInvalid("unsupported_scheme", f"Scheme `{scheme}` is not accepted; use `exact`.")
    if chain not in networks():  # named as the payment names networks (v2: CAIP-2, v1: names)
        v2 = isinstance(payload, PaymentPayload)
        accepted = [chains.CAIP2[c] if v2 else c for c in networks()]
        raise PaymentInvalid("unsupported_network", f"Network `{payload.get_network()}` is not accepted; use "
                                                    f"one of {', '.join(accepted)}.")
    usdc = to_checksum_address(chains.usdc_contract(chain))
    if asset is not None and (not isinstance(asset, str) or asset.lower() != usdc.lower()):
        raise PaymentInvalid("wrong_asset", f"Only USDC ({usdc}) is accepted on {chain}.")
    auth, signature = data["payload"]["authorization"], evm.signature
    for key in ("from", "to"):
        if not isinstance(auth[key], str) or not is_hex_address(auth[key]):
            raise InvalidPayment(f"The payment authorization `{key}` is not an address.")
    payer, to = to_checksum_address(auth["from"]), to_checksum_address(auth["to"])
    value = _int(auth["value"], "value")
    valid_after, valid_before = _int(auth["validAfter"], "validAfter"), _int(auth["validBefore"], "validBefore")
    nonce = str(auth["nonce"]).lower()
    if not (nonce.startswith("0x") and len(nonce) == 66 and all(c in "0123456789abcdef" for c in nonce[2:])):
        raise InvalidPayment("The payment authorization `nonce` must be 32 bytes of 0x-hex.")
    if to != pay_to():
        raise PaymentInvalid("wrong_recipient", f"The authorization pays {to}, not {pay_to()}.")
    price_atomic = int(price_micros)  # one atomic USDC unit is one micro-dollar
    if value < price_atomic:
        raise PaymentInvalid("insufficient_amount", f"The authorization is for {value} atomic USDC; the price "
                                                    f"is {price_atomic}.")
    now = int(time.time())
    if valid_after > now:
        raise PaymentInvalid("not_yet_valid", "The authorization is not valid yet (validAfter).")
    if valid_before <= now + VALID_BEFORE_MARGIN_SECONDS:
        raise PaymentInvalid("expired", "The authorization has expired (validBefore).")
    # x402's EVM mechanism is imported where it is used: it loads web3 and eth-account
    # (about 1.5 s), which every process loading the app would pay for its first payment
    from x402.mechanisms.evm.eip712 import hash_eip3009_authorization
    from x402.mechanisms.evm.types import ExactEIP3009Authorization
    from x402.mechanisms.evm.verify import verify_eoa_signature

    name, version = chains.USDC_EIP712[chain]
    digest = hash_eip3009_authorization(
        ExactEIP3009Authorization(from_address=payer, to=to, value=str(value), valid_after=str(valid_after),
                                  valid_before=str(valid_before), nonce=nonce),
        chains.CHAIN_IDS[chain], usdc, name, version)
    sig_bytes = crypto.evm_signature(signature)
    try:
        signed = sig_bytes is not None and verify_eoa_signature(digest, sig_bytes, payer)
    except ValueError:  # not a recoverable (r, s, v)
        sig_bytes = None
    if sig_bytes is None:
        raise PaymentInvalid("invalid_signature", "The authorization signature is malformed.")
    if not signed:
        raise PaymentInvalid("invalid_signature", "The authorization was not signed by `from`.")
    if value > price_atomic:  # the `exact` scheme: the authorization moves the price, no more
        raise PaymentInvalid("amount_exceeds_price", f"The authorization is for {value} atomic USDC; the "
                                                     f"`exact` scheme pays exactly the price, {price_atomic}.")
    return {"chain": chain, "payer": payer, "value": value, "nonce": nonce, "version": data["x402Version"],
            "auth_key": f"{chain}:{payer.lower()}:{nonce}", "data": data, "valid_before": valid_before}

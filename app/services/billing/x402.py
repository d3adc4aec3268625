"""x402 pay-per-call: payment requests, ``X-Payment`` / ``PAYMENT-SIGNATURE`` verification
(EIP-3009 ``TransferWithAuthorization`` recovered with eth-account), single-use
reservation, settlement (facilitator ``/verify`` + ``/settle``, or local in sandbox mode)
and the ledger credit (DESIGN §8).

How the call path uses it (``app/services/gateway/calls.py``)::

    # inside the call's charging transaction, after the balance could not cover the price:
    pay = x402.fund_call(header, account_id=…, price_micros=…, call_id=…, mode=…, resource_url=…)
    ledger.post("module_call", …)     # the call's charge, from that credit
    db.session.commit()               # payment + charge: one transaction
    response.headers.update(x402.response_headers(pay))

``accept`` raises 400 ``invalid_payment`` (undecodable) or 402 ``payment_invalid`` (with
``reason``). Once an authorization is reserved it can never be used again; once it is
settled the money is always booked, at worst as account credit (``book_orphans`` sweep).
"""
from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from dataclasses import dataclass, field

import requests
from eth_account import Account as EthAccount
from eth_account.messages import encode_typed_data
from eth_utils import is_hex_address, to_checksum_address
from flask import current_app
from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from app.errors import DomainError
from app.extensions import db
from app.ids import new_id
from app.models import LedgerTransaction, Payment, X402Authorization
from app.models.base import utcnow
from app.services.billing import chains
from app.services.billing import ledger

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 8192
PAYMENT_HEADERS = ("PAYMENT-SIGNATURE", "X-Payment")
ATOMIC_PER_CENT = 10_000  # USDC has 6 decimals: one atomic unit is one micro-dollar
VALID_BEFORE_MARGIN_SECONDS = 6  # an authorization must stay valid while it is settled


class InvalidPayment(DomainError):
    status, code, message = 400, "invalid_payment", "The payment header could not be decoded."


class PaymentInvalid(DomainError):
    status, code, message = 402, "payment_invalid", "The payment was refused."

    def __init__(self, reason: str, message: str, **kw):
        extra = {"reason": reason, **(kw.pop("extra", None) or {})}
        super().__init__(message, extra=extra, **kw)
        self.reason = reason


@dataclass
class X402Payment:
    """A verified, reserved (and, with a facilitator, settled) payment."""

    auth_id: str
    auth_key: str
    account_id: str
    version: int
    network: str  # our chain name: base | ethereum | polygon
    payer: str
    value_atomic: int
    sandbox: bool
    transaction: str | None = None
    booked: bool = field(default=False)


# --- configuration ----------------------------------------------------------------------

def enabled() -> bool:
    """x402 is on when a pay-to address is configured (always outside production)."""
    return bool(current_app.config.get("X402_PAY_TO"))


def networks() -> list[str]:
    if not enabled():
        return []
    return [n for n in current_app.config["X402_NETWORKS"] if n in chains.EVM_CHAINS]


def pay_to() -> str:
    return to_checksum_address(current_app.config["X402_PAY_TO"])


def is_sandbox(mode: str) -> bool:
    return mode == "test" or not current_app.config.get("X402_FACILITATOR_URL")


# --- payment requests (402) -----------------------------------------------------------

def _v2_requirement(chain: str, atomic: int) -> dict:  # atomic USDC == micros
    name, version = chains.USDC_EIP712[chain]
    return {"scheme": "exact", "network": chains.CAIP2[chain], "asset": to_checksum_address(chains.usdc_contract(chain)),
            "amount": str(atomic), "payTo": pay_to(),
            "maxTimeoutSeconds": int(current_app.config["X402_MAX_TIMEOUT_SECONDS"]),
            "extra": {"name": name, "version": version}}


def _v1_requirement(chain: str, atomic: int, resource_url: str, description: str) -> dict:
    req = _v2_requirement(chain, atomic)
    return {"scheme": "exact", "network": chain, "maxAmountRequired": str(atomic), "resource": resource_url,
            "description": description, "mimeType": "application/json", "payTo": req["payTo"],
            "maxTimeoutSeconds": req["maxTimeoutSeconds"], "asset": req["asset"], "extra": req["extra"]}


def requirements(price_cents: int) -> list[dict]:
    """x402 v2 ``accepts``: USDC ``exact`` on every configured network."""
    return [_v2_requirement(c, price_cents * ATOMIC_PER_CENT) for c in networks()]


def _b64json(obj: dict) -> str:
    return base64.b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode()


def payment_required(price_cents: int, resource_url: str, description: str = "Module call",
                     error: str | None = None) -> tuple[dict, dict]:
    """(body fields, headers) of an x402 payment request: the v1 body (``x402Version``,
    ``accepts``) and the v2 ``PAYMENT-REQUIRED`` header. Merge the body fields into the
    SPEC 402 error body and the headers into its headers. Empty when x402 is off."""
    if not enabled():
        return {}, {}
    atomic = price_cents * ATOMIC_PER_CENT
    v1 = [_v1_requirement(c, atomic, resource_url, description) for c in networks()]
    v2 = {"x402Version": 2, "error": error or "Payment required", "accepts": requirements(price_cents),
          "resource": {"url": resource_url, "description": description, "mimeType": "application/json"}}
    return {"x402Version": 1, "accepts": v1}, {"PAYMENT-REQUIRED": _b64json(v2)}


# --- decoding -----------------------------------------------------------------------------

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
    inner = data.get("payload")
    auth = inner.get("authorization") if isinstance(inner, dict) else None
    if data.get("x402Version") not in (1, 2) or not isinstance(auth, dict) \
            or not isinstance(inner.get("signature"), str):
        raise InvalidPayment("The payment header is not an x402 v1/v2 exact EVM payment payload.")
    for key in ("from", "to", "value", "validAfter", "validBefore", "nonce"):
        if not isinstance(auth.get(key), (str, int)) or isinstance(auth.get(key), bool):
            raise InvalidPayment(f"The payment authorization lacks `{key}`.")
    return data


# --- verification ---------------------------------------------------------------------------

def _int(value, name: str) -> int:
    try:
        out = int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        raise InvalidPayment(f"The payment authorization `{name}` is not an integer.") from None
    if out < 0 or out >= 2**256:
        raise InvalidPayment(f"The payment authorization `{name}` is out of range.")
    return out


def _network_of(data: dict) -> tuple[str, str | None, str]:
    """(chain name, asset named by the payload or None, scheme)."""
    if data["x402Version"] == 2:
        acc = data.get("accepted")
        if not isinstance(acc, dict):
            raise InvalidPayment("x402 v2 payload lacks `accepted`.")
        caip = str(acc.get("network", ""))
        chain = next((c for c, v in chains.CAIP2.items() if v == caip), caip)
        return chain, acc.get("asset"), str(acc.get("scheme", ""))
    return str(data.get("network", "")), None, str(data.get("scheme", ""))


def verify(data: dict, price_micros: int) -> dict:
    """Check a decoded payload locally; returns the authorization facts. 402 when refused."""
    if not enabled():
        raise PaymentInvalid("x402_disabled", "x402 payments are not enabled on this deployment (X402_PAY_TO).")
    chain, asset, scheme = _network_of(data)
    if scheme != "exact":
        raise PaymentInvalid("unsupported_scheme", f"Scheme `{scheme}` is not accepted; use `exact`.")
    if chain not in networks():
        raise PaymentInvalid("unsupported_network", f"Network `{chain}` is not accepted; use one of "
                                                    f"{', '.join(networks())}.")
    usdc = to_checksum_address(chains.usdc_contract(chain))
    if asset is not None and (not isinstance(asset, str) or asset.lower() != usdc.lower()):
        raise PaymentInvalid("wrong_asset", f"Only USDC ({usdc}) is accepted on {chain}.")
    auth, signature = data["payload"]["authorization"], data["payload"]["signature"]
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
    name, version = chains.USDC_EIP712[chain]
    typed = {
        "types": {
            "EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                             {"name": "chainId", "type": "uint256"},
                             {"name": "verifyingContract", "type": "address"}],
            "TransferWithAuthorization": [
                {"name": "from", "type": "address"}, {"name": "to", "type": "address"},
                {"name": "value", "type": "uint256"}, {"name": "validAfter", "type": "uint256"},
                {"name": "validBefore", "type": "uint256"}, {"name": "nonce", "type": "bytes32"}],
        },
        "primaryType": "TransferWithAuthorization",
        "domain": {"name": name, "version": version, "chainId": chains.CHAIN_IDS[chain], "verifyingContract": usdc},
        "message": {"from": payer, "to": to, "value": value, "validAfter": valid_after,
                    "validBefore": valid_before, "nonce": bytes.fromhex(nonce[2:])},
    }
    sig = signature[2:] if signature.startswith("0x") else signature
    try:
        sig_bytes = bytes.fromhex(sig)
        if len(sig_bytes) != 65:
            raise ValueError("length")
        recovered = EthAccount.recover_message(encode_typed_data(full_message=typed), signature=sig_bytes)
    except Exception:
        raise PaymentInvalid("invalid_signature", "The authorization signature is malformed.") from None
    if recovered != payer:
        raise PaymentInvalid("invalid_signature", "The authorization was not signed by `from`.")
    return {"chain": chain, "payer": payer, "value": value, "nonce": nonce, "version": data["x402Version"],
            "auth_key": f"{chain}:{payer.lower()}:{nonce}", "data": data}


# --- reservation, settlement, booking ------------------------------------------------------

def _autonomous_ok() -> bool:
    """Whether a second connection may write while the caller's transaction is open
    (PostgreSQL: yes; SQLite serialises writers, so there the caller's transaction is used)."""
    return db.engine.dialect.name != "sqlite"


def _write(stmt, in_transaction: bool) -> int:
    """Execute a write durably: committed on its own (its own connection when the caller
    has a transaction open), or, on SQLite inside a caller's transaction, in that one."""
    if in_transaction and not _autonomous_ok():
        return db.session.execute(stmt.execution_options(synchronize_session=False)).rowcount
    if in_transaction:
        with db.engine.connect() as conn:
            rc = conn.execute(stmt).rowcount
            conn.commit()
            return rc
    rc = db.session.execute(stmt.execution_options(synchronize_session=False)).rowcount
    db.session.commit()
    return rc


def reserve(facts: dict, account_id: str, *, in_transaction: bool = False) -> str:
    """Insert the authorization under its unique key (the one atomic step that makes it
    single-use: a replay, even a concurrent one, hits the unique constraint). Committed
    at once so it holds even if the call's transaction later rolls back. Returns its id."""
    auth_id = new_id("x4a")
    stmt = insert(X402Authorization).values(
        id=auth_id, auth_key=facts["auth_key"], account_id=account_id, network=facts["chain"],
        payer=facts["payer"], value_atomic=facts["value"], status="reserved", created_at=utcnow())
    if in_transaction and not _autonomous_ok() and db.session.execute(
            select(X402Authorization.id).where(X402Authorization.auth_key == facts["auth_key"])).first():
        raise PaymentInvalid("replayed", "This payment authorization was already used.")
    try:
        _write(stmt, in_transaction)
    except IntegrityError:
        if not in_transaction:
            db.session.rollback()
        raise PaymentInvalid("replayed", "This payment authorization was already used.") from None
    return auth_id


def _facilitator(path: str, facts: dict, price_micros: int, resource_url: str) -> dict:
    url = current_app.config["X402_FACILITATOR_URL"].rstrip("/") + path
    data = facts["data"]
    if facts["version"] == 2:
        req = _v2_requirement(facts["chain"], price_micros)
    else:
        req = _v1_requirement(facts["chain"], price_micros, resource_url, "Module call")
    try:
        resp = requests.post(url, json={"x402Version": facts["version"], "paymentPayload": data,
                                        "paymentRequirements": req}, timeout=30)
        body = resp.json()
    except (requests.RequestException, ValueError) as exc:
        log.warning("x402 facilitator %s failed: %s", path, exc)
        return {"_unavailable": True}
    return body if isinstance(body, dict) else {}


def _status(auth_id: str, in_transaction: bool, **values) -> None:
    _write(update(X402Authorization).where(X402Authorization.id == auth_id).values(**values), in_transaction)


def accept(header_value: str, *, account_id: str, price_micros: int, resource_url: str,
           mode: str = "live", in_transaction: bool = False) -> X402Payment:
    """Decode, verify, reserve and (with a facilitator) settle a payment header.

    ``in_transaction``: the caller has a database transaction open (the call's charging
    transaction); nothing here commits it."""
    facts = verify(decode(header_value), price_micros)
    sandbox = is_sandbox(mode)
    if sandbox and current_app.config.get("PRODUCTION") and mode != "test":
        raise PaymentInvalid("settlement_unavailable", "x402 settlement is not configured on this deployment.")
    auth_id = reserve(facts, account_id, in_transaction=in_transaction)
    pay = X402Payment(auth_id=auth_id, auth_key=facts["auth_key"], account_id=account_id,
                      version=facts["version"], network=facts["chain"], payer=facts["payer"],
                      value_atomic=facts["value"], sandbox=sandbox)
    if sandbox:
        return pay
    verified = _facilitator("/verify", facts, price_micros, resource_url)
    if verified.get("isValid") is not True:
        reason = str(verified.get("invalidReason") or ("facilitator_unavailable" if verified.get("_unavailable")
                                                        else "facilitator_rejected"))
        _status(auth_id, in_transaction, status="failed", error=reason[:200])
        raise PaymentInvalid(reason, "The facilitator refused the payment: " + reason)
    settled = _facilitator("/settle", facts, price_micros, resource_url)
    if settled.get("success") is not True:
        reason = str(settled.get("errorReason") or "settlement_failed")
        if settled.get("_unavailable"):  # outcome unknown: keep it reserved for reconciliation
            raise PaymentInvalid("settlement_unavailable", "The facilitator did not answer; the authorization "
                                                           "stays reserved for reconciliation.")
        _status(auth_id, in_transaction, status="failed", error=reason[:200])
        raise PaymentInvalid(reason, "Settlement failed: " + reason)
    pay.transaction = str(settled.get("transaction") or "")
    _status(auth_id, in_transaction, status="settled", transaction=pay.transaction[:100], settled_at=utcnow())
    return pay


def fund_call(header_value: str, *, account_id: str, price_micros: int, call_id: str, mode: str,
              resource_url: str) -> X402Payment:
    """The gateway seam: inside the call's charging transaction, accept the payment and
    credit it (not committed); the caller debits the price next and commits both."""
    pay = accept(header_value, account_id=account_id, price_micros=price_micros, resource_url=resource_url,
                 mode=mode, in_transaction=True)
    book(pay, call_id=call_id)
    return pay


def book(pay: X402Payment, call_id: str | None = None) -> str:
    """Record the payment and credit it to the account (does NOT commit: call it in the same
    transaction as the call's charge). Returns the payment id."""
    if pay.sandbox:
        pay.transaction = pay.transaction or f"sandbox:{pay.auth_id}"
        db.session.execute(update(X402Authorization).where(X402Authorization.id == pay.auth_id)
                           .values(status="settled", transaction=pay.transaction, settled_at=utcnow())
                           .execution_options(synchronize_session=False))
    payment = Payment(id=new_id("pay"), account_id=pay.account_id, method="x402", kind="x402",
                      processor="sandbox" if pay.sandbox else "x402", mode="test" if pay.sandbox else "live",
                      provider_id=f"x402:{pay.auth_key}"[:160], amount_micros=pay.value_atomic, status="succeeded",
                      meta={"network": pay.network, "payer": pay.payer, "transaction": pay.transaction,
                            "call_id": call_id, "authorization": pay.auth_id})
    db.session.add(payment)
    source = ledger.external("sandbox" if pay.sandbox else "x402")
    ledger.post("x402_payment", [(source, -pay.value_atomic), (ledger.customer(pay.account_id), pay.value_atomic)],
                ref=f"x402:{pay.auth_key}", account_id=pay.account_id,
                meta={"payment_id": payment.id, "call_id": call_id, "payer": pay.payer})
    pay.booked = True
    return payment.id


def response_headers(pay: X402Payment) -> dict:
    """``PAYMENT-RESPONSE`` (v2) or ``X-PAYMENT-RESPONSE`` (v1) for the paid response."""
    body = {"success": True, "transaction": pay.transaction or "", "network":
            chains.CAIP2[pay.network] if pay.version == 2 else pay.network, "payer": pay.payer,
            "amount": str(pay.value_atomic)}
    name = "PAYMENT-RESPONSE" if pay.version == 2 else "X-PAYMENT-RESPONSE"
    return {name: _b64json(body), "Access-Control-Expose-Headers": name}


def book_orphans(older_than_seconds: int = 120) -> int:
    """Sweep: settled authorizations never booked (a crash between settlement and the call's
    transaction) are credited to their account, so a settled payment is never lost."""
    from datetime import timedelta

    cutoff = utcnow() - timedelta(seconds=older_than_seconds)
    rows = db.session.execute(select(X402Authorization).where(
        X402Authorization.status == "settled", X402Authorization.settled_at < cutoff)).scalars().all()
    n = 0
    for row in rows:
        if db.session.execute(select(LedgerTransaction.id).where(
                LedgerTransaction.ref == f"x402:{row.auth_key}")).first():
            continue
        pay = X402Payment(auth_id=row.id, auth_key=row.auth_key, account_id=row.account_id, version=2,
                          network=row.network, payer=row.payer, value_atomic=int(row.value_atomic),
                          sandbox=(row.transaction or "").startswith("sandbox:"), transaction=row.transaction)
        try:
            book(pay)
            db.session.commit()
            n += 1
        except IntegrityError:
            db.session.rollback()
    return n

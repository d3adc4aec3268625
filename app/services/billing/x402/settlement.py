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

import logging
from dataclasses import dataclass, field

from flask import current_app
from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from app.extensions import db
from app.ids import new_id
from app.models import LedgerTransaction, Payment, X402Authorization
from app.models.base import utcnow
from app.services.billing.x402.payload import PaymentInvalid, autonomous_ok, decode, verify
from app.services.billing.x402.requirements import b64json, is_sandbox, v1_requirement, v2_requirement
from app.services.billing import chains, ledger
from app.services.platform import http

log = logging.getLogger(__name__)







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









# --- payment requests (402) -----------------------------------------------------------











# --- decoding -----------------------------------------------------------------------------





# --- verification ---------------------------------------------------------------------------







# --- reservation, settlement, booking ------------------------------------------------------



def _write(stmt, in_transaction: bool) -> int:
    """Execute a write durably: committed on its own (its own connection when the caller
    has a transaction open), or, on SQLite inside a caller's transaction, in that one."""
    if in_transaction and not autonomous_ok():
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
    if in_transaction and not autonomous_ok() and db.session.execute(
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
        req = v2_requirement(facts["chain"], price_micros)
    else:
        req = v1_requirement(facts["chain"], price_micros, resource_url, "Module call")
    try:
        resp = http.call("POST", url, purpose="x402", timeout=30,
                         json={"x402Version": facts["version"], "paymentPayload": data,
                               "paymentRequirements": req})
        body = resp.json()
    except (*http.ERRORS, ValueError) as exc:
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
    return {name: b64json(body), "Access-Control-Expose-Headers": name}


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

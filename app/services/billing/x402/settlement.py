"""x402 pay-per-call: payment requests, ``X-Payment`` / ``PAYMENT-SIGNATURE`` verification
(EIP-3009 ``TransferWithAuthorization``, checked with the ``x402`` package), single-use
reservation, settlement (facilitator ``/verify`` + ``/settle``; for test-mode payments only,
local sandbox settlement) and the ledger credit (DESIGN §8): a live payment credits the live
balance and needs a facilitator; a sandbox one credits the test balance (``acct_test:``).

Three steps, never a network call inside a transaction (``app/services/gateway/calls.py``
``open_call``, ``app/services/chat/completions.py`` ``_fund_hold``)::

    pay, facts = x402.verify_and_reserve(header, ...)  # 1. verify (no db), reserve: own unit of work
    x402.settle(pay, facts, ...)                       # 2. facilitator over HTTP, no transaction open
    with unit_of_work():                               # 3. book: the credit to the payer's balance
        x402.book(pay, call_id=...)
    # then the call or the chat hold is charged on the balance, the way every one is

(``accept`` = steps 1 and 2.) Step 2's outcome is recorded on the
authorization (``settled``/``failed``, or left ``reserved`` when the facilitator did not
answer); a settled authorization whose step 3 never committed is booked as account credit
by ``book_orphans``; a ``reserved`` one awaits the reconciliation job of that issue.
``accept`` raises 400 ``invalid_payment`` (undecodable) or 402 ``payment_invalid`` (with
``reason``). Once an authorization is reserved it can never be used again, unless the
facilitator gave no ``/verify`` verdict (nothing was sent to settle: the reservation is
released and the same authorization may be presented again); once it is
settled the money is always booked, at worst as account credit (``book_orphans`` sweep).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from flask import current_app
from pydantic import ValidationError
from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from x402.http.utils import encode_payment_response_header
from x402.schemas import SettleResponse, VerifyResponse

from app.extensions import db
from app.ids import new_id
from app.models import Payment, X402Authorization
from app.models.base import utcnow
from app.services.billing.x402.payload import (FacilitatorUnavailable, PaymentInvalid, SettlementUnavailable,
                                               decode, verify)
from app.services.billing.x402.requirements import (enabled, is_sandbox, offered, payment_required, v1_requirement,
                                                    v2_requirement, wire)
from app.services.billing import chains
from app.services.money import funding, outside
from app.services.money import ledger
from app.services.platform import http
from app.services.platform.uow import in_unit_of_work, transactional, unit_of_work

log = logging.getLogger(__name__)

# How often the ``x402-reconcile`` job runs (app/tasks/schedule.py), and how long a client
# waits before sending again a payment the facilitator gave no verdict on at /verify: the
# ``Retry-After`` of 503 ``settlement_unavailable`` and ``facilitator_unavailable``.
RECONCILE_EVERY_SECONDS = 60
VERIFY_RETRY_AFTER_SECONDS = 5



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


# --- reservation, settlement, booking ------------------------------------------------------



def reserve(facts: dict, account_id: str, *, price_micros: int, sandbox: bool = False,
            resource_url: str | None = None, description: str | None = None) -> str:
    """Step 1b (own unit of work): insert the authorization under its unique key (the one
    atomic step that makes it single-use: a replay, even a concurrent one, hits the unique
    constraint). Committed at once, so it holds whatever happens to the call. A sandbox
    (test-mode) reservation keeps no payload: nothing may ever submit it to a facilitator
    (reconciliation releases it). ``resource_url``, ``description`` and ``price_micros``: the
    requirement the payment was presented for (resource, price), which reconciliation sends again —
    the same request, so an idempotent facilitator answers the same settlement. Returns
    its id."""
    auth_id = new_id("x4a")
    try:
        with unit_of_work():
            db.session.execute(insert(X402Authorization).values(
                id=auth_id, auth_key=facts["auth_key"], account_id=account_id, network=facts["chain"],
                payer=facts["payer"], value_atomic=facts["value"], status="reserved", created_at=utcnow(),
                payload=None if sandbox else facts["data"],
                price_micros=price_micros,
                valid_before=facts.get("valid_before"), resource_url=resource_url, description=description))
    except IntegrityError:
        with unit_of_work():
            pending = db.session.execute(select(X402Authorization.created_at).where(
                X402Authorization.auth_key == facts["auth_key"],
                X402Authorization.status == "reserved")).scalar()
        if pending is not None:  # its settlement is not known yet: no fresh payment request
            raise _settlement_unknown("This payment is still being settled, or the facilitator gave no "
                                      "settlement verdict on it yet", pending) from None
        raise PaymentInvalid("replayed", "This payment authorization was already used.") from None
    return auth_id


def _settlement_unknown(what: str, reserved_at=None) -> SettlementUnavailable:
    """503 ``settlement_unavailable`` for an authorization left ``reserved``: ``Retry-After``
    is when reconciliation will have resolved it (from ``reserved_at``, else from now)."""
    wait = int(current_app.config["X402_RECONCILE_AFTER_SECONDS"]) + RECONCILE_EVERY_SECONDS
    if reserved_at is not None:
        wait = max(VERIFY_RETRY_AFTER_SECONDS, wait - int((utcnow() - reserved_at).total_seconds()))
    return SettlementUnavailable(
        f"{what}; nothing was charged and the authorization stays reserved: if it settled, it is credited to "
        f"your balance within {-(-wait // 60)} minutes. Do not pay again: retry the call then.", wait)


def _facilitator(path: str, facts: dict, price_micros: int, resource_url: str,
                 description: str = "Module call"):
    """POST ``/verify`` or ``/settle`` to the facilitator through ``platform.http`` (SSRF
    policy, timeout); the answer as the ``x402`` package's ``VerifyResponse`` /
    ``SettleResponse``, or None when it gave no verdict: no answer, a server error (5xx),
    or a ``/settle`` answer that is no ``SettleResponse`` — the transfer may have been
    submitted, so the authorization must stay ``reserved`` for reconciliation. A malformed
    ``/verify`` answer is a refusal (nothing moves at verify). The requirement sent is the
    one the 402 offered for ``resource_url`` (v1: its ``description`` too)."""
    url = current_app.config["X402_FACILITATOR_URL"].rstrip("/") + path
    if facts["version"] == 2:
        req = v2_requirement(facts["chain"], price_micros)
    else:
        req = v1_requirement(facts["chain"], price_micros, resource_url, description)
    try:
        resp = http.call("POST", url, purpose="x402",
                         timeout=float(current_app.config["X402_FACILITATOR_TIMEOUT_SECONDS"]),
                         json={"x402Version": facts["version"], "paymentPayload": facts["data"],
                               "paymentRequirements": wire(req)})
        body = resp.json()
    except (*http.ERRORS, ValueError) as exc:
        log.warning("x402 facilitator %s failed: %s", path, exc)
        return None
    if resp.status_code >= 500:
        log.warning("x402 facilitator %s answered %s: no verdict", path, resp.status_code)
        return None
    body = body if isinstance(body, dict) else {}
    try:
        if path == "/verify":
            return VerifyResponse.model_validate(body)
        return SettleResponse.model_validate({"transaction": "", "network": req.network, **body})
    except ValidationError:
        if path == "/verify":
            return VerifyResponse(is_valid=False, invalid_reason="facilitator_rejected")
        log.warning("x402 facilitator /settle answered no SettleResponse (HTTP %s): no verdict", resp.status_code)
        return None


@transactional
def _status(auth_id: str, **values) -> None:
    db.session.execute(update(X402Authorization).where(X402Authorization.id == auth_id).values(**values)
                       .execution_options(synchronize_session=False))


@transactional
def _release(auth_id: str) -> None:
    """Undo ``reserve`` for an authorization nothing was done with (the facilitator gave no
    ``/verify`` verdict, and ``/settle`` was never sent): the row goes, so the same
    authorization can be presented again. Only a ``reserved`` row: one a concurrent step
    moved on stays."""
    db.session.execute(delete(X402Authorization).where(X402Authorization.id == auth_id,
                                                       X402Authorization.status == "reserved")
                       .execution_options(synchronize_session=False))


def verify_and_reserve(header_value: str, *, account_id: str, price_micros: int, mode: str = "live",
                       resource_url: str | None = None,
                       description: str = "Module call") -> tuple[X402Payment, dict]:
    """Step 1: decode and verify the header (no database), then ``reserve`` it in its own
    unit of work. Returns the reserved payment and the verified facts ``settle`` needs.
    Live payments need a facilitator: without one (x402 is then not offered) a live
    payment is 402 ``payment_invalid`` (``facilitator_required``); test-mode payments are
    sandbox payments, settled locally as play money."""
    data = decode(header_value)
    sandbox = is_sandbox(mode)
    if not sandbox and enabled() and not offered():
        raise PaymentInvalid("facilitator_required", "x402 payments are not offered on this deployment: live "
                                                     "payments settle through a facilitator (X402_FACILITATOR_URL) "
                                                     "and none is configured; add credits with POST /api/wallet/fund.")
    facts = verify(data, price_micros)
    auth_id = reserve(facts, account_id, sandbox=sandbox, resource_url=resource_url, price_micros=price_micros,
                      description=description)
    return X402Payment(auth_id=auth_id, auth_key=facts["auth_key"], account_id=account_id,
                       version=facts["version"], network=facts["chain"], payer=facts["payer"],
                       value_atomic=facts["value"], sandbox=sandbox), facts


def settle(pay: X402Payment, facts: dict, *, price_micros: int, resource_url: str,
           description: str = "Module call") -> X402Payment:
    """Step 2 (network; must run with no unit of work open): facilitator ``/verify`` and
    ``/settle`` (nothing in sandbox mode). The outcome is recorded on the authorization in
    a short unit of work of its own after each answer."""
    if in_unit_of_work():
        raise RuntimeError("x402 settle() calls the facilitator: run it outside any unit of work")
    if pay.sandbox:
        return pay
    verified = _facilitator("/verify", facts, price_micros, resource_url, description)
    if verified is None:  # nothing moves at /verify: the authorization may be sent again
        _release(pay.auth_id)
        raise FacilitatorUnavailable("The payment facilitator did not answer; nothing was charged. Retry later: "
                                     "the same payment may be sent again.", VERIFY_RETRY_AFTER_SECONDS)
    if not verified.is_valid:
        reason = verified.invalid_reason or "facilitator_rejected"
        _status(pay.auth_id, status="failed", error=reason[:200])
        raise PaymentInvalid(reason, "The facilitator refused the payment: " + reason)
    settled = _facilitator("/settle", facts, price_micros, resource_url, description)
    if settled is None:  # outcome unknown: keep it reserved for reconciliation
        raise _settlement_unknown("The facilitator gave no settlement verdict (no answer or a server error)")
    if not settled.success:
        reason = settled.error_reason or "settlement_failed"
        _status(pay.auth_id, status="failed", error=reason[:200])
        raise PaymentInvalid(reason, "Settlement failed: " + reason, headers=response_headers(pay, reason))
    pay.transaction = settled.transaction.lower()
    _status(pay.auth_id, status="settled", transaction=pay.transaction[:100], settled_at=utcnow())
    return pay


def accept(header_value: str, *, account_id: str, price_micros: int, resource_url: str,
           mode: str = "live", description: str = "Module call",
           extensions: dict | None = None) -> X402Payment:
    """Steps 1 and 2: verify and reserve (own unit of work), then settle (no transaction
    open). The caller books it (step 3) in its own unit of work. A refusal (402
    ``payment_invalid``, with ``reason``) carries a fresh payment request for the same
    resource and price (``PAYMENT-REQUIRED``; ``description`` and ``extensions`` as in the
    402 that asked for it), so the client can pay again."""
    try:
        pay, facts = verify_and_reserve(header_value, account_id=account_id, price_micros=price_micros,
                                        mode=mode, resource_url=resource_url, description=description)
        return settle(pay, facts, price_micros=price_micros, resource_url=resource_url, description=description)
    except PaymentInvalid as exc:
        cents = -(-int(price_micros) // ledger.MICROS_PER_CENT)
        v1_body, headers = payment_required(cents, resource_url, description, error=exc.message,
                                            extensions=extensions)
        exc.headers.update(headers)
        exc.extra.setdefault("price_cents", cents)  # what to pay, as the 402 that asked said
        for field, value in v1_body.items():  # x402 v1 clients read the new request from the body
            exc.extra.setdefault(field, value)
        raise


def book(pay: X402Payment, call_id: str | None = None) -> str:
    """Step 3: record the payment and credit it to the account, in the caller's unit of work
    (the one that also writes the call's charge). Returns the payment id."""
    if pay.sandbox:
        pay.transaction = pay.transaction or f"sandbox:{pay.auth_id}"
        db.session.execute(update(X402Authorization).where(X402Authorization.id == pay.auth_id)
                           .values(status="settled", transaction=pay.transaction, settled_at=utcnow())
                           .execution_options(synchronize_session=False))
    mode = "test" if pay.sandbox else "live"  # sandbox settlement only ever credits test money
    payment = Payment(id=new_id("pay"), account_id=pay.account_id, method="x402", kind="x402",
                      processor="sandbox" if pay.sandbox else "x402", mode=mode,
                      provider_id=f"x402:{pay.auth_key}"[:160], amount_micros=pay.value_atomic, status="succeeded",
                      meta={"network": pay.network, "payer": pay.payer, "transaction": pay.transaction,
                            "call_id": call_id, "authorization": pay.auth_id})
    db.session.add(payment)
    funding.credit("x402_payment", source=ledger.external("sandbox" if pay.sandbox else "x402"),
                   account_id=pay.account_id, mode=mode, micros=pay.value_atomic, ref=f"x402:{pay.auth_key}",
                   outside_ref=outside.x402_ref(pay.auth_key), rail="x402", payment_id=payment.id,
                   meta={"payment_id": payment.id, "call_id": call_id, "payer": pay.payer},
                   outside_meta={"network": pay.network, "transaction": pay.transaction})
    pay.booked = True
    return payment.id


def response_headers(pay: X402Payment, failure: str | None = None) -> dict:
    """``PAYMENT-RESPONSE`` (v2) or ``X-PAYMENT-RESPONSE`` (v1) for the paid response, or,
    with ``failure`` (the facilitator's ``errorReason``), for the 402 of a settlement the
    facilitator refused: ``success: false``, that ``errorReason``, no transaction, as x402
    v2's HTTP transport answers a failed settlement."""
    settled = SettleResponse(success=failure is None, error_reason=failure, transaction=pay.transaction or "",
                             payer=pay.payer, network=chains.CAIP2[pay.network] if pay.version == 2 else pay.network,
                             amount=None if failure else str(pay.value_atomic))
    name = "PAYMENT-RESPONSE" if pay.version == 2 else "X-PAYMENT-RESPONSE"
    return {name: encode_payment_response_header(settled), "Access-Control-Expose-Headers": name}

"""Payments: checkout, saved payment method, off-session card/ACH funding, payment
history, the processor webhook and the sandbox processor's hosted flow.

Money rule: a payment credits the account only when the processor confirms it (a
verified webhook, or the synchronous success of an off-session card charge), through
``ledger.post(ref="pay:<payment id>")`` together with a conditional status change
``pending → succeeded`` in one database transaction. So however many events report the
same payment (``checkout.session.completed``, ``payment_intent.succeeded``, replays),
it is credited exactly once. Every verified event is stored under its unique event id in
the same transaction as its effect: a replay changes nothing, a crash changes nothing.
"""
from __future__ import annotations

import json
import logging
from datetime import timedelta

import stripe
from flask import current_app
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from app.errors import DomainError, InvalidRequest, NotFound
from app.extensions import db
from app.ids import new_id, random_b62
from app.models import Account, BillingProfile, Payment, PaymentEvent
from app.models.base import utcnow
from app.services.billing import ledger
from app.services.billing.processors import (SANDBOX_METHODS, CardDeclined, MethodInfo, for_mode,
                                     json_payload, sandbox_webhook_secret, sign_payload)

log = logging.getLogger(__name__)

WEBHOOK_TOLERANCE_SECONDS = 300
HISTORY_LIMIT = 50


class WebhookSignatureInvalid(DomainError):
    status, code, message = 400, "webhook_signature_invalid", "Invalid webhook signature."


class NoPaymentMethod(DomainError):
    status, code, message = 400, "no_payment_method", "No saved payment method."


# --- views -------------------------------------------------------------------------

def payment_view(p: Payment) -> dict:
    return {
        "id": p.id, "method": p.method, "kind": p.kind, "processor": p.processor, "mode": p.mode,
        "amount_cents": ledger.micros_to_cents(p.amount_micros),
        "amount_micros": p.amount_micros,
        "refunded_cents": ledger.micros_to_cents(p.refunded_micros or 0),
        "status": p.status, "product": p.product,
        "failure_code": p.failure_code, "failure_message": p.failure_message,
        "created_at": p.created_at,
    }


def history(account_id: str) -> list[dict]:
    """The account's last 50 payments (card, ACH, USDC, x402), newest first."""
    rows = db.session.execute(
        select(Payment).where(Payment.account_id == account_id)
        .order_by(Payment.created_at.desc(), Payment.id.desc()).limit(HISTORY_LIMIT)
    ).scalars().all()
    return [payment_view(p) for p in rows]


def get_payment(account_id: str, payment_id: str) -> Payment:
    p = db.session.get(Payment, payment_id)
    if p is None or p.account_id != account_id:
        raise NotFound("No such payment.")
    return p


# --- ledger effects (never commit) ---------------------------------------------------

def ledger_source(payment: Payment) -> str:
    """External ledger source: real card/ACH money vs. sandbox play money."""
    if payment.processor == "sandbox":
        return ledger.external("sandbox")
    return ledger.external({"card": "card", "ach": "ach", "usdc": "usdc", "x402": "x402"}[payment.method])


def credit_payment(payment: Payment, ref: str | None = None, **values) -> bool:
    """``pending → succeeded`` and the credit, once. Returns False when already final."""
    res = db.session.execute(
        update(Payment).where(Payment.id == payment.id, Payment.status == "pending")
        .values(status="succeeded", updated_at=utcnow(), **values)
        .execution_options(synchronize_session=False))
    if res.rowcount != 1:
        return False
    micros = int(payment.amount_micros)
    ledger.post("payment", [(ledger_source(payment), -micros), (ledger.customer(payment.account_id), micros)],
                ref=ref or f"pay:{payment.id}", account_id=payment.account_id,
                meta={"payment_id": payment.id, "method": payment.method, "processor": payment.processor})
    return True


def _finish(payment: Payment, status: str, code: str | None = None, message: str | None = None,
            **values) -> bool:
    res = db.session.execute(
        update(Payment).where(Payment.id == payment.id, Payment.status == "pending")
        .values(status=status, failure_code=code, failure_message=(message or None) and message[:300],
                updated_at=utcnow(), **values)
        .execution_options(synchronize_session=False))
    return res.rowcount == 1


def _refund(payment: Payment, refunded_total_micros: int, charge_id: str) -> str:
    """Debit what the processor refunded beyond what we already reversed. Credit already
    spent cannot be taken back: that part is booked against ``adjust:refund_shortfall``."""
    db.session.refresh(payment)
    if payment.status not in ("succeeded", "partially_refunded", "refunded"):
        return "ignored_not_succeeded"
    refunded_total_micros = min(refunded_total_micros, payment.amount_micros)
    delta = refunded_total_micros - int(payment.refunded_micros or 0)
    if delta <= 0:
        return "already_refunded"
    res = db.session.execute(
        update(Payment).where(Payment.id == payment.id,
                              Payment.refunded_micros == int(payment.refunded_micros or 0))
        .values(refunded_micros=refunded_total_micros, updated_at=utcnow(),
                status="refunded" if refunded_total_micros >= payment.amount_micros else "partially_refunded")
        .execution_options(synchronize_session=False))
    if res.rowcount != 1:
        return "concurrent_refund"
    balance = int(db.session.execute(
        select(Account.balance_micros).where(Account.id == payment.account_id)).scalar_one())
    recovered = min(balance, delta)
    legs = [(ledger.customer(payment.account_id), -recovered), (ledger_source(payment), delta)]
    if delta - recovered:
        legs.append(("adjust:refund_shortfall", -(delta - recovered)))
    ledger.post("refund", legs, ref=f"refund:{payment.id}:{refunded_total_micros}",
                account_id=payment.account_id,
                meta={"payment_id": payment.id, "charge": charge_id, "unrecovered_micros": delta - recovered})
    return "refunded"


# --- profile / method --------------------------------------------------------------

def _profile(account_id: str, processor: str) -> BillingProfile | None:
    return db.session.execute(
        select(BillingProfile).where(BillingProfile.account_id == account_id,
                                     BillingProfile.processor == processor)).scalar_one_or_none()


def method_view(profile: BillingProfile | None) -> dict:
    if profile is None or not profile.payment_method_id:
        return {"payment_method_id": None, "type": None, "brand": None, "last4": None, "processor": None}
    return {"payment_method_id": profile.payment_method_id, "type": profile.payment_method_type,
            "brand": profile.brand, "last4": profile.last4, "processor": profile.processor}


def set_default_method(account_id: str, mode: str, pm_id: str) -> dict:
    """Validate ``pm_id`` with the processor, attach it to the account's customer and make
    it the default used by ``/api/wallet/fund`` (card or ACH)."""
    proc = for_mode(mode)
    pm_id = (pm_id or "").strip()
    if not pm_id or len(pm_id) > 120:
        raise InvalidRequest("payment_method_id: must be a processor payment method id.")
    info = proc.retrieve_method(pm_id)
    acct = db.session.get(Account, account_id)
    profile = _profile(account_id, proc.name)
    customer_id = proc.ensure_customer(account_id, acct.email if acct else None,
                                       profile.customer_id if profile else None)
    proc.attach_default(customer_id, pm_id)
    if profile is None:
        profile = BillingProfile(account_id=account_id, processor=proc.name)
        db.session.add(profile)
    profile.customer_id = customer_id
    profile.payment_method_id, profile.payment_method_type = info.id, info.type
    profile.brand, profile.last4 = info.brand, info.last4
    try:
        db.session.commit()
    except IntegrityError:  # a concurrent first save: retry as an update
        db.session.rollback()
        return set_default_method(account_id, mode, pm_id)
    return method_view(profile)


# --- checkout ------------------------------------------------------------------------

def create_checkout(account_id: str, mode: str, amount_cents: int, product: str | None = None,
                    return_url: str | None = None) -> dict:
    """Start a hosted checkout; credit arrives only with the processor's confirmation."""
    cfg = current_app.config
    proc = for_mode(mode)
    payment = Payment(id=new_id("pay"), account_id=account_id, method="card", kind="checkout",
                      processor=proc.name, mode=mode, amount_micros=ledger.cents_to_micros(amount_cents),
                      product=product, return_url=return_url, status="pending",
                      expires_at=utcnow() + timedelta(hours=24))
    db.session.add(payment)
    db.session.commit()  # recorded before the processor is called (crash leaves a pending row)
    profile = _profile(account_id, proc.name)
    done = return_url or cfg["BASE_URL"]
    sep = "&" if "?" in done else "?"
    session_id, url = proc.create_checkout(
        payment, profile.customer_id if profile else None,
        success_url=f"{done}{sep}checkout=success&payment_id={payment.id}",
        cancel_url=f"{done}{sep}checkout=cancel&payment_id={payment.id}")
    payment.provider_id = session_id
    db.session.commit()
    return {"url": url, "payment_id": payment.id, "status": payment.status,
            "expires_at": payment.expires_at}


# --- off-session funding (card, ACH) ----------------------------------------------------

def fund_with_saved_method(account_id: str, mode: str, amount_cents: int, method: str) -> dict:
    """``card``: charge the saved card off-session, credit at once on success, 402
    ``card_declined`` on decline. ``ach``: start a bank debit; credits when it settles."""
    proc = for_mode(mode)
    profile = _profile(account_id, proc.name)
    wanted = "card" if method == "card" else "us_bank_account"
    if profile is None or not profile.payment_method_id:
        raise NoPaymentMethod("No saved payment method: save one with POST /api/pay/method first.")
    if profile.payment_method_type != wanted:
        raise NoPaymentMethod(f"The saved default payment method is a {profile.payment_method_type}, "
                              f"not a {wanted}; save a {wanted} method or use method "
                              f"{'ach' if wanted == 'card' else 'card'}.")
    payment = Payment(id=new_id("pay"), account_id=account_id, method=method, kind="charge",
                      processor=proc.name, mode=mode, amount_micros=ledger.cents_to_micros(amount_cents),
                      status="pending", meta={"payment_method": profile.payment_method_id})
    db.session.add(payment)
    customer_id = profile.customer_id
    pm = MethodInfo(profile.payment_method_id, profile.payment_method_type, profile.brand, profile.last4)
    db.session.commit()  # a crash after this leaves a pending payment the webhook completes
    result = proc.charge(payment, customer_id, pm)
    try:
        payment.provider_id = result.provider_id
        payment.payment_intent = result.provider_id
        db.session.flush()
    except IntegrityError:  # the webhook already recorded this intent under the payment
        db.session.rollback()
        payment = db.session.get(Payment, payment.id)
    if result.status == "succeeded":
        credit_payment(payment)
        db.session.commit()
    elif result.status == "failed":
        _finish(payment, "failed", result.failure_code, result.failure_message)
        db.session.commit()
        raise CardDeclined(result.failure_message or "The card was declined.",
                           extra={"decline_code": result.failure_code, "payment_id": payment.id})
    else:
        db.session.commit()
    db.session.refresh(payment)
    return fund_view(payment)


def fund_view(payment: Payment, deposit: dict | None = None) -> dict:
    balance = db.session.execute(
        select(Account.balance_micros).where(Account.id == payment.account_id)).scalar_one()
    return {"payment_id": payment.id, "method": payment.method, "status": payment.status,
            "amount_cents": ledger.micros_to_cents(payment.amount_micros),
            "balance_cents": ledger.micros_to_cents(balance), "deposit": deposit}


# --- webhook -------------------------------------------------------------------------

def _verify(payload: bytes, sig_header: str | None) -> tuple[dict, str]:
    """The verified event and which processor's secret signed it."""
    if not sig_header:
        raise WebhookSignatureInvalid("Missing Stripe-Signature header.")
    cfg = current_app.config
    secrets = []
    if cfg.get("STRIPE_WEBHOOK_SECRET"):
        secrets.append(("stripe", cfg["STRIPE_WEBHOOK_SECRET"]))
    if cfg.get("PAYMENTS_SANDBOX_ENABLED", True):
        secrets.append(("sandbox", sandbox_webhook_secret()))
    for processor, secret in secrets:
        try:
            stripe.Webhook.construct_event(payload, sig_header, secret, tolerance=WEBHOOK_TOLERANCE_SECONDS)
        except stripe.SignatureVerificationError:
            continue
        except ValueError:
            raise InvalidRequest("The webhook body is not a JSON event.") from None
        try:
            event = json.loads(payload)
        except ValueError:
            raise InvalidRequest("The webhook body is not a JSON event.") from None
        if not isinstance(event, dict) or not isinstance(event.get("id"), str) \
                or not isinstance(event.get("type"), str) \
                or not isinstance((event.get("data") or {}).get("object"), dict):
            raise InvalidRequest("The webhook body is not a Stripe event.")
        return event, processor
    raise WebhookSignatureInvalid("The Stripe-Signature does not verify or its timestamp is "
                                  f"outside the {WEBHOOK_TOLERANCE_SECONDS} s tolerance.")


def handle_webhook(payload: bytes, sig_header: str | None) -> dict:
    """Verify, store and apply one processor event (POST /api/pay/webhook)."""
    event, processor = _verify(payload, sig_header)
    return apply_event(event, processor)


def _find(processor: str, **where) -> Payment | None:
    stmt = select(Payment).where(Payment.processor == processor)
    for col, value in where.items():
        if not value:
            return None
        stmt = stmt.where(getattr(Payment, col) == value)
    return db.session.execute(stmt.limit(1)).scalar_one_or_none()


def _by_metadata(obj: dict, processor: str, kind: str) -> Payment | None:
    pid = (obj.get("metadata") or {}).get("payment_id")
    cand = db.session.get(Payment, pid) if isinstance(pid, str) else None
    if cand is not None and cand.processor == processor and cand.kind == kind and cand.provider_id is None:
        return cand
    return None


def _dispatch(event: dict, processor: str) -> tuple[str, str | None]:
    etype, obj = event["type"], event["data"]["object"]
    if etype.startswith("checkout.session."):
        p = _find(processor, provider_id=obj.get("id"))
        if p is None:  # the event beat the recording of the session id: the metadata names it
            p = _by_metadata(obj, processor, "checkout")
            if p is not None:
                p.provider_id = obj.get("id")
        if p is None or p.kind != "checkout":
            return "unknown_payment", None
        pi = obj.get("payment_intent") if isinstance(obj.get("payment_intent"), str) else None
        if pi and not p.payment_intent:
            p.payment_intent = pi
        paid = etype == "checkout.session.async_payment_succeeded" or (
            etype == "checkout.session.completed" and obj.get("payment_status") in ("paid", "no_payment_required"))
        if paid:
            if obj.get("currency", "usd") != "usd" or int(obj.get("amount_total") or 0) * 10_000 != p.amount_micros:
                log.error("checkout %s amount/currency mismatch: %s %s", p.id, obj.get("amount_total"),
                          obj.get("currency"))
                return "amount_mismatch", p.id
            return ("credited" if credit_payment(p) else "already_final"), p.id
        if etype == "checkout.session.completed":
            return "awaiting_settlement", p.id
        if etype == "checkout.session.async_payment_failed":
            return ("failed" if _finish(p, "failed", "payment_failed", "The bank payment failed.") else "already_final"), p.id
        if etype == "checkout.session.expired":
            return ("expired" if _finish(p, "expired") else "already_final"), p.id
        return "ignored", p.id
    if etype.startswith("payment_intent."):
        p = _find(processor, provider_id=obj.get("id"))
        if p is None:  # a crash before we stored the intent id: the metadata names the payment
            p = _by_metadata(obj, processor, "charge")
            if p is not None:
                p.provider_id = p.payment_intent = obj.get("id")
        if p is None:
            return "unknown_payment", None
        if p.kind != "charge":
            return "ignored", p.id  # a checkout's intent: the checkout.session events count
        if etype == "payment_intent.succeeded":
            if int(obj.get("amount_received") or obj.get("amount") or 0) * 10_000 != p.amount_micros:
                return "amount_mismatch", p.id
            return ("credited" if credit_payment(p) else "already_final"), p.id
        if etype == "payment_intent.payment_failed":
            err = obj.get("last_payment_error") or {}
            ok = _finish(p, "failed", err.get("code") or "payment_failed", err.get("message") or "The payment failed.")
            return ("failed" if ok else "already_final"), p.id
        if etype == "payment_intent.canceled":
            return ("canceled" if _finish(p, "canceled") else "already_final"), p.id
        return "ignored", p.id
    if etype == "charge.refunded":
        pi = obj.get("payment_intent")
        p = _find(processor, payment_intent=pi if isinstance(pi, str) else None)
        if p is None:
            return "unknown_payment", None
        return _refund(p, int(obj.get("amount_refunded") or 0) * 10_000, str(obj.get("id"))), p.id
    return "ignored", None


def apply_event(event: dict, processor: str) -> dict:
    """Store the event under its unique id and apply it, in ONE transaction."""
    row = PaymentEvent(processor=processor, event_id=event["id"][:120], type=event["type"][:80],
                       outcome="received", payload=event)
    db.session.add(row)
    try:
        db.session.flush()
    except IntegrityError:
        db.session.rollback()
        return {"received": True, "duplicate": True, "event_id": event["id"], "outcome": "duplicate"}
    try:
        outcome, payment_id = _dispatch(event, processor)
        row.outcome, row.payment_id = outcome, payment_id
        db.session.commit()
    except Exception:
        db.session.rollback()
        raise
    log.info("payment event %s %s -> %s", event["id"], event["type"], outcome)
    return {"received": True, "duplicate": False, "event_id": event["id"], "outcome": outcome}


# --- sandbox processor: hosted checkout and settlement ------------------------------------

def _sandbox_event(etype: str, obj: dict) -> dict:
    return {"id": "evt_sbx_" + random_b62(24), "object": "event", "type": etype, "livemode": False,
            "created": int(utcnow().timestamp()), "api_version": "sandbox", "data": {"object": obj}}


def sandbox_deliver(etype: str, obj: dict) -> dict:
    """Sign a sandbox event and hand it to the webhook code (same path as HTTP)."""
    payload = json_payload(_sandbox_event(etype, obj))
    return handle_webhook(payload, sign_payload(payload, sandbox_webhook_secret()))


def _sandbox_session(session_id: str) -> Payment:
    p = db.session.execute(select(Payment).where(
        Payment.provider_id == session_id, Payment.processor == "sandbox",
        Payment.kind == "checkout")).scalar_one_or_none()
    if p is None:
        raise NotFound("No such sandbox checkout session.")
    return p


def _session_object(p: Payment, payment_status: str, pi: str | None) -> dict:
    return {"id": p.provider_id, "object": "checkout.session", "amount_total": p.amount_micros // 10_000,
            "currency": "usd", "payment_status": payment_status, "status": "complete",
            "client_reference_id": p.account_id, "payment_intent": pi,
            "metadata": {"payment_id": p.id, "account_id": p.account_id}}


def sandbox_checkout_page(session_id: str) -> dict:
    p = _sandbox_session(session_id)
    return {"payment": payment_view(p), "session_id": session_id, "return_url": p.return_url,
            "methods": SANDBOX_METHODS, "awaiting_settlement": bool((p.meta or {}).get("ach_submitted"))}


def sandbox_checkout_action(session_id: str, action: str, pm_id: str | None) -> dict:
    """Pay or cancel a sandbox checkout. Returns ``{result, message, payment}``."""
    p = _sandbox_session(session_id)
    if p.status != "pending" or (p.meta or {}).get("ach_submitted"):
        return {"result": "closed", "message": f"This checkout is already {p.status}.", "payment": payment_view(p)}
    if p.expires_at and p.expires_at < utcnow():
        sandbox_deliver("checkout.session.expired", _session_object(p, "unpaid", None))
        db.session.refresh(p)
        return {"result": "expired", "message": "This checkout has expired.", "payment": payment_view(p)}
    if action == "cancel":
        sandbox_deliver("checkout.session.expired", _session_object(p, "unpaid", None))
        db.session.refresh(p)
        return {"result": "canceled", "message": "Checkout canceled; nothing was charged.", "payment": payment_view(p)}
    spec = SANDBOX_METHODS.get(pm_id or "")
    if spec is None:
        raise InvalidRequest(f"payment_method: one of {', '.join(SANDBOX_METHODS)}.")
    outcome = spec[3]
    if outcome in ("generic_decline", "insufficient_funds"):
        from app.services.billing.processors import DECLINE_MESSAGES

        return {"result": "declined", "message": DECLINE_MESSAGES[outcome], "payment": payment_view(p)}
    pi = "pi_sbx_" + random_b62(24)
    if outcome == "settles_later":
        p.meta = {**(p.meta or {}), "ach_submitted": True}
        db.session.commit()
        sandbox_deliver("checkout.session.completed", _session_object(p, "unpaid", pi))
        db.session.refresh(p)
        return {"result": "processing", "payment": payment_view(p),
                "message": "Bank payment submitted; credits arrive when it settles "
                           "(sandbox: flask payments sandbox-settle " + p.id + ")."}
    sandbox_deliver("checkout.session.completed", _session_object(p, "paid", pi))
    db.session.refresh(p)
    return {"result": "paid", "message": "Payment succeeded; credits added.", "payment": payment_view(p)}


def sandbox_settle(payment_id: str, fail: bool = False) -> dict:
    """Settle (or fail) a pending sandbox ACH payment by delivering the processor's event."""
    p = db.session.get(Payment, payment_id)
    if p is None or p.processor != "sandbox" or p.status != "pending" or not (
            p.method == "ach" or (p.meta or {}).get("ach_submitted")):
        raise NotFound("No pending sandbox ACH payment with this id.")
    if p.kind == "checkout":
        etype = "checkout.session.async_payment_failed" if fail else "checkout.session.async_payment_succeeded"
        result = sandbox_deliver(etype, _session_object(p, "unpaid" if fail else "paid", p.payment_intent))
    else:
        obj = {"id": p.provider_id, "object": "payment_intent", "amount": p.amount_micros // 10_000,
               "amount_received": 0 if fail else p.amount_micros // 10_000, "currency": "usd",
               "status": "requires_payment_method" if fail else "succeeded",
               "metadata": {"payment_id": p.id, "account_id": p.account_id},
               "last_payment_error": {"code": "debit_not_authorized",
                                      "message": "The customer's bank returned the debit (R10)."} if fail else None}
        result = sandbox_deliver("payment_intent.payment_failed" if fail else "payment_intent.succeeded", obj)
    db.session.refresh(p)
    return {"event": result, "payment": payment_view(p)}


def sandbox_refund(payment_id: str, amount_cents: int | None = None) -> dict:
    """Refund a succeeded sandbox payment (all, or ``amount_cents`` more) via ``charge.refunded``."""
    p = db.session.get(Payment, payment_id)
    if p is None or p.processor != "sandbox" or p.status not in ("succeeded", "partially_refunded"):
        raise NotFound("No refundable sandbox payment with this id.")
    total = p.amount_micros // 10_000 if amount_cents is None else \
        min(p.amount_micros // 10_000, (p.refunded_micros or 0) // 10_000 + int(amount_cents))
    obj = {"id": "ch_sbx_" + random_b62(20), "object": "charge", "payment_intent": p.payment_intent,
           "amount": p.amount_micros // 10_000, "amount_refunded": total, "refunded": True}
    result = sandbox_deliver("charge.refunded", obj)
    db.session.refresh(p)
    return {"event": result, "payment": payment_view(p)}

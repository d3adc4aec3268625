"""The sandbox processor's hosted checkout flow (test mode): the page's data, the pay/cancel
actions, and operator helpers that settle, refund or dispute a sandbox payment, each
delivered as a signed processor event through the same webhook path as Stripe's.
"""
from __future__ import annotations

from flask import current_app
from sqlalchemy import select

from app.errors import InvalidRequest, NotFound
from app.extensions import db
from app.ids import random_b62
from app.models import Payment
from app.models.base import utcnow
from app.services.billing.payment_events import handle_webhook
from app.services.billing.payments import CREDITED
from app.services.platform.uow import end_reads, unit_of_work
from app.services.billing.processors import (
    SANDBOX_METHODS,
    json_payload,
    sandbox_webhook_secret,
    sign_payload,
)


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
    return {"payment": p, "session_id": session_id, "return_url": p.return_url,
            "methods": SANDBOX_METHODS, "awaiting_settlement": bool((p.meta or {}).get("ach_submitted"))}


# Stripe's message when the customer fails a 3-D Secure challenge; the checkout stays open.
AUTHENTICATION_FAILED = ("We are unable to authenticate your payment method. Please choose a different payment "
                         "method and try again.")


def sandbox_checkout_action(session_id: str, action: str, pm_id: str | None, *, save_method: bool = False) -> dict:
    """Pay or cancel a sandbox checkout. Returns ``{result, message, payment}``.
    ``save_method`` (the page's "save this payment method" box, like Stripe Checkout's own
    "save my card") marks the checkout as the API's ``save_method`` flag does, so the one
    path saves the card: ``checkouts.save_paid_method`` after the credit's commit. A
    checkout created with the flag saves the card whatever the box. A card that requires
    authentication answers ``authenticate`` (the 3-D Secure challenge) to ``pay``: the action
    ``authenticate`` then pays, ``fail_authentication`` leaves the checkout open."""
    p = _sandbox_session(session_id)
    if p.status != "pending" or (p.meta or {}).get("ach_submitted"):
        return {"result": "closed", "message": f"This checkout is already {p.status}.", "payment": p}
    if p.expires_at and p.expires_at < utcnow():
        sandbox_deliver("checkout.session.expired", _session_object(p, "unpaid", None))
        db.session.refresh(p)
        return {"result": "expired", "message": "This checkout has expired.", "payment": p}
    if action == "cancel":
        sandbox_deliver("checkout.session.expired", _session_object(p, "unpaid", None))
        db.session.refresh(p)
        return {"result": "canceled", "message": "Checkout canceled; nothing was charged.", "payment": p}
    spec = SANDBOX_METHODS.get(pm_id or "")
    if spec is None:
        raise InvalidRequest(f"payment_method: one of {', '.join(SANDBOX_METHODS)}.")
    outcome = spec[3]
    if outcome == "authentication_required" and action == "pay":  # Stripe Checkout's 3-D Secure challenge
        return {"result": "authenticate", "payment": p, "method": pm_id, "save": save_method,
                "message": "Your bank asks you to authenticate this payment (3-D Secure test page)."}
    if action == "fail_authentication":
        return {"result": "declined", "payment": p, "message": AUTHENTICATION_FAILED}
    if outcome in ("generic_decline", "insufficient_funds"):
        from app.services.billing.processors import DECLINE_MESSAGES

        return {"result": "declined", "message": DECLINE_MESSAGES[outcome], "payment": p}
    pi = "pi_sbx_" + random_b62(24)
    save = save_method or bool((p.meta or {}).get("save_method"))
    if save:  # what the sandbox's "payment intent" was paid with, read by ``save_paid_method``
        with unit_of_work():
            p.meta = {**(p.meta or {}), "save_method": True, "sandbox_method": pm_id}
    if outcome == "settles_later":
        with unit_of_work():
            p.meta = {**(p.meta or {}), "ach_submitted": True}
        sandbox_deliver("checkout.session.completed", _session_object(p, "unpaid", pi))
        db.session.refresh(p)
        return {"result": "processing", "payment": p,
                "message": "Bank payment submitted; credits arrive when it settles "
                           "(sandbox: flask payments sandbox-settle " + p.id + ")."}
    sandbox_deliver("checkout.session.completed", _session_object(p, "paid", pi))
    db.session.refresh(p)
    return {"result": "paid", "message": "Payment succeeded; credits added.", "payment": p}


def expire_due(limit: int = 200) -> int:
    """Stripe sends ``checkout.session.expired`` when a session's time is up; the sandbox does
    the same for its unpaid checkouts past ``expires_at`` (not a submitted bank payment),
    through the webhook path, so the history shows them ``expired`` rather than ``pending``
    for ever. Returns how many it expired (a checkout finished meanwhile is left alone).
    Nothing with the sandbox turned off (its events would not verify)."""
    if not current_app.config.get("PAYMENTS_SANDBOX_ENABLED", True):
        return 0
    due = db.session.execute(select(Payment.id).where(
        Payment.processor == "sandbox", Payment.kind == "checkout", Payment.status == "pending",
        Payment.expires_at < utcnow()).order_by(Payment.expires_at).limit(limit)).scalars().all()
    end_reads()
    expired = 0
    for payment_id in due:
        p = db.session.get(Payment, payment_id)
        if p is None or (p.meta or {}).get("ach_submitted"):
            continue
        result = sandbox_deliver("checkout.session.expired", _session_object(p, "unpaid", None))
        expired += result.get("outcome") == "expired"
    return expired


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
    return {"event": result, "payment": p}


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
    return {"event": result, "payment": p}


def sandbox_dispute(payment_id: str, outcome: str | None = None, amount_cents: int | None = None) -> dict:
    """Dispute a succeeded sandbox payment the way Stripe reports a chargeback:
    ``charge.dispute.created`` and ``charge.dispute.funds_withdrawn`` (all, or
    ``amount_cents``); with ``outcome`` ``won`` the dispute's ``funds_reinstated`` and
    ``closed`` follow, with ``lost`` only ``closed``. An open dispute of the payment is
    closed instead of opening a second one."""
    p = db.session.get(Payment, payment_id)
    if p is None or p.processor != "sandbox" or p.status not in CREDITED:
        raise NotFound("No disputable sandbox payment with this id.")
    if outcome not in (None, "won", "lost"):
        raise InvalidRequest("outcome: must be won or lost.")
    disputes = (p.meta or {}).get("disputes") or {}
    still_open = [(int(d.get("status_at") or 0), k) for k, d in disputes.items() if d.get("status") not in ("won", "lost")]
    open_id = max(still_open)[1] if still_open else None
    total = p.amount_micros // 10_000
    obj = {"id": open_id or "dp_sbx_" + random_b62(20), "object": "dispute", "charge": "ch_sbx_" + random_b62(20),
           "payment_intent": p.payment_intent, "currency": "usd", "reason": "fraudulent",
           "amount": min(total, int(amount_cents)) if amount_cents is not None else total}
    events = []
    if open_id is None:
        events += [("charge.dispute.created", "needs_response"), ("charge.dispute.funds_withdrawn", "needs_response")]
    elif outcome is None:
        raise InvalidRequest(f"Dispute {open_id} is open: close it with won or lost.")
    if outcome == "won":
        events += [("charge.dispute.funds_reinstated", "won"), ("charge.dispute.closed", "won")]
    elif outcome == "lost":
        events += [("charge.dispute.closed", "lost")]
    results = [sandbox_deliver(etype, {**obj, "status": status}) for etype, status in events]
    db.session.refresh(p)
    return {"events": results, "payment": p}

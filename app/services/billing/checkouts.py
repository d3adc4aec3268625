"""A pending hosted checkout: resume it (its page again) or cancel it.

``resume`` gives the open session's page (Stripe: the session retrieved, its ``url`` while
``open``; the sandbox: its page), or no url when it can no longer be paid. ``cancel`` closes
the session at the processor first (Stripe: ``checkout.sessions.expire``, refused once the
session completed) and only then marks the payment ``canceled`` with the conditional
``pending →`` update, in one unit of work: a checkout paid before the cancel keeps its
credit (409 ``checkout_not_cancelable``), and a payment confirmation arriving after a
successful cancel cannot exist (the processor refuses to pay an expired session).
"""
from __future__ import annotations

import logging

from app.errors import Conflict, NotFound
from app.extensions import db
from app.models import Payment
from app.models.base import utcnow
from app.services.billing import payments
from app.services.billing.processors import for_mode
from app.services.orgs import audit
from app.services.platform.uow import unit_of_work

log = logging.getLogger(__name__)


class CheckoutNotCancelable(Conflict):
    code = "checkout_not_cancelable"
    message = "This checkout can no longer be canceled."
    description = ("The checkout is no longer pending, or its payment was already made or submitted "
                   "(a bank payment settles or fails on its own).")


def _checkout(account_id: str, mode: str, payment_id: str) -> Payment:
    p = payments.get_payment(account_id, payment_id, mode)
    if p.kind != "checkout":
        raise NotFound("No such checkout.")
    return p


def _open(p: Payment) -> bool:
    return (p.status == "pending" and p.provider_id is not None and not (p.meta or {}).get("ach_submitted")
            and (p.expires_at is None or p.expires_at > utcnow()))


def _state(p: Payment) -> str:
    if p.status == "pending" and (p.meta or {}).get("ach_submitted"):
        return "is pending (its bank payment was submitted)"
    if p.status == "pending" and p.expires_at is not None and p.expires_at <= utcnow():
        return f"expired at {p.expires_at.isoformat()}"
    return f"is {p.status}"


def resume(account_id: str, mode: str, payment_id: str) -> dict:
    """The checkout's state and, while it can still be paid, its hosted page's ``url``."""
    p = _checkout(account_id, mode, payment_id)
    url = for_mode(p.mode).checkout_url(p.provider_id) if _open(p) else None
    return {"url": url, "payment_id": p.id, "status": p.status, "expires_at": p.expires_at}


def cancel(account_id: str, mode: str, payment_id: str) -> Payment:
    """Cancel a pending checkout (the processor's session first, then the payment)."""
    p = _checkout(account_id, mode, payment_id)
    if not _open(p) or not for_mode(p.mode).expire_checkout(p.provider_id):
        raise CheckoutNotCancelable(f"Checkout {p.id} {_state(p)}; it can no longer be canceled.")
    with unit_of_work():
        if not payments.finish_payment(p, "canceled", "canceled", "Canceled by the customer."):
            raise CheckoutNotCancelable(f"Checkout {p.id} was completed meanwhile.")
        audit.record(account_id, None, "checkout.cancel", p.id, before={"status": "pending"},
                     after={"status": "canceled"})
    db.session.refresh(p)
    return p


def save_paid_method(payment_id: str) -> str | None:
    """A checkout created with ``save_method`` was paid: save the method it was paid with and
    make it the default (``payments.set_default_method``: validated and attached at the
    processor, listed by ``GET /api/pay/methods``, charged by auto top-up). Runs after the
    credit's commit (no transaction open during the processor calls); once per payment
    (``meta.saved_method``). Returns the method id, or None."""
    p = db.session.get(Payment, payment_id)
    meta = (p.meta or {}) if p is not None else {}
    if p is None or not meta.get("save_method") or meta.get("saved_method"):
        return None
    try:
        pm_id = for_mode(p.mode).checkout_method(p)
        if not pm_id:
            log.warning("checkout %s: the processor names no payment method to save", p.id)
            return None
        payments.set_default_method(p.account_id, p.mode, pm_id)
    except Exception:  # noqa: BLE001 - the payment stands; the customer can save the card by hand
        log.exception("checkout %s: saving its payment method failed", payment_id)
        return None
    with unit_of_work():
        p = db.session.get(Payment, payment_id, with_for_update=True)
        p.meta = {**(p.meta or {}), "saved_method": pm_id}
    return pm_id


"""Processor events: verify a webhook (Stripe's signature scheme, also used by the sandbox),
store each event once under its provider event id and apply it to its payment (credit,
failure or refund) in the same unit of work, so a replayed event changes nothing.
"""
from __future__ import annotations

import json
import logging
from datetime import timedelta

import stripe
from flask import current_app
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.errors import DomainError, InvalidRequest
from app.extensions import db
from app.models import Payment, PaymentEvent
from app.models.base import utcnow
from app.services.billing import event_payloads
from app.services.billing.payments import (credit_payment, dispute_recorded, dispute_reinstated, dispute_withdrawn,
                                           finish_payment, refund_payment)
from app.services.billing.processors import sandbox_webhook_secret
from app.services.platform.uow import after_commit, unit_of_work

log = logging.getLogger(__name__)


WEBHOOK_TOLERANCE_SECONDS = 300
# Outcome of a ``charge.refunded`` that arrived before its payment was credited (Stripe does
# not order events, and retries a failed delivery for days): kept, and applied when the
# payment is credited (``_apply_early``), so a refund is never lost to ordering.
EARLY_REFUND = "refund_early"
# The same for a dispute's funds event before its payment was credited, or a
# ``funds_reinstated`` before its ``funds_withdrawn``.
EARLY_DISPUTE = "dispute_early"
# How far back crediting looks for such events (beyond Stripe's 3-day retry window).
EARLY_REFUND_DAYS = 30
# The dispute events and what applies each (payments.py; only the funds events move money).
_DISPUTE = {"charge.dispute.funds_withdrawn": dispute_withdrawn,
            "charge.dispute.funds_reinstated": dispute_reinstated,
            "charge.dispute.created": dispute_recorded, "charge.dispute.updated": dispute_recorded,
            "charge.dispute.closed": dispute_recorded}
# Order in which kept events are applied: refunds, withdrawals before reinstatements, then
# the status events (whose own order is their ``created`` time).
_EARLY_ORDER = ("charge.refunded", *_DISPUTE)


class WebhookSignatureInvalid(DomainError):
    status, code, message = 401, "webhook_signature_invalid", "Invalid webhook signature."
    description = ("The webhook's Stripe-Signature is well-formed but forged or stale (300 s tolerance): "
                   "the signature is the request's credential, so 401 like the other signature failures.")


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
        return event_payloads.validate(event), processor
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
            return _credited(p, processor), p.id
        if etype == "checkout.session.completed":
            return "awaiting_settlement", p.id
        if etype == "checkout.session.async_payment_failed":
            return ("failed" if finish_payment(p, "failed", "payment_failed", "The bank payment failed.") else "already_final"), p.id
        if etype == "checkout.session.expired":
            return ("expired" if finish_payment(p, "expired") else "already_final"), p.id
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
        outcome = _intent_event(p, etype, obj, processor)
        from app.services.billing import autotopup  # an auto top-up's run waits for this answer

        autotopup.payment_final(p)
        return outcome, p.id
    if etype == "charge.refunded" or etype in _DISPUTE:
        pi = obj.get("payment_intent")
        p = _find(processor, payment_intent=pi if isinstance(pi, str) else None)
        if p is None:  # its payment's own event has not come yet (or it is not ours)
            return (EARLY_REFUND if etype == "charge.refunded" else EARLY_DISPUTE), None
        outcome = _reverse(p, event)
        if outcome == "dispute_withdrawn":
            _apply_early(p, processor)  # a reinstatement that came first
        return outcome, p.id
    return "ignored", None


def _intent_event(p: Payment, etype: str, obj: dict, processor: str) -> str:
    """A ``payment_intent.*`` event of an off-session charge (wallet funding, auto top-up)."""
    if etype == "payment_intent.succeeded":
        if int(obj.get("amount_received") or obj.get("amount") or 0) * 10_000 != p.amount_micros:
            return "amount_mismatch"
        return _credited(p, processor)
    if etype == "payment_intent.payment_failed":
        err = obj.get("last_payment_error") or {}
        ok = finish_payment(p, "failed", err.get("code") or "payment_failed", err.get("message") or "The payment failed.")
        return "failed" if ok else "already_final"
    if etype == "payment_intent.canceled":
        return "canceled" if finish_payment(p, "canceled") else "already_final"
    return "ignored"


def _reverse(p: Payment, event: dict) -> str:
    """Apply a refund or a dispute event to ``p``; ``EARLY_*`` when it has to wait (the
    payment is not credited yet, or a reinstatement came before its withdrawal)."""
    etype, obj = event["type"], event["data"]["object"]
    if etype == "charge.refunded":
        outcome = refund_payment(p, int(obj.get("amount_refunded") or 0) * 10_000, str(obj.get("id")))
        return EARLY_REFUND if outcome == "ignored_not_succeeded" else outcome
    outcome = _DISPUTE[etype](p, obj, int(event.get("created") or 0))
    return EARLY_DISPUTE if outcome in ("ignored_not_succeeded", "ignored_not_withdrawn") else outcome


def _credited(p: Payment, processor: str) -> str:
    """Credit ``p`` (its success event), then apply the refunds and disputes that came
    before it."""
    if not credit_payment(p):
        return "already_final"
    _apply_early(p, processor)
    if p.kind == "checkout" and (p.meta or {}).get("save_method"):
        from app.services.billing import checkouts  # the card is saved once the credit is committed

        after_commit(checkouts.save_paid_method, p.id)
    return "credited"


def _apply_early(p: Payment, processor: str) -> None:
    """Refund and dispute events of ``p``'s payment intent that had to wait (outcome
    ``EARLY_REFUND`` / ``EARLY_DISPUTE``), applied now in the current unit of work (the one
    crediting ``p``, or applying a dispute's withdrawal): the customer does not keep both
    the refund and the credit. Their rows then record the outcome and the payment."""
    if not p.payment_intent:
        return
    rows = db.session.execute(select(PaymentEvent).where(
        PaymentEvent.processor == processor, PaymentEvent.type.in_(_EARLY_ORDER),
        PaymentEvent.outcome.in_((EARLY_REFUND, EARLY_DISPUTE)),
        PaymentEvent.received_at >= utcnow() - timedelta(days=EARLY_REFUND_DAYS))
        .order_by(PaymentEvent.id)).scalars().all()
    for row in sorted(rows, key=lambda r: _EARLY_ORDER.index(r.type)):
        if (row.payload["data"]["object"]).get("payment_intent") != p.payment_intent:
            continue
        outcome = _reverse(p, row.payload)
        if outcome in (EARLY_REFUND, EARLY_DISPUTE):
            continue  # still waiting (a reinstatement whose withdrawal has not come)
        row.outcome, row.payment_id = outcome, p.id
        log.warning("payment %s: %s event %s arrived before it could apply; applied now (%s)",
                    p.id, row.type, row.event_id, outcome)


class _Duplicate(Exception):
    """This event id was stored before."""


def apply_event(event: dict, processor: str) -> dict:
    """Store the event under its unique id and apply it, in ONE transaction."""
    row = PaymentEvent(processor=processor, event_id=event["id"][:120], type=event["type"][:80],
                       outcome="received", payload=event)
    try:
        with unit_of_work():
            db.session.add(row)
            try:
                db.session.flush()
            except IntegrityError:
                raise _Duplicate() from None
            outcome, payment_id = _dispatch(event, processor)
            row.outcome, row.payment_id = outcome, payment_id
    except _Duplicate:
        return {"received": True, "duplicate": True, "event_id": event["id"], "outcome": "duplicate"}
    log.info("payment event %s %s -> %s", event["id"], event["type"], outcome)
    return {"received": True, "duplicate": False, "event_id": event["id"], "outcome": outcome}

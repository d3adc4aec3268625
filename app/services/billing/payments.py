"""Payments: checkout, saved payment method, off-session card/ACH funding, payment
history, the processor webhook and the sandbox processor's hosted flow.

Money rule: a payment credits the account only when the processor confirms it (a
verified webhook, or the synchronous success of an off-session card charge), through
the money engine's ``funding.credit`` (ref ``pay:<payment id>``) together with a conditional status change
``pending → succeeded`` in one database transaction. So however many events report the
same payment (``checkout.session.completed``, ``payment_intent.succeeded``, replays),
it is credited exactly once. Every verified event is stored under its unique event id in
the same transaction as its effect: a replay changes nothing, a crash changes nothing.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from flask import current_app
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from app.errors import DomainError, InvalidRequest, NotFound
from app.extensions import db
from app.ids import new_id
from app.models import Account, BillingProfile, Payment
from app.models.base import utcnow
from app.services.money import funding, outside
from app.services.money import ledger
from app.services.billing.processors import CardDeclined, MethodInfo, for_mode
from app.services.platform import redirects
from app.services.platform.uow import unit_of_work

log = logging.getLogger(__name__)

HISTORY_LIMIT = 50




class NoPaymentMethod(DomainError):
    # 409: a state of the account (nothing saved yet), not a malformed request (issue 42 item 12)
    status, code, message = 409, "no_payment_method", "No saved payment method."
    description = "No saved default payment method fits (save one with POST /api/pay/method)."


# --- views -------------------------------------------------------------------------


def history(account_id: str, mode: str = "live") -> list[Payment]:
    """The account's last 50 payments of ``mode`` (card, ACH, USDC, x402), newest first."""
    rows = db.session.execute(
        select(Payment).where(Payment.account_id == account_id, Payment.mode == mode)
        .order_by(Payment.created_at.desc(), Payment.id.desc()).limit(HISTORY_LIMIT)
    ).scalars().all()
    return list(rows)


def get_payment(account_id: str, payment_id: str, mode: str = "live") -> Payment:
    p = db.session.get(Payment, payment_id)
    if p is None or p.account_id != account_id or p.mode != mode:
        raise NotFound("No such payment.")
    return p


def _audit(account_id: str, action: str, target: str | None, actor=None, **after) -> None:
    """A change to the account's money in its audit log (``orgs.audit``), in the caller's
    unit of work: by the current request's actor, else ``actor`` (a processor's event)."""
    from app.services.orgs import audit

    audit.record(account_id, audit.current() or actor, action, target, after=after)


# --- ledger effects (never commit) ---------------------------------------------------

def ledger_source(payment: Payment) -> str:
    """External ledger source: real card/ACH money vs. sandbox play money."""
    if payment.processor == "sandbox":
        return ledger.external("sandbox")
    return ledger.external({"card": "card", "ach": "ach", "usdc": "usdc", "x402": "x402"}[payment.method])


def credit_payment(payment: Payment, ref: str | None = None, external_ref: str | None = None,
                   **values) -> bool:
    """``pending → succeeded`` and the credit, once, recorded in the book of outside money
    under ``external_ref`` (default: the processor reference). Returns False when already
    final; ``IntegrityError`` when that outside money was already credited."""
    res = db.session.execute(
        update(Payment).where(Payment.id == payment.id, Payment.status == "pending")
        .values(status="succeeded", updated_at=utcnow(), **values)
        .execution_options(synchronize_session=False))
    if res.rowcount != 1:
        return False
    funding.credit("payment", source=ledger_source(payment), account_id=payment.account_id,
                   mode=payment.mode or "live",  # a test payment funds the test balance
                   micros=int(payment.amount_micros), ref=ref or f"pay:{payment.id}",
                   outside_ref=external_ref or outside.payment_ref(payment), rail=payment.processor,
                   payment_id=payment.id,
                   meta={"payment_id": payment.id, "method": payment.method, "processor": payment.processor})
    from app.services.orgs.audit import Actor

    _audit(payment.account_id, "payment.credit", payment.id, Actor(None, payment.processor),
           amount_micros=int(payment.amount_micros), method=payment.method, processor=payment.processor,
           mode=payment.mode or "live")
    from app.services.billing import invoices  # its document, numbered in this unit of work

    invoices.issue_for_payment(payment)
    return True


def finish_payment(payment: Payment, status: str, code: str | None = None, message: str | None = None,
            **values) -> bool:
    res = db.session.execute(
        update(Payment).where(Payment.id == payment.id, Payment.status == "pending")
        .values(status=status, failure_code=code, failure_message=(message or None) and message[:300],
                updated_at=utcnow(), **values)
        .execution_options(synchronize_session=False))
    return res.rowcount == 1


REFUND_SHORTFALL = "adjust:refund_shortfall"
DISPUTE_SHORTFALL = "adjust:dispute_shortfall"
CREDITED = ("succeeded", "partially_refunded", "refunded")  # statuses of a payment whose credit was posted


def _take_back(payment: Payment, micros: int, *, kind: str, ref: str, shortfall: str, meta: dict) -> int:
    """Post the reversal of ``micros`` of ``payment``'s credit (a refund or a dispute's
    withdrawal): the money goes back out through its source, taken from the customer's
    balance as far as it reaches; credit already spent is booked against ``shortfall``.
    The balance is read locked, so a concurrent spend cannot make the debit fail between
    the read and the posting. Returns what was taken from the balance."""
    return funding.take_back(kind, source=ledger_source(payment), account_id=payment.account_id,
                             mode=payment.mode, micros=micros, shortfall=shortfall, ref=ref,
                             meta={**meta, "payment_id": payment.id})


def disputed_micros(payment: Payment) -> int:
    """What disputes have withdrawn from ``payment`` and not (yet) reinstated."""
    return sum(int(d.get("withdrawn_micros") or 0) for d in ((payment.meta or {}).get("disputes") or {}).values()
               if not d.get("reinstated"))


def _lock(payment: Payment) -> None:
    """Re-read ``payment`` locked (``FOR UPDATE`` on PostgreSQL): refunds and dispute
    events of one payment apply one at a time, each seeing what the previous one wrote.
    Pending changes are flushed first, so the re-read cannot discard them."""
    db.session.flush()
    db.session.refresh(payment, with_for_update=True)


def _set_meta(payment: Payment, **values) -> None:
    payment.meta = {**(payment.meta or {}), **values}  # a new object: the JSON column sees the change
    payment.updated_at = utcnow()
    db.session.flush()


def refund_payment(payment: Payment, refunded_total_micros: int, charge_id: str) -> str:
    """Debit what the processor refunded beyond what we already reversed. Credit already
    spent cannot be taken back: that part is booked against ``adjust:refund_shortfall``.
    Money a dispute withdrew is not reversed a second time: the refund waits for it
    (the reported total is kept, ``refund_reported_micros``, and applied if the dispute is
    won and its funds reinstated)."""
    _lock(payment)
    if payment.status not in CREDITED:
        return "ignored_not_succeeded"
    reported = min(refunded_total_micros, payment.amount_micros)
    if reported > int((payment.meta or {}).get("refund_reported_micros") or 0):
        _set_meta(payment, refund_reported_micros=reported, refund_charge=charge_id)
    refunded_total_micros = min(reported, payment.amount_micros - disputed_micros(payment))
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
    _take_back(payment, delta, kind="refund", ref=f"refund:{payment.id}:{refunded_total_micros}",
               shortfall=REFUND_SHORTFALL, meta={"charge": charge_id})
    from app.services.billing import invoices  # its credit note, numbered in this unit of work

    invoices.issue_credit_note(payment, refunded_total_micros)
    return "refunded"


# --- disputes (chargebacks) ----------------------------------------------------------
#
# Each dispute is recorded on its payment (``meta.disputes[<dispute id>]``): status and
# reason with the time of the event that set them (``status_at``: Stripe does not order
# events, so an older event never overwrites a newer status), the withdrawn amount and
# what of it came from the balance, and whether it was reinstated.

def _dispute_record(payment: Payment, dispute: dict, created: int) -> dict:
    """``payment``'s record of ``dispute``, updated with the processor's status and reason
    unless a later event set them; the caller stores it with ``_store_dispute``."""
    record = dict(((payment.meta or {}).get("disputes") or {}).get(dispute["id"]) or {})
    if created >= int(record.get("status_at") or 0):
        record["status_at"] = created
        for key in ("status", "reason"):
            if isinstance(dispute.get(key), str):
                record[key] = dispute[key][:64]
    return record


def _store_dispute(payment: Payment, dispute_id: str, record: dict) -> None:
    meta = payment.meta or {}
    disputes = {**(meta.get("disputes") or {}), dispute_id: record}
    latest = max(disputes.values(), key=lambda d: int(d.get("status_at") or 0))
    _set_meta(payment, disputes=disputes, dispute_status=latest.get("status"))


def dispute_recorded(payment: Payment, dispute: dict, created: int = 0) -> str:
    """``charge.dispute.created|updated|closed``: keep the dispute's status on the payment
    (``dispute_status`` in the history); money moves only with the funds events."""
    _lock(payment)
    if payment.status not in CREDITED:
        return "ignored_not_succeeded"
    _store_dispute(payment, dispute["id"], _dispute_record(payment, dispute, created))
    return "dispute_recorded"


def dispute_withdrawn(payment: Payment, dispute: dict, created: int = 0) -> str:
    """``charge.dispute.funds_withdrawn``: the processor took the disputed amount back from
    us, so the credit it bought is taken back like a refund (the spent part against
    ``adjust:dispute_shortfall``), once per dispute (ledger ref ``dispute:<id>``). Without
    this a chargeback left the customer both the money and the credit."""
    _lock(payment)
    if payment.status not in CREDITED:
        return "ignored_not_succeeded"
    record = _dispute_record(payment, dispute, created)
    if record.get("withdrawn_micros") is not None:
        return "already_withdrawn"
    available = payment.amount_micros - int(payment.refunded_micros or 0) - disputed_micros(payment)
    micros = max(0, min(int(dispute.get("amount") or 0) * 10_000, available))
    recovered = 0
    if micros:
        recovered = _take_back(payment, micros, kind="dispute", ref=f"dispute:{dispute['id']}",
                               shortfall=DISPUTE_SHORTFALL, meta={"dispute": dispute["id"]})
    record.update(withdrawn_micros=micros, recovered_micros=recovered)
    _store_dispute(payment, dispute["id"], record)
    return "dispute_withdrawn"


def dispute_reinstated(payment: Payment, dispute: dict, created: int = 0) -> str:
    """``charge.dispute.funds_reinstated`` (the dispute was won): the withdrawal is undone
    leg for leg — the customer gets back exactly what was taken from the balance, the
    shortfall account what it absorbed (ledger ref ``dispute_reinstated:<id>``); then a
    refund the dispute held back is applied."""
    _lock(payment)
    record = _dispute_record(payment, dispute, created)
    if record.get("withdrawn_micros") is None:
        return "ignored_not_withdrawn"
    if record.get("reinstated"):
        return "already_reinstated"
    micros, recovered = int(record["withdrawn_micros"]), int(record.get("recovered_micros") or 0)
    if micros:
        funding.reinstate("dispute_reinstated", source=ledger_source(payment), account_id=payment.account_id,
                          mode=payment.mode, micros=micros, recovered=recovered, shortfall=DISPUTE_SHORTFALL,
                          ref=f"dispute_reinstated:{dispute['id']}",
                          meta={"payment_id": payment.id, "dispute": dispute["id"], "recovered_micros": recovered})
    record["reinstated"] = True
    _store_dispute(payment, dispute["id"], record)
    meta = payment.meta or {}
    reported = int(meta.get("refund_reported_micros") or 0)
    if reported > int(payment.refunded_micros or 0):
        refund_payment(payment, reported, str(meta.get("refund_charge") or ""))
    return "dispute_reinstated"


# --- profile / method --------------------------------------------------------------

def _profile(account_id: str, processor: str) -> BillingProfile | None:
    return db.session.execute(
        select(BillingProfile).where(BillingProfile.account_id == account_id,
                                     BillingProfile.processor == processor)).scalar_one_or_none()


def saved_method(account_id: str, mode: str) -> BillingProfile | None:
    """The account's billing profile (saved default method) with ``mode``'s processor."""
    return _profile(account_id, for_mode(mode).name)


def set_default_method(account_id: str, mode: str, pm_id: str) -> BillingProfile:
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
    try:
        with unit_of_work():  # after the processor calls
            if profile is None:
                profile = BillingProfile(account_id=account_id, processor=proc.name)
                db.session.add(profile)
            profile.customer_id = customer_id
            profile.payment_method_id, profile.payment_method_type = info.id, info.type
            profile.brand, profile.last4 = info.brand, info.last4
            from app.services.billing import methods  # the list of saved methods (methods.py)

            methods.remember(account_id, proc.name, info)
            _audit(account_id, "method.default", info.id, type=info.type, brand=info.brand, last4=info.last4,
                   mode=mode)
    except IntegrityError:  # a concurrent first save: retry as an update
        return set_default_method(account_id, mode, pm_id)
    return profile


# --- checkout ------------------------------------------------------------------------

def create_checkout(account_id: str, mode: str, amount_cents: int, product: str | None = None,
                    return_url: str | None = None, save_method: bool = False) -> dict:
    """Start a hosted checkout; credit arrives only with the processor's confirmation.
    Two units of work around the processor call. ``save_method``: the card it is paid with
    is saved and made the default (Stripe ``setup_future_usage=off_session`` on a session of
    the account's customer; ``checkouts.save_paid_method`` after the payment)."""
    cfg = current_app.config
    return_url = redirects.validate_return_url(return_url)
    proc = for_mode(mode)
    payment = Payment(id=new_id("pay"), account_id=account_id, method="card", kind="checkout",
                      processor=proc.name, mode=mode, amount_micros=ledger.cents_to_micros(amount_cents),
                      product=product, return_url=return_url, status="pending",
                      expires_at=utcnow() + timedelta(hours=24), meta={"save_method": True} if save_method else None)
    with unit_of_work():  # recorded before the processor is called (crash leaves a pending row)
        db.session.add(payment)
        _audit(account_id, "checkout.create", payment.id, amount_micros=int(payment.amount_micros), mode=mode,
               processor=proc.name)
    profile = _profile(account_id, proc.name)
    customer_id = profile.customer_id if profile else None
    if save_method and customer_id is None:  # a card is saved on a customer (idempotent per account)
        acct = db.session.get(Account, account_id)
        customer_id = proc.ensure_customer(account_id, acct.email if acct else None, None)
    done = return_url or cfg["BASE_URL"]
    sep = "&" if "?" in done else "?"
    session_id, url = proc.create_checkout(
        payment, customer_id,
        success_url=f"{done}{sep}checkout=success&payment_id={payment.id}",
        cancel_url=f"{done}{sep}checkout=cancel&payment_id={payment.id}")
    with unit_of_work():
        payment.provider_id = session_id
    return {"url": url, "payment_id": payment.id, "status": payment.status,
            "expires_at": payment.expires_at}


# --- off-session funding (card, ACH) ----------------------------------------------------

def fund_with_saved_method(account_id: str, mode: str, amount_cents: int, method: str) -> FundResult:
    """``card``: charge the saved card off-session, credit at once on success, 402
    ``card_declined`` on decline. ``ach``: start a bank debit; credits when it settles.
    Two units of work around the processor call: the pending payment, then its outcome."""
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
    customer_id = profile.customer_id
    pm = MethodInfo(profile.payment_method_id, profile.payment_method_type, profile.brand, profile.last4)
    with unit_of_work():  # a crash after this leaves a pending payment the webhook completes
        db.session.add(payment)
        _audit(account_id, "funding.create", payment.id, amount_micros=int(payment.amount_micros), method=method,
               mode=mode)
    payment_id = payment.id
    result = proc.charge(payment, customer_id, pm)
    try:
        with unit_of_work():
            payment.provider_id = result.provider_id
            payment.payment_intent = result.provider_id
            try:
                db.session.flush()
            except IntegrityError:
                raise _IntentKnown() from None
            _record_charge(payment, result)
    except _IntentKnown:  # the webhook already recorded this intent under the payment
        with unit_of_work():
            payment = db.session.get(Payment, payment_id)
            _record_charge(payment, result)
    if result.status == "failed":
        message = result.failure_message or "The card was declined."
        if result.failure_code == "authentication_required":  # off-session: no one to authenticate
            message += (" Funding from the saved card cannot ask for it; pay with a hosted checkout "
                        "(POST /api/pay/checkout), where the cardholder can authenticate.")
        raise CardDeclined(message, extra={"decline_code": result.failure_code, "payment_id": payment.id})
    db.session.refresh(payment)
    return fund_result(payment)


class _IntentKnown(Exception):
    """The processor's intent id is already recorded (by the webhook)."""


def _record_charge(payment: Payment, result) -> None:
    """Book an off-session charge's outcome in the caller's unit of work."""
    if result.status == "succeeded":
        credit_payment(payment)
    elif result.status == "failed":
        finish_payment(payment, "failed", result.failure_code, result.failure_message)


@dataclass(frozen=True)
class FundResult:
    """The answer of ``POST /api/wallet/fund``: the payment, the balance after it and, for
    USDC, the deposit instructions."""

    payment: Payment
    balance_micros: int
    deposit: dict | None = None


def fund_result(payment: Payment, deposit: dict | None = None) -> FundResult:
    """The payment and the balance of its mode after it."""
    return FundResult(payment, ledger.cached_balance(payment.account_id, payment.mode), deposit)


# --- webhook -------------------------------------------------------------------------













# --- sandbox processor: hosted checkout and settlement ------------------------------------
















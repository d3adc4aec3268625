"""Auto top-up: when a charge leaves the balance under the account's threshold, exactly one
top-up is charged to its saved card and credited like any payment.

The trigger costs the hot path nothing measurable. The charge path is SQL (the engine's posting function,
called by ``gw_open_calls``, the chat hold, every posting); the threshold is cached on the
balance row (``accounts.topup_below_micros`` / ``test_topup_below_micros``, NULL: off) and
the row trigger ``gw_accounts_autotopup`` has a WHEN clause comparing it with the old and
new balance: a charge that does not cross pays one comparison in the executor, no function
call; the crossing one calls ``gw_autotopup_crossed`` (``billing/sql/``), which inserts a
``queued`` run in the charge's own transaction. Concurrent charges of one account serialize
on its row lock, so one UPDATE crosses; and a unique partial index allows one open
(``queued`` / ``processing``) run per account and mode (``ON CONFLICT DO NOTHING``).

The run is a job (``run``): the schedule's ``autotopup-start`` (every 5 s) enqueues due
runs (RQ, or inline without Redis); ``configure`` enqueues one at once when the balance is
already under the new threshold. ``run`` claims the run (a conditional UPDATE, with a
lease: two workers never charge the same run, and a run whose worker died is taken again
after the lease), creates its payment (one per run, kept on the run), charges it through
the processor (Stripe: an off-session PaymentIntent, idempotency key ``charge:<payment
id>``; the sandbox: the test card's outcome) and books the outcome in ONE unit of work:
``payments.credit_payment`` (``funding.credit`` under the payment intent's outside
reference, a conditional ``pending → succeeded``) and the run's status. So a replayed
webhook, a webhook racing the job, or a worker killed between the processor's answer and
the booking (the retry charges again with the same idempotency key) never credits twice.

A failed attempt (declined, or 3-D Secure required: ``requires_action``) counts in
``failures``; it is retried after ``AUTOTOPUP_RETRY_SECONDS × 2^(failures-1)`` while the
balance stays under the threshold; at ``AUTOTOPUP_MAX_FAILURES`` consecutive failures the
rule is disabled and the owner is e-mailed (outbox); a 3-D Secure request is e-mailed at
once. A success resets the count. Each attempt is a payment (``GET /api/pay/history``,
product ``Auto top-up``); each run, charged or skipped, is listed by ``GET
/api/pay/auto-topup``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from flask import current_app
from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from app.errors import DomainError, NotFound, ServiceUnavailable, Unprocessable
from app.extensions import db
from app.ids import new_id
from app.models import Account, AutoTopup, AutoTopupRun, Payment
from app.models.base import utcnow
from app.services.accounts import keys
from app.services.billing import payments
from app.services.billing.processors import ChargeResult, MethodInfo, asks_for_authentication, for_mode
from app.services.billing.usage import billing_period
from app.services.money import ledger
from app.services.platform import outbox
from app.services.orgs import audit, orgs
from app.services.platform.uow import after_commit, end_reads, unit_of_work

log = logging.getLogger(__name__)

LEASE = timedelta(seconds=120)
RUNS_SHOWN = 10
START_BATCH = 200
PRODUCT = "Auto top-up"
OPEN = ("queued", "processing")
# statuses of a run whose amount counts against the monthly cap
COUNTED = ("processing", "succeeded", "pending")
THRESHOLD_COLUMN = {"live": Account.topup_below_micros, "test": Account.test_topup_below_micros}


@dataclass
class AutoTopupView:
    """``GET /api/pay/auto-topup``: the rule, its card, this month's top-ups and the last runs."""

    rule: AutoTopup
    method: object | None
    month_micros: int
    runs: list[AutoTopupRun]
    card_needs_authentication: bool  # ``needs_authentication``: its off-session charges would fail

    def __getattr__(self, name):
        return getattr(self.rule, name)


# --- the rule --------------------------------------------------------------------------

def _rule(account_id: str, mode: str, *, lock: bool = False) -> AutoTopup | None:
    stmt = select(AutoTopup).where(AutoTopup.account_id == account_id, AutoTopup.mode == mode)
    if lock:
        stmt = stmt.with_for_update()
    return db.session.execute(stmt).scalar_one_or_none()


def _set_threshold(account_id: str, mode: str, micros: int | None) -> None:
    """The cached threshold the balance trigger compares with (None: off)."""
    db.session.execute(update(Account).where(Account.id == account_id)
                       .values({THRESHOLD_COLUMN[mode]: micros}).execution_options(synchronize_session=False))


def _card(account_id: str, mode: str):
    """The saved default method, which must be a card (an off-session top-up must credit now)."""
    profile = payments.saved_method(account_id, mode)
    if profile is None or not profile.payment_method_id:
        raise payments.NoPaymentMethod("Auto top-up charges the saved card: save one with POST /api/pay/method "
                                       "(or pay a checkout with a saved card) first.")
    if profile.payment_method_type != "card":
        raise payments.NoPaymentMethod(f"Auto top-up charges a card; the saved default method is a "
                                       f"{profile.payment_method_type}. Save a card with POST /api/pay/method.")
    return profile


def configure(account_id: str, mode: str, *, threshold_cents: int, amount_cents: int,
              monthly_cap_cents: int, acting_key_id: str | None = None) -> AutoTopupView:
    """Create or replace the rule of ``mode`` (enabled, failures reset). When the balance is
    already under the threshold, one top-up starts now (a queued retry is made due now).
    Set by a key (``acting_key_id``; None: the console's owner), that key may have no spend
    limit (403 ``beyond_own_limits``: the rule charges the card past any key's limit)."""
    keys.require_unlimited(acting_key_id, "Auto top-up")
    if monthly_cap_cents < amount_cents:
        raise Unprocessable("monthly_cap_cents: must be at least amount_cents (two fields related: 422).")
    _card(account_id, mode)
    now = utcnow()
    values = {"threshold_micros": ledger.cents_to_micros(threshold_cents),
              "amount_micros": ledger.cents_to_micros(amount_cents),
              "monthly_cap_micros": ledger.cents_to_micros(monthly_cap_cents),
              "enabled": True, "failures": 0, "disabled_reason": None, "updated_at": now}
    with unit_of_work():
        db.session.execute(pg_insert(AutoTopup).values(account_id=account_id, mode=mode, created_at=now, **values)
                           .on_conflict_do_update(constraint="uq_auto_topups_account_mode", set_=values))
        _set_threshold(account_id, mode, values["threshold_micros"])
        audit.record(account_id, None, "autotopup.set", mode, after={
            k: values[k] for k in ("threshold_micros", "amount_micros", "monthly_cap_micros")})
        balance = ledger.cached_balance(account_id, mode)
        if balance < values["threshold_micros"]:
            run_id = db.session.execute(
                pg_insert(AutoTopupRun).values(account_id=account_id, mode=mode, status="queued",
                                               balance_micros=balance, attempts=0, due_at=now,
                                               created_at=now, updated_at=now)
                .on_conflict_do_nothing().returning(AutoTopupRun.id)).scalar()
            if run_id is None:  # one is open already: a retry waiting for its delay starts now too
                run_id = db.session.execute(update(AutoTopupRun).where(
                    AutoTopupRun.account_id == account_id, AutoTopupRun.mode == mode,
                    AutoTopupRun.status == "queued").values(due_at=now, updated_at=now)
                    .returning(AutoTopupRun.id).execution_options(synchronize_session=False)).scalar()
            if run_id is not None:
                after_commit(_enqueue, run_id)
    return view(account_id, mode)


def view(account_id: str, mode: str) -> AutoTopupView:
    rule = _rule(account_id, mode)
    if rule is None:
        raise NotFound("No auto top-up is set (PUT /api/pay/auto-topup).")
    profile = _default_card(account_id, mode)
    runs = db.session.execute(
        select(AutoTopupRun).where(AutoTopupRun.account_id == account_id, AutoTopupRun.mode == mode)
        .order_by(AutoTopupRun.created_at.desc(), AutoTopupRun.id.desc()).limit(RUNS_SHOWN)).scalars().all()
    return AutoTopupView(rule, profile, _month_micros(account_id, mode), list(runs),
                         _card_needs_authentication(account_id, mode, profile))


def _default_card(account_id: str, mode: str):
    """The saved default method if it is a card auto top-up could charge, else None (none
    saved, the default removed, or the default is a bank account)."""
    profile = payments.saved_method(account_id, mode)
    if profile is None or not profile.payment_method_id or profile.payment_method_type != "card":
        return None
    return profile


def needs_authentication(account_id: str, mode: str) -> bool:
    """Whether the saved card is known to need 3-D Secure, so that auto top-up's off-session
    charges on it fail (the run ``requires_action``, Stripe's ``authentication_required``):
    the processor says so of the method (``processors.asks_for_authentication``), or this
    card's latest off-session charge (an auto top-up, or a payment with the saved card)
    failed so. Not known is False: the bank decides at each charge. The API accepts the rule
    either way (docs/decisions.md, "Auto top-up on a card that needs 3-D Secure"); the
    console warns and ``GET /api/pay/auto-topup`` says it (``card_needs_authentication``)."""
    return _card_needs_authentication(account_id, mode, _default_card(account_id, mode))


def _card_needs_authentication(account_id: str, mode: str, profile) -> bool:
    """``needs_authentication`` of the default card ``profile`` (``_default_card``) already read."""
    if profile is None:
        return False
    if asks_for_authentication(profile.processor, profile.payment_method_id):
        return True
    last = db.session.execute(
        select(Payment.status, Payment.failure_code).where(
            Payment.account_id == account_id, Payment.mode == mode, Payment.kind == "charge",
            Payment.processor == profile.processor,
            Payment.meta["payment_method"].as_string() == profile.payment_method_id)
        .order_by(Payment.created_at.desc(), Payment.id.desc()).limit(1)).first()
    return last is not None and last.status == "failed" and last.failure_code == "authentication_required"


def remove(account_id: str, mode: str) -> None:
    """Delete the rule: no new run starts; queued runs are skipped (a charge already sent to
    the processor completes and is booked). Idempotent, as deleting an alert: once deleted,
    deleting again changes nothing and answers as the first time (its ``autotopup.delete``
    entry is the record); a mode that never had a rule → 404."""
    with unit_of_work():
        rule = _rule(account_id, mode, lock=True)
        if rule is None:
            if audit.last_removal(account_id, "autotopup.delete", target=mode) is None:
                raise NotFound("No auto top-up is set.")
            return
        db.session.execute(update(AutoTopupRun).where(
            AutoTopupRun.account_id == account_id, AutoTopupRun.mode == mode, AutoTopupRun.status == "queued")
            .values(status="skipped", reason="disabled", updated_at=utcnow())
            .execution_options(synchronize_session=False))
        db.session.execute(delete(AutoTopup).where(AutoTopup.id == rule.id))
        _set_threshold(account_id, mode, None)
        audit.record(account_id, None, "autotopup.delete", mode, before={
            "threshold_micros": rule.threshold_micros, "amount_micros": rule.amount_micros,
            "monthly_cap_micros": rule.monthly_cap_micros})


def _month_micros(account_id: str, mode: str, exclude: int | None = None) -> int:
    start, _ = billing_period()
    stmt = select(func.coalesce(func.sum(AutoTopupRun.amount_micros), 0)).where(
        AutoTopupRun.account_id == account_id, AutoTopupRun.mode == mode,
        AutoTopupRun.status.in_(COUNTED), AutoTopupRun.created_at >= start)
    if exclude is not None:
        stmt = stmt.where(AutoTopupRun.id != exclude)
    return int(db.session.execute(stmt).scalar())


# --- runs ------------------------------------------------------------------------------

def _enqueue(run_id: int) -> None:
    from app.tasks import enqueue

    enqueue("app.tasks.billing.run_autotopup", run_id)


def start_due(limit: int = START_BATCH) -> int:
    """Enqueue every due run: queued and due, or processing with its lease over (its worker
    died). Scheduled every 5 s; each run is claimed by ``run``, so enqueuing twice is harmless."""
    now = utcnow()
    ids = db.session.execute(select(AutoTopupRun.id).where(
        AutoTopupRun.status.in_(OPEN), AutoTopupRun.due_at <= now,
        or_(AutoTopupRun.status == "queued", AutoTopupRun.lease_until <= now))
        .order_by(AutoTopupRun.due_at).limit(limit)).scalars().all()
    end_reads()  # end the read before jobs (inline without Redis) open their own
    for run_id in ids:
        _enqueue(run_id)
    return len(ids)


def _claim(run_id: int) -> AutoTopupRun | None:
    """Take the run (conditional UPDATE with a lease); None when it is not due or taken."""
    now = utcnow()
    res = db.session.execute(update(AutoTopupRun).where(
        AutoTopupRun.id == run_id, AutoTopupRun.due_at <= now,
        or_(AutoTopupRun.status == "queued",
            and_(AutoTopupRun.status == "processing", AutoTopupRun.lease_until <= now)))
        .values(status="processing", attempts=AutoTopupRun.attempts + 1, lease_until=now + LEASE, updated_at=now)
        .execution_options(synchronize_session=False))
    if res.rowcount != 1:
        return None
    return db.session.get(AutoTopupRun, run_id, populate_existing=True)


def _why_not(run: AutoTopupRun, rule: AutoTopup | None) -> str | None:
    """Why this run must not charge (None: it may)."""
    if rule is None or not rule.enabled:
        return "disabled"
    if ledger.cached_balance(run.account_id, run.mode) >= rule.threshold_micros:
        return "above_threshold"
    if _month_micros(run.account_id, run.mode, exclude=run.id) + rule.amount_micros > rule.monthly_cap_micros:
        return "cap_reached"
    return None


def _prepare(run_id: int) -> tuple[str | None, dict | None]:
    """Claim the run and give it its payment (one per run). Returns (payment id, charge
    details) to charge, (payment id, None) when the payment is already final, or
    (None, None) when there is nothing to do."""
    with unit_of_work():
        run = _claim(run_id)
        if run is None:
            return None, None
        if run.payment_id is not None:  # a retry after a crash: the same payment
            payment = db.session.get(Payment, run.payment_id)
            if payment.status != "pending":
                return payment.id, None
            profile = payments.saved_method(run.account_id, run.mode)
            pm_id = (payment.meta or {}).get("payment_method")
            return payment.id, {"customer": profile.customer_id if profile else None,
                                "pm": MethodInfo(pm_id, "card", None, None)}
        rule = _rule(run.account_id, run.mode, lock=True)
        reason = _why_not(run, rule)
        profile = None
        if reason is None:
            try:
                profile = _card(run.account_id, run.mode)
            except DomainError as exc:
                reason = f"no_method: {exc.message}"
        if reason is not None:
            _close(run, "skipped", reason)
            if reason == "cap_reached":
                _tell_owner(run, "Auto top-up paused: monthly cap reached",
                            f"Your balance went under the auto top-up threshold, but the top-ups this month "
                            f"already reach the monthly cap of {_usd(rule.monthly_cap_micros)}. Nothing was charged. "
                            f"Raise the cap (PUT /api/pay/auto-topup) or top up by hand.")
            elif reason.startswith("no_method"):
                _tell_owner(run, "Auto top-up could not run: no saved card",
                            f"Your balance went under the auto top-up threshold, but there is no saved card to "
                            f"charge (it was removed, or the default is not a card). Nothing was charged. "
                            f"Save a card (POST /api/pay/method, or make a saved one the default) or top up by "
                            f"hand.")
            return None, None
        payment = Payment(id=new_id("pay"), account_id=run.account_id, method="card", kind="charge",
                          processor=for_mode(run.mode).name, mode=run.mode, amount_micros=rule.amount_micros,
                          status="pending", product=PRODUCT,
                          meta={"payment_method": profile.payment_method_id, "auto_topup_run": run.id})
        db.session.add(payment)
        run.payment_id, run.amount_micros = payment.id, rule.amount_micros
        return payment.id, {"customer": profile.customer_id,
                            "pm": MethodInfo(profile.payment_method_id, profile.payment_method_type,
                                             profile.brand, profile.last4)}


def run(run_id: int) -> str:
    """Charge one run (the job). Returns the run's resulting status, or ``skipped`` when it
    was not due or another worker has it."""
    payment_id, charge = _prepare(run_id)
    if payment_id is None:
        row = db.session.get(AutoTopupRun, run_id)
        return row.status if row is not None and row.status != "processing" else "skipped"
    result = None
    if charge is not None:
        payment = db.session.get(Payment, payment_id)
        try:
            result = for_mode(payment.mode).charge(payment, charge["customer"], charge["pm"])
        except ServiceUnavailable as exc:  # processor unavailable: the lease runs out and it is retried
            log.warning("auto top-up run %s: processor call failed (%s); retried after the lease", run_id, exc)
            return "processing"
        except DomainError as exc:  # the processor refused the method: a failed attempt, like a decline
            result = ChargeResult(None, "failed", exc.code, exc.message)
    return _book(run_id, payment_id, result)


def _book(run_id: int, payment_id: str, result) -> str:
    """The processor's answer and the run's outcome, in ONE unit of work."""
    with unit_of_work():
        run = db.session.get(AutoTopupRun, run_id, with_for_update=True, populate_existing=True)
        if run.status != "processing" or run.payment_id != payment_id:
            return run.status  # another worker booked it
        payment = db.session.get(Payment, payment_id, with_for_update=True, populate_existing=True)
        code = message = None
        if result is not None:
            code, message = result.failure_code, result.failure_message
            if payment.provider_id is None and result.provider_id:
                payment.provider_id = payment.payment_intent = result.provider_id
                db.session.flush()
            if result.status == "succeeded":
                payments.credit_payment(payment)
            elif result.status == "failed":
                payments.finish_payment(payment, "failed", code, message)
            db.session.refresh(payment)
        return _settle(run, payment, code or payment.failure_code, message or payment.failure_message)


def payment_final(payment: Payment) -> str | None:
    """Close the ``pending`` run of an auto top-up payment the processor decided later (its
    webhook, in the webhook's unit of work), as ``_book`` would have: credited → succeeded,
    failed or canceled → a failed attempt (counted, retried, the rule disabled after
    ``AUTOTOPUP_MAX_FAILURES``). Without it the run stayed ``pending`` for ever and a failed
    payment kept counting against the monthly cap. None: not an auto top-up's pending run."""
    run_id = (payment.meta or {}).get("auto_topup_run")
    if run_id is None:
        return None
    run = db.session.execute(select(AutoTopupRun).where(
        AutoTopupRun.id == run_id, AutoTopupRun.payment_id == payment.id, AutoTopupRun.status == "pending")
        .with_for_update().execution_options(populate_existing=True)).scalar_one_or_none()
    if run is None:
        return None  # the job books it (still processing), or it is closed already
    db.session.refresh(payment)
    if payment.status == "pending":
        return run.status
    return _settle(run, payment, payment.failure_code, payment.failure_message)


def _settle(run: AutoTopupRun, payment: Payment, code: str | None, message: str | None) -> str:
    rule = _rule(run.account_id, run.mode, lock=True)
    if payment.status in payments.CREDITED:
        _close(run, "succeeded")
        if rule is not None:
            rule.failures = 0
        return run.status
    if payment.status == "pending":
        _close(run, "pending", "the processor is still working; its webhook completes the payment")
        return run.status
    status = "requires_action" if code == "authentication_required" else "failed"
    _close(run, status, f"{code or payment.status}: {message or 'the payment did not complete'}"[:300])
    if rule is None or not rule.enabled:
        return run.status
    rule.failures += 1
    cfg = current_app.config
    if rule.failures >= cfg["AUTOTOPUP_MAX_FAILURES"]:
        rule.enabled, rule.disabled_reason = False, f"{rule.failures} failed attempts; last: {run.reason}"[:300]
        _set_threshold(run.account_id, run.mode, None)
        _tell_owner(run, "Auto top-up disabled",
                    f"Auto top-up of {_usd(rule.amount_micros)} failed {rule.failures} times in a row "
                    f"(last: {message or code}). It is now off: update your card (POST /api/pay/method) and "
                    f"turn it on again (PUT /api/pay/auto-topup).")
        return run.status
    if status == "requires_action":
        _tell_owner(run, "Auto top-up needs you to confirm the payment",
                    f"Your bank asks you to authenticate the auto top-up of {_usd(rule.amount_micros)} "
                    f"(3-D Secure), which cannot happen off-session. Top up once with a checkout "
                    f"(POST /api/pay/checkout) to confirm the card.")
    retry = timedelta(seconds=cfg["AUTOTOPUP_RETRY_SECONDS"] * 2 ** (rule.failures - 1))
    db.session.flush()  # the failed run is closed before its retry opens (one open run)
    now = utcnow()
    # ON CONFLICT: a run closed by its payment's webhook (``payment_final``) may find another
    # one open already (the balance crossed again meanwhile); that one is the retry
    db.session.execute(pg_insert(AutoTopupRun).values(
        account_id=run.account_id, mode=run.mode, status="queued",
        balance_micros=ledger.cached_balance(run.account_id, run.mode), attempts=0,
        due_at=now + retry, created_at=now, updated_at=now).on_conflict_do_nothing())
    return run.status


def _close(run: AutoTopupRun, status: str, reason: str | None = None) -> None:
    run.status, run.reason, run.lease_until, run.updated_at = status, reason, None, utcnow()


def _usd(micros: int) -> str:
    cents = micros // ledger.MICROS_PER_CENT
    return f"${cents // 100}.{cents % 100:02d}"


def _tell_owner(run: AutoTopupRun, subject: str, text: str) -> None:
    """E-mail the account's billing contacts (``orgs.billing_contacts``) through the outbox, in the caller's
    unit of work: sent once the outcome commits."""
    emails = orgs.billing_contacts(run.account_id)
    if not emails:
        log.warning("auto top-up run %s: no e-mail to tell (%s)", run.id, subject)
        return
    mode = " (test mode)" if run.mode == "test" else ""
    for email in emails:
        outbox.add_email(email, subject + mode, text, account_id=run.account_id,
                         source=f"auto_topup_run:{run.id}")

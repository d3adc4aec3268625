"""``flask money reconcile``: the ledger against every external book. Read-only; returns a
JSON-able report whose ``problems`` list is empty when everything agrees:

* ``ledger``: the ledger invariants (``ledger.check``);
* ``external_credit_unposted``: a credit in the book of outside money (``external_credits``)
  without its ledger transaction, or whose customer legs do not add up to its amount;
* ``payment_not_in_book``: a succeeded payment (Stripe, sandbox, chain, x402) with no
  external credit and no ledger posting;
* ``stripe_event_mismatch``: a processor event whose amount did not match its payment;
* ``x402_stuck`` / ``x402_unbooked``: an authorization ``reserved``, or ``settled`` but not
  booked, longer than ``X402_RECONCILE_AFTER_SECONDS`` (the reconciliation job did not
  resolve it);
* ``chat_hold_stuck`` / ``chat_hold_mismatch``: a hold silent for longer than
  ``CHAT_HOLD_TTL_SECONDS``, or ``hold:chat`` not equal to the holds still open;
* ``payout_unposted`` / ``payout_posting_orphan`` / ``payout_stuck``: a paid payout without
  its one ledger posting ``payout:<id>`` of its amount, a payout posting without a paid
  payout, or a payout left ``sending`` longer than ``PAYOUT_RECOVER_AFTER_SECONDS`` (the
  recovery did not run);
* ``payout_chain_mismatch`` / ``payout_chain_unverified``: a USDC payout whose transaction
  the chain does not show as the ledger does (booked ``paid`` without a succeeded receipt
  of its hash showing its USDC ``Transfer``, or ``failed`` while its last transaction made
  it), or whose chain could
  not be asked; payouts updated in the last ``CHAIN_CHECK_DAYS`` days are compared.
"""
from __future__ import annotations

from datetime import timedelta

from flask import current_app
from sqlalchemy import func, select

from app.extensions import db
from app.models import (ChatCompletion, ExternalCredit, LedgerEntry, LedgerTransaction, Payment, PaymentEvent,
                        Payout, X402Authorization)
from app.models.base import utcnow
from app.errors import DomainError
from app.services.billing import chains, usdc_payouts
from app.services.money import outside
from app.services.money import holds, ledger
from app.services.billing.payments import CREDITED


def _problem(out: list, check: str, detail: str, **facts) -> None:
    out.append({"check": check, "detail": detail, **facts})


def _external_credits(out: list) -> int:
    positive = (select(LedgerTransaction.ref, func.sum(LedgerEntry.amount_micros).label("credited"))
                .join(LedgerEntry, LedgerEntry.txn_id == LedgerTransaction.id)
                .where(LedgerEntry.amount_micros > 0, LedgerEntry.ledger_account.like("acct%"))
                .group_by(LedgerTransaction.ref).subquery())
    rows = db.session.execute(select(ExternalCredit.ref, ExternalCredit.ledger_ref, ExternalCredit.amount_micros,
                                     positive.c.credited)
                              .outerjoin(positive, positive.c.ref == ExternalCredit.ledger_ref)).all()
    for ref, ledger_ref, amount, credited in rows:
        if credited is None or int(credited) != int(amount):
            _problem(out, "external_credit_unposted", f"{ref}: book says {amount}, ledger {ledger_ref} credits "
                                                      f"{credited}", ref=ref)
    return len(rows)


def _payments(out: list) -> int:
    in_book = set(db.session.execute(select(ExternalCredit.payment_id).where(
        ExternalCredit.payment_id.is_not(None))).scalars())
    rows = db.session.execute(select(Payment.id, Payment.provider_id, Payment.method).where(
        Payment.status.in_(CREDITED))).all()
    legacy = [(pid, prov, method) for pid, prov, method in rows if pid not in in_book]
    refs = {f"pay:{pid}" for pid, _, _ in legacy} | {f"usdc:{prov}" for _, prov, _ in legacy if prov} \
        | {prov for _, prov, _ in legacy if prov and prov.startswith("x402:")}
    posted = set(db.session.execute(select(LedgerTransaction.ref).where(LedgerTransaction.ref.in_(refs)))
                 .scalars()) if refs else set()
    for pid, prov, method in legacy:
        if not ({f"pay:{pid}", f"usdc:{prov}", prov} & posted):
            _problem(out, "payment_not_in_book", f"payment {pid} ({method}) succeeded but was never credited",
                     payment_id=pid)
    return len(rows)


def _events(out: list) -> int:
    rows = db.session.execute(select(PaymentEvent.event_id, PaymentEvent.payment_id).where(
        PaymentEvent.outcome == "amount_mismatch")).all()
    for event_id, payment_id in rows:
        _problem(out, "stripe_event_mismatch", f"event {event_id}: amount differs from payment {payment_id}",
                 event_id=event_id)
    return db.session.execute(select(func.count(PaymentEvent.id))).scalar_one()


def _x402(out: list) -> int:
    cutoff = utcnow() - timedelta(seconds=int(current_app.config["X402_RECONCILE_AFTER_SECONDS"]))
    rows = db.session.execute(select(X402Authorization).where(
        X402Authorization.status.in_(("reserved", "settled")), X402Authorization.created_at < cutoff)).scalars()
    for row in rows:
        if row.status == "reserved":
            _problem(out, "x402_stuck", f"authorization {row.id} reserved since {row.created_at.isoformat()}",
                     authorization=row.id)
        elif not outside.credited(outside.x402_ref(row.auth_key)) and not ledger.already_posted(
                f"x402:{row.auth_key}"):
            _problem(out, "x402_unbooked", f"authorization {row.id} settled but not booked", authorization=row.id)
    return db.session.execute(select(func.count(X402Authorization.id))).scalar_one()


def _holds(out: list) -> int:
    cutoff = utcnow() - timedelta(seconds=float(current_app.config["CHAT_HOLD_TTL_SECONDS"]))
    for cid in db.session.execute(select(ChatCompletion.id).where(holds.stale(cutoff))).scalars():
        _problem(out, "chat_hold_stuck", f"completion {cid} holds money with no live request", completion=cid)
    open_micros = int(db.session.execute(select(func.coalesce(func.sum(ChatCompletion.hold_micros), 0)).where(
        ChatCompletion.status == "held")).scalar_one())
    on_hold = ledger.balance(holds.HOLD)
    if on_hold != open_micros:
        _problem(out, "chat_hold_mismatch", f"{holds.HOLD} is {on_hold}, open holds total {open_micros}")
    return open_micros


def _payouts(out: list) -> int:
    posted = dict(db.session.execute(
        select(LedgerTransaction.ref, func.sum(LedgerEntry.amount_micros))
        .join(LedgerEntry, LedgerEntry.txn_id == LedgerTransaction.id)
        .where(LedgerTransaction.kind == "payout", LedgerEntry.amount_micros > 0)
        .group_by(LedgerTransaction.ref)).all())
    rows = db.session.execute(select(Payout.id, Payout.status, Payout.amount_micros, Payout.sent_at)).all()
    cutoff = utcnow() - timedelta(seconds=int(current_app.config["PAYOUT_RECOVER_AFTER_SECONDS"]))
    paid = set()
    for pid, status, amount, sent_at in rows:
        ref = f"payout:{pid}"
        if status == "paid":
            paid.add(ref)
            if int(posted.get(ref, 0)) != int(amount):
                _problem(out, "payout_unposted", f"payout {pid} paid {amount}, ledger {ref} moved "
                                                 f"{posted.get(ref)}", payout=pid)
        elif status == "sending" and sent_at is not None and sent_at < cutoff:
            _problem(out, "payout_stuck", f"payout {pid} sending since {sent_at.isoformat()}", payout=pid)
    for ref in set(posted) - paid:
        _problem(out, "payout_posting_orphan", f"ledger {ref} has no paid payout", ref=ref)
    _usdc_payouts(out)
    return len(rows)


CHAIN_CHECK_DAYS = 62


def _usdc_payouts(out: list) -> None:
    """USDC payouts against the chain: booked paid ⇔ its transaction succeeded."""
    rows = db.session.execute(select(Payout.id, Payout.status, Payout.chain, Payout.tx_hash, Payout.processor_ref,
                                     Payout.tx_from, Payout.target, Payout.amount_micros)
                              .where(Payout.kind == "usdc", Payout.status.in_(("paid", "failed")),
                                     Payout.tx_hash.is_not(None),
                                     Payout.updated_at >= utcnow() - timedelta(days=CHAIN_CHECK_DAYS))).all()
    for pid, status, chain, tx, ref, sender, to, amount in rows:
        try:
            ok = usdc_payouts.moved(chain, chains.receipt(chain, tx), sender, to, amount)
        except DomainError as exc:
            _problem(out, "payout_chain_unverified", f"payout {pid}: {exc.message}", payout=pid)
            continue
        if status == "paid" and (not ok or ref != tx):
            _problem(out, "payout_chain_mismatch", f"payout {pid} booked paid, transaction {tx} on {chain} did "
                                                   f"not succeed", payout=pid)
        elif status == "failed" and ok:
            _problem(out, "payout_chain_mismatch", f"payout {pid} failed (still owed), transaction {tx} on "
                                                   f"{chain} succeeded", payout=pid)


def reconcile() -> dict:
    """The report: ``ok``, ``problems`` and what was compared."""
    problems: list[dict] = []
    for v in ledger.check():
        _problem(problems, "ledger", v.detail, rule=v.rule)
    checked = {"external_credits": _external_credits(problems), "payments": _payments(problems),
               "payment_events": _events(problems), "x402_authorizations": _x402(problems),
               "open_hold_micros": _holds(problems),
               "payouts": _payouts(problems)}
    return {"ok": not problems, "checked_at": utcnow().isoformat(), "checked": checked, "problems": problems}

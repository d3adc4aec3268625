"""x402 reconciliation: no authorization stays in doubt, no payer loses money.

Run by the schedule (``x402-reconcile``) and by ``flask money reconcile``:

* a ``settled`` authorization never booked (the process died between settlement and the
  call's unit of work) is booked as account credit;
* a ``reserved`` authorization older than ``X402_RECONCILE_AFTER_SECONDS`` (the facilitator
  never answered ``/settle``, or the process died before recording its answer) is resolved:
  the chain, when an RPC endpoint is configured, says whether the EIP-3009 authorization was
  used (``authorizationState``); otherwise, or when it was not used yet, the facilitator is
  asked to settle it again — with the requirement of the request it was presented for
  (its stored ``resource_url``). Used or settled → booked as account credit (the call was
  refused, the money stays as balance); a facilitator's "nonce already used" (most likely
  the lost settlement itself: the money moved) keeps it ``reserved`` until the chain can
  tell; refused otherwise, expired unused, or a sandbox (test-mode)
  authorization (kept without payload: nothing moved, nothing may ever submit it) →
  ``released``. A facilitator that does not answer, or none configured any more, leaves a
  live one ``reserved`` for the next run (``flask money reconcile`` reports it as stuck).

Booking goes through the book of outside money (``outside``): if the deposit watcher
credited the same transfer first, booking finds its reference and changes nothing.
"""
from __future__ import annotations

import logging
import time
from datetime import timedelta

from flask import current_app
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from app.errors import ServiceUnavailable
from app.extensions import db
from app.models import LedgerTransaction, X402Authorization
from app.models.base import utcnow
from app.services.billing import chains
from app.services.money import outside
from app.services.billing.x402.settlement import X402Payment, _facilitator, book
from app.services.platform.uow import unit_of_work

log = logging.getLogger(__name__)


def _payment(row: X402Authorization, transaction: str | None = None) -> X402Payment:
    return X402Payment(auth_id=row.id, auth_key=row.auth_key, account_id=row.account_id,
                       version=int((row.payload or {}).get("x402Version") or 2), network=row.network,
                       payer=row.payer, value_atomic=int(row.value_atomic),
                       sandbox=(transaction or row.transaction or "").startswith("sandbox:"),
                       transaction=transaction or row.transaction)


def _book(row: X402Authorization, transaction: str | None = None) -> str:
    """Book the authorization as account credit (one unit of work); ``already`` when the
    book of outside money holds it (booked before, or credited by the deposit watcher)."""
    pay = _payment(row, transaction)
    try:
        with unit_of_work():
            db.session.execute(update(X402Authorization).where(X402Authorization.id == row.id)
                               .values(status="settled", transaction=pay.transaction,
                                       settled_at=row.settled_at or utcnow())
                               .execution_options(synchronize_session=False))
            if outside.credited(outside.x402_ref(row.auth_key)):
                return "already"
            book(pay)
    except IntegrityError:
        return "already"
    return "booked"


def _release(row: X402Authorization, reason: str) -> str:
    with unit_of_work():
        db.session.execute(update(X402Authorization).where(X402Authorization.id == row.id,
                                                           X402Authorization.status == "reserved")
                           .values(status="released", error=reason[:200])
                           .execution_options(synchronize_session=False))
    return "released"


def _resolve(row: X402Authorization) -> str:
    """One reserved authorization: booked, released, or left (``pending``)."""
    if not row.payload:  # a sandbox (test-mode) reservation: never submitted anywhere
        return _release(row, "sandbox authorization never booked: nothing was settled")
    nonce = row.auth_key.rsplit(":", 1)[1]
    if chains.rpc_url(row.network):
        try:
            if chains.authorization_state(row.network, row.payer, nonce):
                return _book(row)
            if row.valid_before is not None and row.valid_before <= int(time.time()):
                return _release(row, "expired unused on chain")
        except ServiceUnavailable as exc:
            log.warning("x402 reconcile %s: chain unavailable: %s", row.id, exc.message)
    if not current_app.config.get("X402_FACILITATOR_URL"):  # a live one: only its facilitator can tell
        return "pending"
    facts = {"data": row.payload, "version": int(row.payload.get("x402Version") or 2), "chain": row.network}
    # the requirement of the request that was presented (v1 carries the resource URL)
    settled = _facilitator("/settle", facts, int(row.price_micros or row.value_atomic),
                           row.resource_url or current_app.config["BASE_URL"], row.description or "Module call")
    if settled is None:
        return "pending"
    if settled.success:
        return _book(row, settled.transaction.lower() or None)
    from x402.mechanisms.evm.constants import ERR_NONCE_ALREADY_USED  # loads web3: payload.verify

    if settled.error_reason == ERR_NONCE_ALREADY_USED:
        # the authorization was used: most likely by the settlement whose answer was lost,
        # i.e. the payer's USDC has moved. Releasing would lose it; only the chain can tell
        # (configure an RPC endpoint), so it stays reserved and is reported as stuck.
        log.error("x402 reconcile %s: the facilitator says the nonce is already used; kept reserved "
                  "until the chain confirms (RPC_URLS)", row.id)
        return "pending"
    return _release(row, "facilitator refused on reconciliation: " + str(settled.error_reason or "?"))


def reconcile(older_than_seconds: int | None = None) -> dict:
    """Book settled-unbooked authorizations and resolve stale reserved ones; counts."""
    age = current_app.config["X402_RECONCILE_AFTER_SECONDS"] if older_than_seconds is None else older_than_seconds
    cutoff = utcnow() - timedelta(seconds=int(age))
    with unit_of_work():  # a read, ended before any network call
        rows = db.session.execute(select(X402Authorization).where(
            X402Authorization.status.in_(("settled", "reserved")), X402Authorization.created_at < cutoff)
            .order_by(X402Authorization.created_at).limit(500)).scalars().all()
        booked_refs = set(db.session.execute(select(LedgerTransaction.ref).where(
            LedgerTransaction.ref.in_([f"x402:{r.auth_key}" for r in rows]))).scalars())
        db.session.expunge_all()
    out = {"booked": 0, "released": 0, "pending": 0, "already": 0}
    for row in rows:
        if row.status == "settled":
            if f"x402:{row.auth_key}" not in booked_refs:
                out[_book(row)] += 1
            continue
        out[_resolve(row)] += 1
    return out


def book_orphans(older_than_seconds: int = 120) -> int:
    """Settled authorizations never booked, booked as credit; how many (``reconcile``)."""
    return reconcile(older_than_seconds)["booked"]

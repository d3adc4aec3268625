"""Payouts: module owners' settled earnings paid out as money (docs/payments.md#payouts).

An owner (agent account, account or organisation) may connect a payout destination: a
Stripe Connect account (``stripe_connect``, paid by the processor's Transfers API; the
sandbox simulates it) or a USDC address on a supported chain (``usdc``). Without one the
monthly settlement credits the balance, as before. With one, settlement credits
``payable:<account>`` (``money.settlement``) and this module pays it out:

1. ``create_due``: an account whose ``payable:`` reaches ``PAYOUT_MINIMUM_CENTS`` (whole
   cents) and has no open payout gets a ``pending`` payout of that amount (one open payout
   per account: a unique partial index). Below the minimum nothing is paid; it carries over.
2. ``_send``: the payout is claimed (``sending``, attempt n, committed) before the processor
   is asked, with the idempotency key ``payout:<id>:<n>``; the answer is booked in its own
   unit of work: paid → one posting ``payable → external:payout_<rail>``, ref
   ``payout:<id>`` (``funding.pay_out``), the transfer id in ``processor_ref`` (unique);
   failed → ``failed``, still owed, retried after ``PAYOUT_RETRY_SECONDS × 2^(n-1)`` with
   attempt n+1 (a new key). USDC (``usdc_payouts``, with ``PAYOUT_WALLET_KEY``): the
   claim also signs the attempt's one ``transfer`` transaction (nonce, hash, raw bytes on
   the row); the chain is then sent it and read: confirmed → paid (the hash in
   ``processor_ref``), reverted or its nonce taken → failed, else still ``sending``.
3. Recovery: a payout left ``sending`` longer than ``PAYOUT_RECOVER_AFTER_SECONDS`` (its
   worker died between the processor's answer and the booking, or the processor never
   answered, or its USDC transaction was not confirmed yet) is asked again with the SAME
   key (USDC: the same signed transaction, found by its hash): the processor answers the
   same transfer, which is booked once. Nothing is paid twice; nothing owed is lost.

``run`` (the ``payouts`` job, also after each settlement run, and ``flask payouts run``)
does 1 then 2/3 for every due payout. ``request_payout`` (``POST /api/payouts``) does it
for one account now.
"""
from __future__ import annotations

import logging
import re
from datetime import timedelta

from flask import current_app
from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError

from app.errors import Conflict, DomainError, InvalidRequest, NotFound
from app.extensions import db
from app.ids import new_id
from app.models import Payout, PayoutDestination
from app.models.base import utcnow
from app.services.accounts import keys
from app.services.billing import chains, processors, usdc_payouts
from app.services.money import funding, ledger
from app.services.orgs import audit
from app.services.platform.uow import end_reads, unit_of_work

log = logging.getLogger(__name__)

KINDS = ("stripe_connect", "usdc")
OPEN = ("pending", "sending", "failed")
_CONNECT_RE = re.compile(r"^acct_[A-Za-z0-9]{6,64}$")


class NoPayoutDestination(Conflict):
    code, message = "no_payout_destination", "No payout destination is connected."
    description = "Connect a payout destination first (PUT /api/payouts/destination/stripe_connect or /usdc)."


class BelowPayoutMinimum(Conflict):
    code, message = "below_payout_minimum", "What is owed is below the payout minimum."
    description = "Settled earnings carry over until they reach PAYOUT_MINIMUM_CENTS."


class PayoutInFlight(Conflict):
    code, message = "payout_in_flight", "A payout is being sent."
    description = "A payout of this account is being sent; try again once it is paid or failed."


class PayoutRailUnavailable(DomainError):
    status, code, message = 409, "payout_rail_unavailable", "This payout rail is not available here."
    description = "USDC payouts are not available on this deployment (no payout wallet)."


def minimum_micros() -> int:
    return ledger.cents_to_micros(int(current_app.config["PAYOUT_MINIMUM_CENTS"]))


# --- destinations ---------------------------------------------------------------------

def _check(kind: str, target: str, chain: str | None) -> tuple[str, str | None]:
    """The normalized (target, chain) of a destination; 400 when malformed."""
    if kind == "stripe_connect":
        if chain is not None:
            raise InvalidRequest("chain: only for kind usdc.")
        if not _CONNECT_RE.match(target or ""):
            raise InvalidRequest("account: a Stripe Connect account id (acct_ and 6 to 64 letters or digits).")
        return target, None
    if kind == "usdc":
        if chain not in chains.EVM_CHAINS:
            raise InvalidRequest(f"chain: one of {', '.join(chains.EVM_CHAINS)}.")
        address, _ = chains.normalize_address(chain, target)
        if usdc_payouts.wallet() is None:
            # Sending USDC needs the operator's payout wallet (PAYOUT_WALLET_KEY): refused as
            # a state of this deployment, not as input.
            raise PayoutRailUnavailable("USDC payouts are not available on this deployment (no payout "
                                        "wallet); connect a Stripe account (kind stripe_connect).")
        return address, chain
    raise InvalidRequest(f"kind: one of {', '.join(KINDS)}.")


def destination_view(dest: PayoutDestination | None) -> dict | None:
    if dest is None:
        return None
    return {"kind": dest.kind, "account" if dest.kind == "stripe_connect" else "address": dest.target,
            **({"chain": dest.chain} if dest.chain else {}), "updated_at": dest.updated_at}


def _destination(account_id: str) -> PayoutDestination | None:
    return db.session.execute(select(PayoutDestination).where(
        PayoutDestination.account_id == account_id)).scalar_one_or_none()


def set_destination(account_id: str, kind: str, target: str, chain: str | None, *,
                    acting_key_id: str | None = None) -> dict:
    """Connect (or replace) the account's payout destination. From the next settlement its
    earnings are paid out instead of credited to the balance; an open payout not yet being
    sent goes to the new destination, at the next run (a failed one without waiting for
    its retry delay). Set by a key (``acting_key_id``; None: the console's owner), that key
    may have no spend limit (403 ``beyond_own_limits``: it would decide where money goes)."""
    keys.require_unlimited(acting_key_id, "Changing the payout destination")
    target, chain = _check(kind, target, chain)
    with unit_of_work():
        dest = _destination(account_id)
        audit.record(account_id, None, "payout_destination.set", target,
                     before=dest and {"kind": dest.kind, "target": dest.target, "chain": dest.chain},
                     after={"kind": kind, "chain": chain})
        if dest is None:
            dest = PayoutDestination(account_id=account_id, kind=kind, target=target, chain=chain,
                                     created_at=utcnow(), updated_at=utcnow())
            db.session.add(dest)
        else:
            dest.kind, dest.target, dest.chain, dest.updated_at = kind, target, chain, utcnow()
        db.session.execute(update(Payout).where(Payout.account_id == account_id, Payout.status.in_(
            ("pending", "failed"))).values(kind=kind, target=target, chain=chain, next_attempt_at=utcnow(),
                                           updated_at=utcnow()))
        db.session.flush()
        return destination_view(dest)


def get_destination(account_id: str) -> dict:
    dest = _destination(account_id)
    if dest is None:
        raise NotFound("No payout destination: earnings are kept as balance.")
    return destination_view(dest)


def remove_destination(account_id: str) -> dict:
    """Keep earnings as balance again: the destination is removed, an open payout not being
    sent is canceled, and what is owed moves to the balance (one posting). 409 while a
    payout is being sent. Idempotent, as deleting an alert: once removed, removing again moves
    nothing and answers the first answer (kept in its ``payout_destination.remove`` audit
    entry); an account that never had one → 404."""
    with unit_of_work():
        dest = db.session.execute(select(PayoutDestination).where(
            PayoutDestination.account_id == account_id).with_for_update()).scalar_one_or_none()
        if dest is None:
            removed = audit.last_removal(account_id, "payout_destination.remove")
            if removed is None:
                raise NotFound("No payout destination: earnings are kept as balance.")
            return removed.after
        # Every open payout is locked before its status is read: a worker's claim (``_claim``,
        # which locks the row) either committed ``sending`` before (409 here) or waits and then
        # finds it canceled. Locking only the ``sending`` rows let a claim slip in between the
        # check and the cancel: the owed earnings went to the balance and were transferred too.
        open_rows = db.session.execute(select(Payout).where(
            Payout.account_id == account_id, Payout.status.in_(OPEN)).with_for_update()
            .execution_options(populate_existing=True)).scalars().all()
        if any(p.status == "sending" for p in open_rows):
            raise PayoutInFlight("A payout is being sent; remove the destination once it is paid or failed.")
        for p in open_rows:
            p.status, p.updated_at = "canceled", utcnow()
        owed = ledger.balance(ledger.payable(account_id))
        if owed > 0:
            funding.keep_as_balance(account_id, micros=owed, ref=f"payable_to_balance:{new_id('pb')}")
        db.session.delete(dest)
        answer = {"kind": None, "moved_to_balance_cents": ledger.micros_to_cents(owed)}
        audit.record(account_id, None, "payout_destination.remove", dest.target,
                     before={"kind": dest.kind, "chain": dest.chain}, after=answer)
        return answer


# --- reading ----------------------------------------------------------------------------

def owed(account_id: str) -> dict:
    """Settled earnings still owed to the account's payout destination."""
    micros = ledger.balance(ledger.payable(account_id))
    return {"owed_cents": ledger.micros_to_cents(micros), "owed_micros": micros}


def view(p: Payout) -> dict:
    return {"id": p.id, "status": p.status, "amount_cents": ledger.micros_to_cents(p.amount_micros),
            "amount_micros": p.amount_micros, "kind": p.kind, "destination": p.target, "chain": p.chain,
            "attempts": p.attempts, "processor_ref": p.processor_ref, "failure_code": p.failure_code,
            "failure_message": p.failure_message, "next_attempt_at": p.next_attempt_at
            if p.status in ("pending", "failed") else None,
            "created_at": p.created_at, "paid_at": p.paid_at}


def list_payouts(account_id: str, limit: int = 100) -> dict:
    rows = db.session.execute(select(Payout).where(Payout.account_id == account_id)
                              .order_by(Payout.created_at.desc(), Payout.id).limit(limit)).scalars()
    return {"payouts": [view(p) for p in rows], "destination": destination_view(_destination(account_id)),
            "minimum_cents": int(current_app.config["PAYOUT_MINIMUM_CENTS"]), **owed(account_id)}


# --- paying -------------------------------------------------------------------------------

def _create(account_id: str, dest: PayoutDestination) -> Payout | None:
    """A pending payout of what ``account_id`` is owed, in whole cents, when it reaches the
    minimum and no payout is open (joins the caller's unit of work)."""
    micros = ledger.balance(ledger.payable(account_id))
    micros -= micros % ledger.MICROS_PER_CENT
    if micros <= 0 or micros < minimum_micros():
        return None
    now = utcnow()
    p = Payout(id=new_id("po"), account_id=account_id, amount_micros=micros, status="pending",
               kind=dest.kind, target=dest.target, chain=dest.chain, attempts=0, next_attempt_at=now,
               created_at=now, updated_at=now)
    db.session.add(p)
    db.session.flush()  # the unique open-payout index refuses a second one here
    return p


def create_due() -> int:
    """Open a payout for every account with a destination that is owed at least the minimum
    and has none open."""
    with unit_of_work():
        owed_rows = db.session.execute(
            select(PayoutDestination.account_id)
            .where(~select(Payout.id).where(Payout.account_id == PayoutDestination.account_id,
                                            Payout.status.in_(OPEN)).exists())).scalars().all()
    made = 0
    for account_id in owed_rows:
        made += _open_for(account_id) is not None
    return made


def _open_for(account_id: str) -> str | None:
    try:
        with unit_of_work():
            dest = db.session.execute(select(PayoutDestination).where(
                PayoutDestination.account_id == account_id).with_for_update()).scalar_one_or_none()
            if dest is None:
                return None
            p = _create(account_id, dest)
            return p.id if p else None
    except IntegrityError:  # another worker opened it first
        return None


def _claim(payout_id: str, *, recover_before, chain_ready=None) -> tuple[int, Payout] | None:
    """Mark the payout ``sending`` and commit, before the processor is asked: a pending or
    due failed payout starts attempt n+1 (a USDC one signs its one transaction here, with
    ``chain_ready`` = (chain, ``usdc_payouts.Prepared``), stored on the row); a ``sending``
    one older than ``recover_before`` is asked again with its attempt n (the same
    idempotency key, the same signed transaction). None: not due (another worker has it),
    or a USDC attempt without its chain ready."""
    now = utcnow()
    with unit_of_work():
        row = db.session.execute(select(Payout).where(Payout.id == payout_id).with_for_update()).scalar_one_or_none()
        if row is None:
            return None
        if row.status in ("pending", "failed") and row.next_attempt_at <= now:
            if row.kind == "usdc" and (chain_ready is None or chain_ready[0] != row.chain):
                return None
            row.attempts += 1
            row.tx_from = row.tx_nonce = row.tx_hash = row.tx_raw = None
            if row.kind == "usdc":
                usdc_payouts.sign(row, chain_ready[1])
        elif not (row.status == "sending" and row.sent_at is not None and row.sent_at < recover_before):
            return None
        row.status, row.sent_at, row.updated_at = "sending", now, now
        db.session.flush()
        db.session.expunge(row)
        return row.attempts, row


def _ask(p: Payout, attempt: int) -> processors.TransferResult | None:
    """The rail's answer to attempt ``attempt``; None (or ``DomainError``) while unknown."""
    key = f"payout:{p.id}:{attempt}"
    cents = ledger.micros_to_cents(p.amount_micros)
    if p.kind == "stripe_connect":
        return processors.for_mode("live").transfer(cents, p.target, key, {"payout_id": p.id,
                                                                           "account_id": p.account_id})
    if p.kind == "usdc":
        return usdc_payouts.outcome(p)
    raise PayoutRailUnavailable(f"No rail sends {p.kind} payouts.")


def _book(payout_id: str, attempt: int, result: processors.TransferResult) -> str:
    """Book the processor's answer to attempt ``attempt`` once (row lock, status check,
    unique ledger ref)."""
    with unit_of_work():
        p = db.session.execute(select(Payout).where(Payout.id == payout_id).with_for_update()).scalar_one()
        if p.status != "sending" or p.attempts != attempt:
            return p.status  # booked by another worker (or canceled)
        now = utcnow()
        if result.status == "paid":
            p.ledger_txn_id = funding.pay_out(p.id, account_id=p.account_id, micros=p.amount_micros,
                                              rail=p.kind, processor_ref=result.ref)
            p.status, p.processor_ref, p.paid_at = "paid", result.ref, now
            p.failure_code = p.failure_message = None
        else:
            p.status, p.failure_code, p.failure_message = "failed", (result.code or "failed")[:64], \
                (result.message or "")[:300]
            backoff = int(current_app.config["PAYOUT_RETRY_SECONDS"]) * 2 ** min(attempt - 1, 6)
            p.next_attempt_at = now + timedelta(seconds=backoff)
        p.updated_at = now
        return p.status


def send(payout_id: str, *, recover_after: int | None = None) -> str | None:
    """Claim, ask the processor, book. Returns the payout's status afterwards, or None when
    it was not due. An unknown outcome (processor unavailable) leaves it ``sending``; the
    recovery asks again with the same key."""
    wait = int(current_app.config["PAYOUT_RECOVER_AFTER_SECONDS"]) if recover_after is None else recover_after
    try:
        chain_ready = _rail_ready(payout_id)
    except DomainError as exc:  # no live processor / chain here: nothing is sent, nothing claimed
        log.warning("payout %s not sent: %s", payout_id, exc.message)
        return None
    try:
        claimed = _claim(payout_id, recover_before=utcnow() - timedelta(seconds=wait), chain_ready=chain_ready)
    except IntegrityError:  # the nonce was taken meanwhile (unique index): the next run signs again
        log.warning("payout %s not claimed: its USDC nonce was taken", payout_id)
        return None
    if claimed is None:
        return None
    attempt, p = claimed
    end_reads()
    try:
        result = _ask(p, attempt)
    except DomainError as exc:  # unknown outcome: the recovery asks again with the same key
        log.warning("payout %s attempt %s: no answer (%s); left for recovery", payout_id, attempt, exc.message)
        return "sending"
    if result is None:  # a USDC transaction not yet confirmed (or not yet seen): asked again
        log.info("payout %s attempt %s: transaction %s not confirmed yet", payout_id, attempt, p.tx_hash)
        return "sending"
    return _book(payout_id, attempt, result)


def _rail_ready(payout_id: str):
    """Before any claim: the payout's rail must be able to send. Stripe Connect: a live
    processor. USDC: the node's chain id, gas price and the wallet's nonce, as
    (chain, ``usdc_payouts.Prepared``) for signing a new attempt; None without a payout
    wallet (a payout already ``sending`` is still recovered: its transaction is stored).
    ``DomainError`` when it cannot."""
    with unit_of_work():
        row = db.session.execute(select(Payout.kind, Payout.chain).where(Payout.id == payout_id)).first()
    kind, chain = row if row is not None else (None, None)
    if kind != "usdc":
        processors.for_mode("live")
        return None
    if usdc_payouts.wallet() is None:
        return None
    return chain, usdc_payouts.prepare(chain)


def run(now=None) -> dict:
    """The payouts job: open the due payouts, then send every due one (new, failed and due
    again, or left ``sending`` past the recovery delay)."""
    opened = create_due()
    now = now or utcnow()
    recover_before = now - timedelta(seconds=int(current_app.config["PAYOUT_RECOVER_AFTER_SECONDS"]))
    with unit_of_work():
        due = db.session.execute(select(Payout.id).where(or_(
            Payout.status.in_(("pending", "failed")) & (Payout.next_attempt_at <= now),
            (Payout.status == "sending") & (Payout.sent_at < recover_before)))
            .order_by(Payout.next_attempt_at)).scalars().all()
    outcomes: dict[str, int] = {}
    for pid in due:
        status = send(pid)
        outcomes[str(status)] = outcomes.get(str(status), 0) + 1
    return {"opened": opened, "sent": len(due), "outcomes": outcomes}


def request_payout(account_id: str) -> dict:
    """``POST /api/payouts``: pay out now what the account is owed (at least the minimum).
    409 without a destination, below the minimum, or while a payout is being sent; an open
    failed or pending payout is (re)tried at once."""
    with unit_of_work():
        dest = _destination(account_id)
        if dest is None:
            raise NoPayoutDestination(NoPayoutDestination.description)
        open_row = db.session.execute(select(Payout).where(Payout.account_id == account_id,
                                                           Payout.status.in_(OPEN))).scalar_one_or_none()
        if open_row is not None and open_row.status == "sending":
            raise PayoutInFlight("A payout is being sent; it is booked when the processor answers.")
        if open_row is not None:
            open_row.next_attempt_at = utcnow()
            pid = open_row.id
        else:
            pid = None
    if pid is None:
        pid = _open_for(account_id)
        if pid is None:
            raise BelowPayoutMinimum(
                f"Owed {owed(account_id)['owed_cents']} cents; payouts start at "
                f"{current_app.config['PAYOUT_MINIMUM_CENTS']} cents (the rest carries over).")
    send(pid)
    with unit_of_work():
        return view(db.session.get(Payout, pid))

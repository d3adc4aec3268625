"""Funding: money that comes into a balance from outside, goes back out, or moves between
balances. One public function per operation; each joins the caller's unit of work (the
service that owns the payment, the transfer or the grant, and its other rows) and never
commits. Every posting goes through ``ledger.post`` (``gw_post``).

=============================  ==========================================================
``credit``                     outside money in (card, ACH, USDC deposit, x402): the book
                               of outside money (``outside.record``: each outside
                               reference credited once, whichever rail sees it) and the
                               posting ``external:<rail>`` → the payer's balance in its mode
``take_back``                  a refund or a dispute's withdrawal of such a credit: out
                               through its source, from the balance as far as it reaches,
                               the rest booked against a shortfall account
``reinstate``                  a won dispute: the withdrawal undone leg for leg
``transfer``                   between two balances of one mode (an owner funding its agent)
``pay_out``                    settled earnings paid out as money (a payout): from
                               ``payable:<account>`` out through ``external:payout_<rail>``
``keep_as_balance``            settled earnings owed to a payout destination moved to the
                               balance instead (the owner removed the destination)
``grant``                      credit the platform gives (promotional grant, operator
                               adjustment; a negative operator adjustment takes it back,
                               never below zero)
=============================  ==========================================================

Callers: ``billing.payments`` (card/ACH/sandbox credits, refunds, disputes),
``billing.wallets`` (USDC deposits, through ``payments.credit_payment``),
``billing.x402.settlement.book`` (x402), ``agents.funding`` (owner → agent),
``accounts.accounts`` (promotional grant, operator adjustment).
"""
from __future__ import annotations

from app.services.money import ledger, outside


def credit(kind: str, *, source: str, account_id: str, mode: str, micros: int, ref: str,
           outside_ref: str, rail: str, payment_id: str | None = None, meta: dict | None = None,
           outside_meta: dict | None = None) -> int:
    """Credit ``micros`` of outside money to ``account_id``'s balance in ``mode``, once per
    ``outside_ref`` (a second credit of the same money raises ``IntegrityError`` and the
    caller's unit of work rolls back with it). Returns the ledger transaction id."""
    outside.record(outside_ref, rail=rail, account_id=account_id, amount_micros=micros,
                   ledger_ref=ref, mode=mode, payment_id=payment_id, meta=outside_meta)
    return ledger.post(kind, [(source, -micros), (ledger.customer(account_id, mode), micros)],
                       ref=ref, account_id=account_id, meta=meta)


def take_back(kind: str, *, source: str, account_id: str, mode: str, micros: int, shortfall: str,
              ref: str, meta: dict) -> int:
    """Post the reversal of ``micros`` of a credit (a refund, a dispute's withdrawal): the
    money goes back out through ``source``, taken from the balance as far as it reaches;
    credit already spent is booked against ``shortfall``. The balance is read locked, so a
    concurrent spend cannot make the debit fail between the read and the posting. Returns
    what was taken from the balance (``recovered_micros`` in the posting's meta)."""
    recovered = min(ledger.cached_balance(account_id, mode, lock=True), micros)
    legs = [(ledger.customer(account_id, mode), -recovered), (source, micros)]
    if micros - recovered:
        legs.append((shortfall, -(micros - recovered)))
    ledger.post(kind, legs, ref=ref, account_id=account_id,
                meta={**meta, "recovered_micros": recovered, "unrecovered_micros": micros - recovered})
    return recovered


def reinstate(kind: str, *, source: str, account_id: str, mode: str, micros: int, recovered: int,
              shortfall: str, ref: str, meta: dict) -> int:
    """Undo a ``take_back`` of ``micros`` leg for leg: the balance gets back exactly what was
    taken from it (``recovered``), the shortfall account what it absorbed."""
    legs = [(source, -micros), (ledger.customer(account_id, mode), recovered)]
    if micros - recovered:
        legs.append((shortfall, micros - recovered))
    return ledger.post(kind, legs, ref=ref, account_id=account_id, meta=meta)


def transfer(kind: str, *, from_account: str, to_account: str, mode: str, micros: int, ref: str,
             meta: dict) -> int:
    """Move ``micros`` from one balance to another of the same mode; ``from_account`` pays
    (``ledger.InsufficientFunds`` when it cannot, nothing moved)."""
    return ledger.post(kind, [(ledger.customer(from_account, mode), -micros),
                              (ledger.customer(to_account, mode), micros)],
                       ref=ref, account_id=from_account, meta=meta)


def pay_out(payout_id: str, *, account_id: str, micros: int, rail: str, processor_ref: str) -> int:
    """Book a paid payout: ``micros`` of ``account_id``'s settled earnings leave through
    ``external:payout_<rail>``; ref ``payout:<payout id>`` (unique: booked once, whoever
    books it — the sending worker or the recovery). Returns the ledger transaction id."""
    return ledger.post("payout", [(ledger.payable(account_id), -micros),
                                  (ledger.external("payout_" + rail), micros)],
                       ref=f"payout:{payout_id}", account_id=account_id,
                       meta={"payout_id": payout_id, "processor_ref": processor_ref})


def keep_as_balance(account_id: str, *, micros: int, ref: str) -> int:
    """Move ``micros`` of settled earnings owed to a payout destination into the account's
    live balance (the owner chose to keep its earnings as balance)."""
    return ledger.post("payable_to_balance", [(ledger.payable(account_id), -micros),
                                              (ledger.customer(account_id), micros)],
                       ref=ref, account_id=account_id)


def grant(kind: str, *, source: str, account_id: str, micros: int, ref: str | None = None,
          meta: dict | None = None) -> int:
    """Credit the platform gives from ``source`` (``ledger.PROMO``, ``ledger.ADJUST``) to the
    live balance; negative ``micros`` takes it back (never below zero:
    ``ledger.InsufficientFunds``)."""
    return ledger.post(kind, [(source, -micros), (ledger.customer(account_id), micros)],
                       ref=ref, account_id=account_id, meta=meta)

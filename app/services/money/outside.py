"""The one book of outside money (``external_credits``): every credit that came from
outside is written here under a reference shared by all rails, in the caller's unit of
work, next to its ledger posting. A second credit of the same money, whichever rail sees
it (the deposit watcher and x402 settlement, a replayed Stripe event, two processes), hits
the unique ``ref`` and rolls back with its posting.

References (``ref``):

* Stripe / sandbox processor: ``<processor>:<payment intent>`` (else the checkout session or
  the payment id), the same for card and ACH;
* an on-chain USDC transfer: ``chain:<chain>:<tx hash>:<log index>``;
* an EIP-3009 authorization (x402, or any ``transferWithAuthorization`` the watcher sees):
  ``x402:<chain>:<payer>:<nonce>`` — the x402 authorization key, which the watcher also
  derives from the ``AuthorizationUsed`` event of the settlement transaction.
"""
from __future__ import annotations

from sqlalchemy import insert, select

from app.extensions import db
from app.models import ExternalCredit, Payment
from app.models.base import utcnow

_TABLE = ExternalCredit.__table__


def chain_ref(chain: str, tx: str, log_index: int) -> str:
    return f"chain:{chain}:{tx.lower()}:{int(log_index)}"


def x402_ref(auth_key: str) -> str:
    return f"x402:{auth_key.lower()}"


def payment_ref(payment: Payment) -> str:
    """The external reference of a processor payment (Stripe, sandbox; card or ACH)."""
    return f"{payment.processor}:{payment.payment_intent or payment.provider_id or payment.id}"


def record(ref: str, *, rail: str, account_id: str, amount_micros: int, ledger_ref: str,
           mode: str = "live", payment_id: str | None = None, meta: dict | None = None) -> None:
    """Write the credit under ``ref`` in the caller's unit of work (never commits). Raises
    ``sqlalchemy.exc.IntegrityError`` when this outside money was already credited: the
    caller's transaction, with its ledger posting, must roll back."""
    db.session.execute(insert(_TABLE).values(
        ref=ref[:200], rail=rail, account_id=account_id, mode=mode, amount_micros=int(amount_micros),
        ledger_ref=ledger_ref[:200], payment_id=payment_id, meta=meta, created_at=utcnow()))


def credited(ref: str) -> bool:
    return db.session.execute(select(_TABLE.c.id).where(_TABLE.c.ref == ref)).first() is not None

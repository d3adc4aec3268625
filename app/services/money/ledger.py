"""Ledger: the only way money moves. Integer micros, double-entry, append-only.

Conventions (DESIGN §3):

* 1 USD = 1_000_000 micros; 1 cent = 10_000 micros.
* A posting is a list of legs ``(ledger_account_code, amount_micros)`` summing to 0.
* A customer's balance is per MODE, as in Stripe: ``acct:<account_id>`` is the live balance,
  ``acct_test:<account_id>`` the test (sandbox) balance (``customer(account_id, mode)``).
  Their legs also move the cached ``accounts.balance_micros`` / ``accounts.test_balance_micros``
  with a conditional UPDATE (``… WHERE balance + :delta >= 0``) in the same database
  transaction, so no concurrent path can overdraw an account in either mode.
* Postings are written by the money engine's ``gw_post`` (``app/services/money/sql/``),
  which also moves the cached balances; the database itself refuses an unbalanced posting
  (trigger on ``ledger_entries``), a negative cached balance (CHECK) and any UPDATE or
  DELETE of ledger rows (append-only).
* Holder accounts (``acct:``, ``earnings:``, ``revenue:``, ``hold:``) never go negative; source
  accounts (``promo:``, ``external:``, ``adjust:``) are negative by the amount they
  have put into the system.

``post()`` never commits: the calling service owns the transaction.
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import BigInteger, String, bindparam, func, select, text
from sqlalchemy.dialects.postgresql import ARRAY

from app.errors import PaymentRequired
from app.extensions import db
from app.models import Account, LedgerEntry, LedgerTransaction
from app.models.base import JSONType, UTCDateTime, utcnow

MICROS_PER_CENT = 10_000
MICROS_PER_USD = 1_000_000

# Ledger account codes / prefixes.
CUSTOMER = "acct:"
CUSTOMER_TEST = "acct_test:"
EARNINGS = "earnings:"
REVENUE = "revenue:platform"
PROMO = "promo:grants"
ADJUST = "adjust:operator"
EXTERNAL = "external:"
CARRY = "carry:"  # recoverable negative carry-over of an agent's settled earnings
PAYABLE = "payable:"  # settled earnings owed to an owner with a payout destination
HOLDER_PREFIXES = (CUSTOMER, CUSTOMER_TEST, EARNINGS, PAYABLE, "revenue:", "hold:")
MODES = ("live", "test")


def cents_to_micros(cents: int) -> int:
    return int(cents) * MICROS_PER_CENT


def micros_to_cents(micros: int) -> int:
    """Cents shown by the API: floor division (DESIGN §3)."""
    return int(micros) // MICROS_PER_CENT


def usd_precise(micros) -> str:
    """Micros as dollars to the micro-dollar, never rounded, for people to read (the console,
    alert e-mails): whole cents as "$1.23", anything finer with the digits it needs
    (123 -> "$0.000123", 1_234_500 -> "$1.2345"; a $0.0002 scale is not "$0.00")."""
    micros = int(micros or 0)
    sign, micros = ("-" if micros < 0 else ""), abs(micros)
    fraction = f"{micros % 1_000_000:06d}".rstrip("0").ljust(2, "0")
    return f"{sign}${micros // 1_000_000:,}.{fraction}"


def customer(account_id: str, mode: str = "live") -> str:
    """The ledger account of a customer's balance in ``mode`` (live keeps ``acct:<id>``)."""
    if mode == "live":
        return CUSTOMER + account_id
    if mode == "test":
        return CUSTOMER_TEST + account_id
    raise ValueError(f"unknown mode {mode!r}")


def carry(agent_id: str) -> str:
    """Negative carry-over of an agent whose refunds came after its month was settled:
    a receivable (never positive) recovered from the agent's next earnings."""
    return CARRY + agent_id


def cached_balance(account_id: str, mode: str = "live", *, lock: bool = False) -> int:
    """The cached balance of ``account_id`` in ``mode``, in micros. ``lock``: read it with
    ``FOR UPDATE`` (PostgreSQL), so a debit of up to this amount later in the same
    transaction cannot fail on a concurrent spend (the reversals of ``payments``)."""
    col = _ACCOUNTS.c.test_balance_micros if mode == "test" else _ACCOUNTS.c.balance_micros
    stmt = select(col).where(_ACCOUNTS.c.id == account_id)
    return int(db.session.execute(stmt.with_for_update() if lock else stmt).scalar_one())


def earnings(agent_id: str) -> str:
    return EARNINGS + agent_id


def payable(account_id: str) -> str:
    """Settled earnings owed to ``account_id`` and not yet paid out (a holder, never
    negative): settlement credits it instead of the balance when the account has a payout
    destination; each paid payout takes its amount out to ``external:payout_<rail>``."""
    return PAYABLE + account_id


def external(source: str) -> str:
    return EXTERNAL + source


class InsufficientFunds(PaymentRequired):
    """A debit would overdraw a customer balance."""

    message = "Insufficient balance."

    def __init__(self, account_id: str, needed_micros: int):
        super().__init__(f"Insufficient balance on {account_id}.")
        self.account_id = account_id
        self.needed_micros = needed_micros


class UnbalancedPosting(ValueError):
    pass


_ACCOUNTS = Account.__table__

# The engine's one writer of postings (app/services/money/sql/gw_post.sql), soft: an
# uncovered debit answers NULL and leaves the caller's transaction usable.
_POST = text("""
    SELECT gw_post(:kind, :ref, :payer, :actor, :meta, CAST(:codes AS varchar[]),
                   CAST(:amounts AS bigint[]), :created_at, true)
""").bindparams(bindparam("meta", type_=JSONType), bindparam("created_at", type_=UTCDateTime()),
                bindparam("codes", type_=ARRAY(String)), bindparam("amounts", type_=ARRAY(BigInteger)))


def post(kind: str, legs: list[tuple[str, int]], *, ref: str | None = None,
         account_id: str | None = None, meta: dict | None = None,
         created_at=None, actor: str | None = None) -> int:
    """Append one balanced transaction through the engine's ``gw_post``; returns its id.
    Does not commit. ``account_id``: the account that pays (recorded on the transaction);
    ``actor``: who acted (an API key or session id), when known.

    Raises ``InsufficientFunds`` when a customer leg would overdraw (nothing of the posting
    is left, the caller's transaction goes on: it may add funds and post again);
    ``UnbalancedPosting`` for legs that do not sum to zero (checked here for a clear error,
    and by the database); ``sqlalchemy.exc.IntegrityError`` when ``ref`` was already
    posted (the caller decides whether that means "done").
    """
    legs = [(code, int(amount)) for code, amount in legs if int(amount) != 0]
    if not legs:
        raise UnbalancedPosting("a posting needs at least one non-zero leg")
    if sum(a for _, a in legs) != 0:
        raise UnbalancedPosting(f"legs of {kind} do not sum to zero: {legs}")
    txn_id = db.session.execute(_POST, {
        "kind": kind, "ref": ref, "payer": account_id, "actor": actor, "meta": meta,
        "codes": [c for c, _ in legs], "amounts": [a for _, a in legs],
        "created_at": created_at or utcnow()}).scalar()
    if txn_id is None:
        code, amount = min((leg for leg in legs if leg[0].startswith((CUSTOMER, CUSTOMER_TEST))),
                           key=lambda leg: leg[1])
        raise InsufficientFunds(code.partition(":")[2], -amount)
    return txn_id


def already_posted(ref: str) -> bool:
    return db.session.execute(
        select(LedgerTransaction.id).where(LedgerTransaction.ref == ref)
    ).first() is not None


def balance(code: str) -> int:
    """Sum of the entries of one ledger account, in micros."""
    return int(db.session.execute(
        select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0))
        .where(LedgerEntry.ledger_account == code)
    ).scalar_one())


@dataclass
class Violation:
    rule: str
    detail: str

    def as_dict(self) -> dict:
        return {"rule": self.rule, "detail": self.detail}


def check() -> list[Violation]:
    """Verify the ledger invariants; returns the violations (empty list = clean).

    1. every transaction's entries sum to zero (and so do all entries);
    2. every cached account balance (live and test) equals the sum of its ``acct:`` /
       ``acct_test:`` entries;
    3. no holder account (customer, earnings, revenue) is negative; no carry-over is positive.
    """
    s = db.session
    out: list[Violation] = []
    total = s.execute(select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0))).scalar_one()
    if int(total) != 0:
        out.append(Violation("entries_sum_to_zero", f"all entries sum to {total}"))
    unbalanced = s.execute(
        select(LedgerEntry.txn_id, func.sum(LedgerEntry.amount_micros))
        .group_by(LedgerEntry.txn_id)
        .having(func.sum(LedgerEntry.amount_micros) != 0)
        .limit(100)
    ).all()
    for txn_id, amount in unbalanced:
        out.append(Violation("transaction_balanced", f"transaction {txn_id} sums to {amount}"))
    sums = dict(s.execute(
        select(LedgerEntry.ledger_account, func.sum(LedgerEntry.amount_micros))
        .group_by(LedgerEntry.ledger_account)
    ).all())
    for acct_id, live, test in s.execute(select(Account.id, Account.balance_micros, Account.test_balance_micros)):
        for mode, cached in (("live", live), ("test", test)):
            ledger_sum = int(sums.get(customer(acct_id, mode), 0))
            label = acct_id if mode == "live" else f"{acct_id} (test)"
            if ledger_sum != int(cached):
                out.append(Violation(
                    "cached_balance_matches",
                    f"account {label}: cached {cached} != ledger {ledger_sum}",
                ))
            if int(cached) < 0:
                out.append(Violation("no_negative_balance", f"account {label}: {cached}"))
    for code, amount in sums.items():
        if code.startswith(HOLDER_PREFIXES) and int(amount) < 0:
            out.append(Violation("no_negative_balance", f"{code}: {amount}"))
        if code.startswith(CARRY) and int(amount) > 0:
            out.append(Violation("carry_over_not_positive", f"{code}: {amount}"))
    return out

"""Ledger: the only way money moves. Integer micros, double-entry, append-only.

Conventions (DESIGN §3):

* 1 USD = 1_000_000 micros; 1 cent = 10_000 micros.
* A posting is a list of legs ``(ledger_account_code, amount_micros)`` summing to 0.
* A customer's balance is per MODE, as in Stripe: ``acct:<account_id>`` is the live balance,
  ``acct_test:<account_id>`` the test (sandbox) balance (``customer(account_id, mode)``).
  Their legs also move the cached ``accounts.balance_micros`` / ``accounts.test_balance_micros``
  with a conditional UPDATE (``… WHERE balance + :delta >= 0``) in the same database
  transaction, so no concurrent path can overdraw an account in either mode.
* Holder accounts (``acct:``, ``earnings:``, ``revenue:``, ``hold:``) never go negative; source
  accounts (``promo:``, ``external:``, ``adjust:``) are negative by the amount they
  have put into the system.

``post()`` never commits: the calling service owns the transaction.
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import BigInteger, String, bindparam, func, select, text, update
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
HOLDER_PREFIXES = (CUSTOMER, CUSTOMER_TEST, EARNINGS, "revenue:", "hold:")
MODES = ("live", "test")


def cents_to_micros(cents: int) -> int:
    return int(cents) * MICROS_PER_CENT


def micros_to_cents(micros: int) -> int:
    """Cents shown by the API: floor division (DESIGN §3)."""
    return int(micros) // MICROS_PER_CENT


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
_TXNS = LedgerTransaction.__table__

# Statements built once, parameters given at execution (SQLAlchemy's compiled cache).
def _balance_updates(column: str):
    col = _ACCOUNTS.c[column]
    credit = update(_ACCOUNTS).where(_ACCOUNTS.c.id == bindparam("acct")).values({column: col + bindparam("delta")})
    return credit, credit.where(col >= bindparam("need"))  # the debit never goes below zero


# ledger account prefix -> (credit, debit) statements on its cached balance column
_CACHED = {CUSTOMER: _balance_updates("balance_micros"), CUSTOMER_TEST: _balance_updates("test_balance_micros")}

# The transaction and its legs in one statement.
_PG_POST = text("""
    WITH txn AS (
        INSERT INTO ledger_transactions (kind, ref, account_id, meta, created_at)
        VALUES (:kind, :ref, :account_id, :meta, :created_at)
        RETURNING id)
    INSERT INTO ledger_entries (txn_id, ledger_account, amount_micros, created_at)
    SELECT txn.id, leg.code, leg.amount, :created_at
    FROM txn, unnest(CAST(:codes AS varchar[]), CAST(:amounts AS bigint[])) AS leg(code, amount)
    RETURNING txn_id
""").bindparams(bindparam("meta", type_=JSONType), bindparam("created_at", type_=UTCDateTime()),
                bindparam("codes", type_=ARRAY(String)), bindparam("amounts", type_=ARRAY(BigInteger)))


def post(kind: str, legs: list[tuple[str, int]], *, ref: str | None = None,
         account_id: str | None = None, meta: dict | None = None,
         created_at=None) -> int:
    """Append one balanced transaction; returns its id. Does not commit.

    Raises ``InsufficientFunds`` (and leaves the caller's transaction to roll back)
    when a customer leg would overdraw; ``sqlalchemy.exc.IntegrityError`` when
    ``ref`` was already posted (the caller decides whether that means "done").
    """
    legs = [(code, int(amount)) for code, amount in legs if int(amount) != 0]
    if not legs:
        raise UnbalancedPosting("a posting needs at least one non-zero leg")
    if sum(a for _, a in legs) != 0:
        raise UnbalancedPosting(f"legs of {kind} do not sum to zero: {legs}")
    session = db.session
    now = created_at or utcnow()
    # Debits first (conditional), then credits: a failed debit changes nothing, so a caller
    # may catch InsufficientFunds, add funds and post again in the same transaction.
    # Core statements on the tables (not the ORM): cached compiled SQL, no unit of work.
    for code, amount in sorted(legs, key=lambda leg: leg[1]):
        prefix, _, acct = code.partition(":")
        statements = _CACHED.get(prefix + ":")
        if statements is not None:
            res = session.execute(statements[1] if amount < 0 else statements[0],
                                  {"acct": acct, "delta": amount, "need": -amount})
            if res.rowcount != 1:
                if amount < 0:
                    raise InsufficientFunds(acct, -amount)
                raise LookupError(f"no account {acct}")
    txn = {"kind": kind, "ref": ref, "account_id": account_id, "meta": meta, "created_at": now}
    # The transaction and all its entries in one statement (one round trip).
    return session.execute(_PG_POST, {**txn, "codes": [c for c, _ in legs],
                                      "amounts": [a for _, a in legs]}).scalars().first()


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

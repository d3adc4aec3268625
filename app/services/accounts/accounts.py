"""Accounts: creation (with the promotional grant), plans, admin flag, operator credits.

Entry points (each one unit of work): ``create_account``, ``grant_credits``, ``set_plan``,
``set_admin``. ``new_account`` is the helper other entry points (sign-up, agent
registration) use inside their own unit of work."""
from __future__ import annotations

import re

from flask import current_app
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from app.errors import Conflict, InvalidRequest, NotFound
from app.extensions import db
from app.ids import new_id
from app.models import Account
from app.services.accounts import mailbox
from app.services.money import funding, ledger
from app import auth
from app.services.platform.uow import after_commit, transactional

# Pragmatic address syntax check (RFC 5321 lengths, one @, a dotted domain). Written for
# Python and ECMA regexes alike: EMAIL_CORE is published inside the pattern of an alert's
# e-mail target (blueprints/alerts/schemas.py).
EMAIL_CORE = (r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
              r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+")
EMAIL_PATTERN = rf"^{EMAIL_CORE}$"
EMAIL_MAX = 254
_EMAIL_RE = re.compile(EMAIL_PATTERN)


def normalize_email(email: str) -> str:
    """Lower-cased, trimmed address; raises InvalidRequest when it is not an address (or
    carries RFC 2047 encoded-word syntax ``=?``, which mail libraries may decode into
    header line breaks: docs/security.md)."""
    value = (email or "").strip()
    # checked before lower-casing: "\u212a".lower() is an ASCII "k"
    if len(value) > EMAIL_MAX or not _EMAIL_RE.fullmatch(value) or "=?" in value:  # no RFC 2047 encoded words
        raise InvalidRequest("email: not a valid e-mail address.")
    return value.lower()


def plans() -> dict:
    return current_app.config["PLANS"]


def plan_cents(plan: str) -> int:
    return int(plans()[plan]["plan_cents"])


def _check_plan(plan: str) -> str:
    if plan not in plans():
        raise InvalidRequest(f"plan: must be one of {', '.join(plans())}.")
    return plan


def get_account(account_id: str) -> Account:
    acct = db.session.get(Account, account_id)
    if acct is None:
        raise NotFound("No such account.")
    return acct


def account_view(account_id: str, mode: str) -> dict:
    """GET /api/account for a credential of ``mode``: the balance is that mode's (a live
    key never sees test money, a test key sees the test balance)."""
    acct = get_account(account_id)
    return {"id": acct.id, "email": acct.email, "plan": acct.plan, "agent_id": acct.agent_id, "kind": acct.kind,
            "name": acct.name,
            "balance_micros": acct.test_balance_micros if mode == "test" else acct.balance_micros}


def find_by_email(email: str) -> Account | None:
    return db.session.execute(
        select(Account).where(Account.email == normalize_email(email))
    ).scalar_one_or_none()


@transactional
def create_account(email: str | None, **kw) -> Account:
    """Create an account (``new_account``) in its own unit of work."""
    return new_account(email, **kw)


def new_account(email: str | None, *, plan: str | None = None, admin: bool = False,
                kind: str = "human", owner_account_id: str | None = None,
                agent_id: str | None = None, promo: bool | None = None) -> Account:
    """Create an account in the caller's unit of work; human accounts get the promotional
    grant (PROMO_GRANT_CENTS) as a ledger posting in the same transaction. Raises Conflict
    when the address is taken (the caller's unit of work then rolls back)."""
    plan = _check_plan(plan or current_app.config["DEFAULT_PLAN"])
    email_norm = normalize_email(email) if email is not None else None
    if email_norm and db.session.execute(
        select(func.count()).select_from(Account).where(Account.email == email_norm)
    ).scalar_one():
        raise Conflict("An account with this e-mail already exists.")
    box = mailbox.canonical(email_norm) if email_norm else None
    acct = Account(id=new_id("acct"), email=email_norm, plan=plan, is_admin=admin, kind=kind,
                   owner_account_id=owner_account_id, agent_id=agent_id, balance_micros=0,
                   test_balance_micros=0, mailbox=box)
    db.session.add(acct)
    try:
        db.session.flush()
    except IntegrityError:
        raise Conflict("An account with this e-mail already exists.") from None
    grant = current_app.config["PROMO_GRANT_CENTS"] if promo is None and kind == "human" \
        else (current_app.config["PROMO_GRANT_CENTS"] if promo else 0)
    if grant:
        _promo_grant(acct, ledger.cents_to_micros(grant))
    return acct


def _promo_grant(acct: Account, micros: int) -> None:
    """The promotional grant, once per canonical mailbox (an account without an address
    gets it under its own id). A mailbox that already has an account gets nothing; two
    concurrent sign-ups of one mailbox meet on the grant's unique ref and the second gets
    nothing (its savepoint rolls back, the account stays)."""
    if acct.mailbox is not None and db.session.execute(
        select(func.count()).select_from(Account)
        .where(Account.mailbox == acct.mailbox, Account.id != acct.id)
    ).scalar_one():
        return
    ref = mailbox.grant_ref(acct.mailbox) if acct.mailbox else f"promo:{acct.id}"
    try:
        with db.session.begin_nested():
            funding.grant("promo_grant", source=ledger.PROMO, account_id=acct.id, micros=micros, ref=ref)
    except IntegrityError:
        return


@transactional
def grant_credits(account_id: str, cents: int, memo: str | None = None) -> int:
    """Operator credit (positive) or correction (negative, never below zero)."""
    get_account(account_id)
    if cents == 0:
        raise InvalidRequest("cents: must not be zero.")
    micros = ledger.cents_to_micros(cents)
    funding.grant("operator_adjustment", source=ledger.ADJUST, account_id=account_id, micros=micros,
                  meta={"memo": memo} if memo else None)
    _operator_audit(account_id, "credit.adjust", after={"amount_micros": micros, "memo": memo})
    return get_account(account_id).balance_micros


def _operator_audit(account_id: str, action: str, **change) -> None:
    """An operator's change in the account's audit log: by the request's actor (an admin
    route), else by the operator (the CLI)."""
    from app.services.orgs import audit

    audit.record(account_id, audit.current() or audit.Actor(None, "operator"), action, account_id, **change)


@transactional
def set_plan(account_id: str, plan: str) -> Account:
    acct = get_account(account_id)
    before = acct.plan
    acct.plan = _check_plan(plan)
    if acct.plan != before:
        _operator_audit(account_id, "account.plan", before={"plan": before}, after={"plan": acct.plan})
    after_commit(auth.broadcast_account_change, account_id)
    return acct


@transactional
def set_admin(account_id: str, admin: bool = True) -> Account:
    acct = get_account(account_id)
    acct.is_admin = admin
    after_commit(auth.broadcast_account_change, account_id)
    return acct

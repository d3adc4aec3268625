"""Self-serve sign-up (SPEC part 1 item 8): e-mail verification, then an account with
the promotional credit (no card) and its first key, shown once.

``start`` answers the same whether or not the address has an account: a new address
gets a verification link (a ``signup`` single-use token naming the address, stored
hashed, valid ``SIGNUP_TOKEN_TTL_HOURS``); an existing account's address gets a "you
already have an account" notice instead. ``complete`` redeems the token atomically and
creates the account, its 1,000-cent promo grant (ledger) and a full-scope live key in one
transaction, so a crash leaves either everything or nothing (and the token unused).
Each of ``start`` and ``complete`` is one unit of work; ``complete`` burns the token in a
second one when the address turned out to be taken.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from flask import current_app
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from app.errors import Conflict, NotFound
from app.extensions import db
from app.models import Account, ApiKey
from app.scopes import ALL_SCOPES
from app.services.accounts import accounts, keys
from app.services.platform import outbox, tokens
from app.services.platform.uow import transactional

FIRST_KEY_NAME = "default"


@dataclass(frozen=True)
class SignupResult:
    """A completed sign-up: the new account and its first key (``secret`` shown once)."""

    account: Account
    key: ApiKey
    secret: str


def accepted() -> dict:
    """The one response body of ``POST /api/signup``."""
    return {"status": "pending",
            "message": "Check your inbox: we sent a link to finish signing up."}


@transactional
def start(email: str) -> dict:
    email = accounts.normalize_email(email)
    exists = db.session.execute(select(func.count()).select_from(Account)
                                .where(Account.email == email)).scalar_one()
    if exists:
        outbox.add_email(
            email, "You already have an account",
            "Someone (hopefully you) tried to sign up with this address, but it already has "
            "an account. Use one of its API keys; if you lost them, sign in to the console "
            f"(it e-mails you a sign-in link) and create a new one:\n{tokens.link('/login')}\n\n"
            "If this was not you, ignore this e-mail.",
            source="signup:existing", throttle="SIGNUP_EMAIL_RATE_LIMIT")
    else:
        hours = int(current_app.config["SIGNUP_TOKEN_TTL_HOURS"])
        token = tokens.issue(tokens.SIGNUP, email, timedelta(hours=hours))
        link = tokens.link("/signup/confirm?token=" + token)
        outbox.add_email(
            email, "Finish creating your account",
            f"Open this link to create your account and get your first API key "
            f"(it works once, for {hours} hours):\n{link}\n\n"
            f"Your account starts with {current_app.config['PROMO_GRANT_CENTS'] / 100:.2f} USD "
            "of free credit, no card needed.\n\nIf this was not you, ignore this e-mail.",
            source="signup:new", capability=True, throttle="SIGNUP_EMAIL_RATE_LIMIT")
    return accepted()


def check_token(token: str | None) -> str | None:
    """The address of the unused, unexpired sign-up link ``token`` (for the confirmation
    page; read-only)."""
    row = tokens.lookup(tokens.SIGNUP, token)
    return row.subject if tokens.is_usable(row) else None


class TokenInvalid(NotFound):
    """The sign-up link is unknown, expired or already used."""

    status, code, message = 404, "invalid_token", "This sign-up link is invalid, expired or already used."
    description = "The e-mailed confirmation token is unknown, expired or already used."


def complete(token: str | None) -> SignupResult:
    """Redeem the token: create the account (promo grant) and its first key.

    Returns the account and its first key with the secret, shown only here. Raises
    ``TokenInvalid`` (unknown/expired/used) or ``Conflict`` (the address got an account
    meanwhile, e.g. through a second sign-up link)."""
    try:
        return _redeem(token)
    except _AddressTaken:
        _burn(token)  # the link cannot be retried
        raise Conflict("An account with this e-mail already exists.") from None
    except IntegrityError:  # a concurrent sign-up created the address's account first
        raise Conflict("An account with this e-mail already exists.") from None


class _AddressTaken(Exception):
    """The token's address already has an account (the unit of work is rolled back)."""


@transactional
def _redeem(token: str | None) -> SignupResult:
    redeemed = tokens.consume(tokens.SIGNUP, token)
    if redeemed is None:
        raise TokenInvalid()
    try:
        acct = accounts.new_account(redeemed.subject)
    except Conflict:
        raise _AddressTaken() from None
    row, secret = keys.add_key(acct.id, FIRST_KEY_NAME, ALL_SCOPES)
    return SignupResult(account=acct, key=row, secret=secret)


def made_account(token: str | None) -> bool:
    """Whether ``token`` is a used sign-up link whose address has an account: a second press of
    the page's button (a double click, a reload) is told to sign in rather than to sign up
    again, which would only mail "you already have an account"."""
    email = tokens.used_subject(tokens.SIGNUP, token)
    return email is not None and db.session.execute(
        select(func.count()).select_from(Account).where(Account.email == email)).scalar_one() > 0


@transactional
def _burn(token: str | None) -> None:
    tokens.consume(tokens.SIGNUP, token)

"""Self-serve sign-up (SPEC part 1 item 8): e-mail verification, then an account with
the promotional credit (no card) and its first key, shown once.

``start`` answers the same whether or not the address has an account: a new address
gets a verification link (a ``signup`` single-use token naming the address, stored
hashed, valid ``SIGNUP_TOKEN_TTL_HOURS``); an existing account's address gets a "you
already have an account" notice instead. ``complete`` redeems the token atomically and creates the
account, its 1,000-cent promo grant (ledger) and a full-scope live key in one
transaction, so a crash leaves either everything or nothing (and the token unused).
"""
from __future__ import annotations

from datetime import timedelta

from flask import current_app
from sqlalchemy import func, select

from sqlalchemy.exc import IntegrityError

from app.errors import Conflict, NotFound
from app.extensions import db
from app.models import Account
from app.scopes import ALL_SCOPES
from app.services.accounts import accounts
from app.services.platform import tokens
from app.services.accounts import keys
from app.services.platform import outbox

FIRST_KEY_NAME = "default"


def accepted() -> dict:
    """The one response body of ``POST /api/signup``."""
    return {"status": "pending",
            "message": "Check your inbox: we sent a link to finish signing up."}


def start(email: str) -> dict:
    email = accounts.normalize_email(email)
    exists = db.session.execute(select(func.count()).select_from(Account)
                                .where(Account.email == email)).scalar_one()
    if exists:
        msg = outbox.add_email(
            email, "You already have an account",
            "Someone (hopefully you) tried to sign up with this address, but it already has "
            "an account. Sign in with one of your API keys; if you lost them, reply to this "
            "e-mail.\n\nIf this was not you, ignore this e-mail.",
            source="signup:existing")
    else:
        hours = int(current_app.config["SIGNUP_TOKEN_TTL_HOURS"])
        token = tokens.issue(tokens.SIGNUP, email, timedelta(hours=hours))
        link = tokens.link("/signup/confirm?token=" + token)
        msg = outbox.add_email(
            email, "Finish creating your account",
            f"Open this link to create your account and get your first API key "
            f"(it works once, for {hours} hours):\n{link}\n\n"
            f"Your account starts with {current_app.config['PROMO_GRANT_CENTS'] / 100:.2f} USD "
            "of free credit, no card needed.\n\nIf this was not you, ignore this e-mail.",
            source="signup:new")
    db.session.commit()
    outbox.dispatch(msg.id)
    return accepted()


def check_token(token: str | None) -> str | None:
    """The address of the unused, unexpired sign-up link ``token`` (for the confirmation
    page; read-only)."""
    row = tokens.lookup(tokens.SIGNUP, token)
    return row.subject if tokens.is_usable(row) else None


class TokenInvalid(NotFound):
    """The sign-up link is unknown, expired or already used."""

    status, code, message = 404, "invalid_token", "This sign-up link is invalid, expired or already used."


def complete(token: str | None) -> dict:
    """Redeem the token: create the account (promo grant) and its first key.

    Returns ``{account, key}`` with the secret key, shown only here. Raises
    ``TokenInvalid`` (unknown/expired/used) or ``Conflict`` (the address got an account
    meanwhile, e.g. through a second sign-up link)."""
    redeemed = tokens.consume(tokens.SIGNUP, token)
    if redeemed is None:
        db.session.rollback()
        raise TokenInvalid()
    try:
        acct = accounts.create_account(redeemed.subject, commit=False)
    except Conflict:
        # create_account rolled back; burn the token so the link cannot be retried.
        tokens.consume(tokens.SIGNUP, token)
        db.session.commit()
        raise Conflict("An account with this e-mail already exists.")
    row, secret = keys.mint(acct.id, FIRST_KEY_NAME, ALL_SCOPES, commit=False)
    try:
        db.session.commit()
    except IntegrityError:  # a concurrent sign-up created the address's account first
        db.session.rollback()
        raise Conflict("An account with this e-mail already exists.")
    return {"account": accounts.account_view(acct), "key": {**keys.key_view(row), "key": secret}}

"""Self-serve sign-up (SPEC part 1 item 8): e-mail verification, then an account with
the promotional credit (no card) and its first key, shown once.

``start`` answers the same whether or not the address has an account: a new address
gets a verification link (single-use token, stored hashed, valid
``SIGNUP_TOKEN_TTL_HOURS``); an existing account's address gets a "you already have an
account" notice instead. ``complete`` redeems the token atomically and creates the
account, its 1,000-cent promo grant (ledger) and a full-scope live key in one
transaction, so a crash leaves either everything or nothing (and the token unused).
Each of ``start``, ``complete`` and ``prune`` is one unit of work; ``complete`` burns
the token in a second one when the address turned out to be taken.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from flask import current_app
from sqlalchemy import func, select, update

from sqlalchemy.exc import IntegrityError

from app.errors import Conflict, NotFound
from app.extensions import db
from app.ids import new_id
from app.models import Account, ApiKey, SignupRequest
from app.models.base import utcnow
from app.scopes import ALL_SCOPES
from app.services.accounts import accounts
from app.services.platform import tokens as emailtokens
from app.services.accounts import keys
from app.services.platform import outbox
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
            "an account. Sign in with one of your API keys; if you lost them, reply to this "
            "e-mail.\n\nIf this was not you, ignore this e-mail.",
            source="signup:existing")
    else:
        token, digest = emailtokens.new_token()
        hours = int(current_app.config["SIGNUP_TOKEN_TTL_HOURS"])
        req = SignupRequest(id=new_id("signup"), email=email, token_hash=digest,
                            expires_at=utcnow() + timedelta(hours=hours), created_at=utcnow())
        db.session.add(req)
        link = emailtokens.link("/signup/confirm?token=" + token)
        outbox.add_email(
            email, "Finish creating your account",
            f"Open this link to create your account and get your first API key "
            f"(it works once, for {hours} hours):\n{link}\n\n"
            f"Your account starts with {current_app.config['PROMO_GRANT_CENTS'] / 100:.2f} USD "
            "of free credit, no card needed.\n\nIf this was not you, ignore this e-mail.",
            source=f"signup:{req.id}")
    return accepted()


def check_token(token: str | None) -> SignupRequest | None:
    """The unused, unexpired request a token belongs to (for the confirmation page)."""
    digest = emailtokens.token_hash(token)
    if digest is None:
        return None
    return db.session.execute(select(SignupRequest).where(
        SignupRequest.token_hash == digest, SignupRequest.used_at.is_(None),
        SignupRequest.expires_at > utcnow())).scalar_one_or_none()


class TokenInvalid(NotFound):
    """The sign-up link is unknown, expired or already used."""

    status, code, message = 404, "invalid_token", "This sign-up link is invalid, expired or already used."
    description = "The e-mailed confirmation token is unknown, expired or already used."


def complete(token: str | None) -> SignupResult:
    """Redeem the token: create the account (promo grant) and its first key.

    Returns the account and its first key with the secret, shown only here. Raises
    ``TokenInvalid`` (unknown/expired/used) or ``Conflict`` (the address got an account
    meanwhile, e.g. through a second sign-up link)."""
    digest = emailtokens.token_hash(token)
    if digest is None:
        raise TokenInvalid()
    now = utcnow()
    try:
        result = _redeem(digest, now)
    except _AddressTaken as taken:
        _burn(taken.req_id, now)  # the link cannot be retried
        raise Conflict("An account with this e-mail already exists.") from None
    except IntegrityError:  # a concurrent sign-up created the address's account first
        raise Conflict("An account with this e-mail already exists.") from None
    return result


class _AddressTaken(Exception):
    def __init__(self, req_id: str):
        super().__init__(req_id)
        self.req_id = req_id


@transactional
def _redeem(digest: str, now) -> SignupResult:
    req_id = db.session.execute(
        update(SignupRequest)
        .where(SignupRequest.token_hash == digest, SignupRequest.used_at.is_(None),
               SignupRequest.expires_at > now)
        .values(used_at=now).returning(SignupRequest.id)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()
    if req_id is None:
        raise TokenInvalid()
    req = db.session.get(SignupRequest, req_id, populate_existing=True)
    try:
        acct = accounts.new_account(req.email)
    except Conflict:
        raise _AddressTaken(req_id) from None
    req.account_id = acct.id
    row, secret = keys.add_key(acct.id, FIRST_KEY_NAME, ALL_SCOPES)
    return SignupResult(account=acct, key=row, secret=secret)


@transactional
def _burn(req_id: str, now) -> None:
    db.session.execute(update(SignupRequest).where(SignupRequest.id == req_id)
                       .values(used_at=now).execution_options(synchronize_session=False))


@transactional
def prune(older_than_days: int = 7) -> int:
    """Delete unused sign-up requests that expired more than ``older_than_days`` ago
    (redeemed ones are kept: they record which request created which account)."""
    from sqlalchemy import delete

    cutoff = utcnow() - timedelta(days=older_than_days)
    res = db.session.execute(delete(SignupRequest).where(SignupRequest.used_at.is_(None),
                                                         SignupRequest.expires_at < cutoff)
                             .execution_options(synchronize_session=False))
    return res.rowcount or 0

"""Console sign-in and sessions (the browser console, issue 19): passwordless links and
server-side sessions, both kept as rows of the single-use token table (platform/tokens).

* ``request_link(email)`` answers the same for every address. An account's address gets
  a ``console_signin`` link (valid ``CONSOLE_SIGNIN_TTL_MINUTES``); an unknown address
  gets the sign-up e-mail instead (``signup.start``). A second request while a link
  issued less than ``RESEND_AFTER`` ago is still unused sends nothing (no mail bombing).
* ``sign_in(token)`` consumes the link (once, unexpired) and opens a session: a
  ``console_session`` token whose row expires after ``CONSOLE_SESSION_ABSOLUTE_HOURS``
  (the absolute timeout). The idle timeout is the cookie's signed timestamp (blueprint).
* ``session_account(token)`` is the account of a usable session, else None;
  ``sign_out(token)`` consumes the session row, so the cookie is dead server-side.
"""
from __future__ import annotations

from datetime import timedelta

from flask import current_app

from app.errors import NotFound
from app.extensions import db
from app.models import Account
from app.models.base import utcnow
from app.services.accounts import accounts, signup
from app.services.platform import outbox, tokens
from app.services.platform.uow import transactional, unit_of_work

RESEND_AFTER = timedelta(seconds=60)


def signin_ttl() -> timedelta:
    return timedelta(minutes=int(current_app.config.get("CONSOLE_SIGNIN_TTL_MINUTES", 15)))


def absolute_ttl() -> timedelta:
    return timedelta(hours=int(current_app.config.get("CONSOLE_SESSION_ABSOLUTE_HOURS", 12)))


def idle_seconds() -> int:
    return 60 * int(current_app.config.get("CONSOLE_SESSION_IDLE_MINUTES", 30))


class SignInLinkInvalid(NotFound):
    message = "This sign-in link is unknown, expired or already used. Ask for a new one."


def request_link(email: str) -> None:
    """E-mail a sign-in link to an account's address, or the sign-up link to an unknown
    one; the caller answers the same either way."""
    email = accounts.normalize_email(email)
    account = accounts.find_by_email(email)
    if account is None or account.kind != "human":
        signup.start(email)  # its own unit of work; same answer, different mail
        return
    with unit_of_work():
        latest = tokens.find_usable(tokens.CONSOLE_SIGNIN, account.id)
        if latest is not None and latest.created_at > utcnow() - RESEND_AFTER:
            return
        ttl = signin_ttl()
        token = tokens.issue(tokens.CONSOLE_SIGNIN, account.id, ttl)
        link = tokens.link("/login/confirm?token=" + token)
        outbox.add_email(
            email, "Your console sign-in link",
            f"Open this link to sign in to the console (it works once, for "
            f"{int(ttl.total_seconds() // 60)} minutes):\n{link}\n\n"
            "If this was not you, ignore this e-mail: nobody can sign in without it.",
            source="console:signin", account_id=account.id, capability=True,
            throttle="CONSOLE_SIGNIN_EMAIL_RATE_LIMIT")


def link_is_usable(token: str | None) -> bool:
    """Whether the sign-in link could still be used (read-only, for the button page)."""
    return link_address(token) is not None


def link_address(token: str | None) -> str | None:
    """The address of the account a usable sign-in link signs into, else None (read-only:
    the button page names it, so a link someone else requested for their own account —
    login CSRF — shows whose console it opens)."""
    row = tokens.lookup(tokens.CONSOLE_SIGNIN, token)
    if not tokens.is_usable(row):
        return None
    account = db.session.get(Account, row.subject)
    return None if account is None else (account.email or account.id)


@transactional
def sign_in(token: str | None) -> tuple[str, str]:
    """Use the sign-in link once and open a session: returns (account_id, session token)."""
    row = tokens.consume(tokens.CONSOLE_SIGNIN, token)
    if row is None:
        raise SignInLinkInvalid()
    account_id = row.subject
    return account_id, open_session(account_id)


def open_session(account_id: str) -> str:
    """A new console session for ``account_id`` in the caller's unit of work (a used
    sign-in link, an accepted invitation, a confirmed sign-up); returns the session token
    for the cookie."""
    return tokens.issue(tokens.CONSOLE_SESSION, account_id, absolute_ttl())


@transactional
def sign_in_after_signup(account_id: str) -> str:
    """A console session, in a unit of work of its own, for an account that just proved its
    address by the sign-up link it confirmed: the new user lands signed in. Returns the
    session token."""
    return open_session(account_id)


def session_account(session_token: str | None) -> Account | None:
    """The account of a usable (not signed out, not past its absolute timeout) session."""
    row = tokens.lookup(tokens.CONSOLE_SESSION, session_token)
    if not tokens.is_usable(row):
        return None
    return db.session.get(Account, row.subject)


@transactional
def sign_out(session_token: str | None) -> bool:
    """End the session server-side (its cookie stops working everywhere)."""
    return tokens.consume(tokens.CONSOLE_SESSION, session_token) is not None

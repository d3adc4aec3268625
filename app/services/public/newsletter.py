"""Newsletter lists with double opt-in (SPEC endpoints 32–33) and RFC 8058 one-click
unsubscribe.

A subscription belongs to a mailbox (``mailbox.canonical``: ``J.Doe+news@gmail.com`` and
``jdoe@googlemail.com`` are one inbox), one per list; its ``email`` is the spelling list
mail is delivered to.

* ``subscribe`` answers the same whatever the mailbox's state; a new or pending
  mailbox gets a fresh single-use confirmation token (``newsletter_confirm``, subject
  the subscription id, stored hashed, valid ``NEWSLETTER_TOKEN_TTL_HOURS``; it replaces
  any earlier one) by e-mail, at the address just given, which becomes the delivery
  address once confirmed; an already subscribed one gets nothing (whatever the spelling).
* The mailed link opens a page whose button POSTs the token (``confirm``); a prefetch
  of the link by a mail scanner confirms nothing.
* Every list e-mail carries ``List-Unsubscribe`` (a signed one-click URL) and
  ``List-Unsubscribe-Post: List-Unsubscribe=One-Click``; a POST to that URL
  unsubscribes the address's mailbox from every list (as ``unsubscribe`` does).
"""
from __future__ import annotations

from datetime import timedelta

from flask import current_app
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from app.extensions import db
from app.ids import new_id
from app.models import Subscription
from app.models.base import utcnow
from app.services.platform import tokens
from app.services.platform import outbox
from app.services.platform.uow import transactional, unit_of_work
from app.services.accounts.accounts import normalize_email
from app.services.accounts.mailbox import canonical

LISTS = ("launch", "product", "weekly")
DEFAULT_LIST = "product"
LIST_NAMES = {"launch": "launch announcements", "product": "product updates",
              "weekly": "the weekly digest"}


def unsubscribe_url(email: str) -> str:
    return tokens.link("/email/unsubscribe/" + tokens.unsubscribe_token(email))


def list_headers(email: str) -> dict:
    """RFC 2369 / RFC 8058 headers of every list e-mail to ``email``."""
    return {"List-Unsubscribe": f"<{unsubscribe_url(email)}>",
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}


def add_list_email(email: str, subject: str, text: str, *, source: str, throttle: str | None = None):
    """Write one list e-mail to the outbox, in the caller's unit of work (delivery is
    enqueued after it commits); ``throttle``: ``outbox.add_email``'s per-recipient limit."""
    footer = f"\n\n-- \nUnsubscribe from every list: {unsubscribe_url(email)}\n"
    return outbox.add_email(email, subject, text + footer, headers=list_headers(email),
                            source=source, capability=True, throttle=throttle)


def subscribe(email: str, list_name: str | None = None) -> dict:
    """Start (or restart) double opt-in for ``email``'s mailbox on ``list_name`` (one unit
    of work, tried a second time when a concurrent first subscribe of the same mailbox won)."""
    email = normalize_email(email)
    list_name = list_name or DEFAULT_LIST
    for _attempt in range(2):
        try:
            with unit_of_work():
                _start_opt_in(email, list_name)
            break
        except IntegrityError:
            continue
    return accepted()


def _start_opt_in(email: str, list_name: str) -> None:
    box = canonical(email)
    sub = db.session.execute(select(Subscription).where(
        Subscription.mailbox == box, Subscription.list == list_name).with_for_update()
    ).scalar_one_or_none()
    if sub is None:
        sub = Subscription(id=new_id("sub"), email=email, mailbox=box, list=list_name, created_at=utcnow())
        db.session.add(sub)
    if sub.status != "subscribed":
        if sub.status == "pending":  # the newest link replaces older ones
            tokens.revoke(tokens.NEWSLETTER_CONFIRM, sub.id)
        # the link goes to the spelling just given; confirming it makes that the delivery address
        sub.email, sub.status, sub.unsubscribed_at = email, "pending", None
        db.session.flush()  # the subscription id exists before the token names it
        hours = int(current_app.config["NEWSLETTER_TOKEN_TTL_HOURS"])
        token = tokens.issue(tokens.NEWSLETTER_CONFIRM, sub.id, timedelta(hours=hours))
        link = tokens.link("/email/confirm?token=" + token)
        add_list_email(
            email, f"Confirm your subscription to {LIST_NAMES[list_name]}",
            f"Someone (hopefully you) asked to receive {LIST_NAMES[list_name]} at this address.\n\n"
            f"Confirm here (the link works once, for {hours} hours):\n{link}\n\n"
            "If this was not you, ignore this e-mail: nothing is sent until you confirm.",
            source=f"subscription:{sub.id}", throttle="SUBSCRIBE_EMAIL_RATE_LIMIT")


def accepted() -> dict:
    """The one response body of endpoint 32, whatever the address's state."""
    return {"status": "pending",
            "message": "If this address can receive e-mail, a confirmation link is on its way."}


def check_token(token: str | None) -> Subscription | None:
    """The pending subscription a token confirms (for the confirmation page), else None."""
    row = tokens.lookup(tokens.NEWSLETTER_CONFIRM, token)
    if not tokens.is_usable(row):
        return None
    sub = db.session.get(Subscription, row.subject)
    return sub if sub is not None and sub.status == "pending" else None


def confirmed_subscription(token: str | None) -> Subscription | None:
    """The subscription a used token confirmed, when it is subscribed still (a second press
    of the page's button), else None."""
    sub_id = tokens.used_subject(tokens.NEWSLETTER_CONFIRM, token)
    sub = db.session.get(Subscription, sub_id) if sub_id else None
    return sub if sub is not None and sub.status == "subscribed" else None


@transactional
def confirm(token: str | None) -> Subscription | None:
    """Redeem a confirmation token (single use, atomic); returns the subscription or None
    when the token is unknown, expired or already used. Sends a welcome list e-mail."""
    redeemed = tokens.consume(tokens.NEWSLETTER_CONFIRM, token)
    if redeemed is None:
        return None
    sub_id = db.session.execute(
        update(Subscription)
        .where(Subscription.id == redeemed.subject, Subscription.status == "pending")
        .values(status="subscribed", confirmed_at=utcnow())
        .returning(Subscription.id)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()
    if sub_id is None:
        return None
    sub = db.session.get(Subscription, sub_id, populate_existing=True)
    add_list_email(sub.email, f"You are subscribed to {LIST_NAMES[sub.list]}",
                         f"Thanks for confirming: you will receive {LIST_NAMES[sub.list]} "
                         "at this address.", source=f"subscription:{sub.id}")
    return sub


@transactional
def unsubscribe(email: str) -> dict:
    """Remove ``email``'s mailbox (every spelling of the inbox) from every list (pending
    tokens die too). Same answer whether or not it was subscribed."""
    box = canonical(normalize_email(email))
    for sub_id in db.session.execute(select(Subscription.id).where(Subscription.mailbox == box)).scalars():
        tokens.revoke(tokens.NEWSLETTER_CONFIRM, sub_id)
    db.session.execute(
        update(Subscription).where(Subscription.mailbox == box,
                                   Subscription.status != "unsubscribed")
        .values(status="unsubscribed", unsubscribed_at=utcnow())
        .execution_options(synchronize_session=False))
    return {"status": "unsubscribed",
            "message": "This address will receive no further list e-mail."}


def one_click_unsubscribe(token: str) -> bool:
    """RFC 8058 one-click: unsubscribe the mailbox of the address a signed token names;
    False if the token is not valid."""
    email = tokens.unsubscribe_email(token)
    if email is None:
        return False
    unsubscribe(email)
    return True


@transactional
def send_to_list(list_name: str, subject: str, text: str) -> int:
    """Queue one e-mail to every confirmed subscriber of ``list_name`` (operator CLI);
    returns how many."""
    emails = list(db.session.execute(select(Subscription.email).where(
        Subscription.list == list_name, Subscription.status == "subscribed")
        .order_by(Subscription.email)).scalars())
    stamp = utcnow().strftime("%Y%m%d%H%M%S")
    for email in emails:
        add_list_email(email, subject, text, source=f"list:{list_name}:{stamp}")
    return len(emails)

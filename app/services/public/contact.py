"""Contact form (SPEC endpoint 31): store the message, forward it to ``SALES_EMAIL``
through the outbox (Reply-To the sender) in the same transaction."""
from __future__ import annotations

from datetime import timedelta
from typing import Callable

from flask import current_app
from sqlalchemy import select

from app.extensions import db
from app.ids import new_id
from app.models import ContactMessage
from app.models.base import utcnow
from app.services.platform import outbox
from app.services.platform.uow import lock_key, transactional
from app.services.accounts.accounts import normalize_email


RESUBMIT_WINDOW = timedelta(minutes=10)


def _one_line(value: str, limit: int) -> str:
    """Header-safe text: control characters (CR/LF included) become spaces."""
    return "".join(ch if ch.isprintable() else " " for ch in value).strip()[:limit]


@transactional
def submit(email: str, message: str, name: str | None = None, *, honeypot: str | None = None,
           client_ip: str | None = None, admit: Callable[[], None] | None = None) -> dict:
    """Queue a contact message; returns ``{id, status: "queued"}``.

    A filled honeypot field (bots fill every input) returns the same shape with a fresh id
    but stores and sends nothing, so a bot cannot tell it was dropped. The same message from
    the same address again within ``RESUBMIT_WINDOW`` (a double click, a retried request) is
    answered with the first one's id; nothing is stored or sent twice. ``admit`` is called
    once a message is known to be new, under the sender's lock, and may raise to refuse it
    (the route counts the address's limit there: a repeat counts in no window; until
    2026-11-29 a double click used two of the address's 3 an hour); nothing is stored then.
    """
    email = normalize_email(email)
    if honeypot:
        return {"id": new_id("contact"), "status": "queued"}
    # one sender's submissions in turn (a double click sends two at once), then a repeat of
    # the same message within RESUBMIT_WINDOW is answered with the first one's id
    lock_key("contact:" + email)
    earlier = db.session.execute(select(ContactMessage.id).where(
        ContactMessage.email == email, ContactMessage.message == message,
        ContactMessage.created_at > utcnow() - RESUBMIT_WINDOW).limit(1)).scalar()
    if earlier is not None:
        return {"id": earlier, "status": "queued"}
    if admit is not None:  # after the repeat check: a repeat uses none of the address's limit
        admit()
    name = _one_line(name, 100) if name else None
    msg_id = new_id("contact")
    row = ContactMessage(id=msg_id, email=email, name=name or None, message=message,
                         client_ip=client_ip, created_at=utcnow())
    db.session.add(row)
    sender = f"{name} <{email}>" if name else email
    text = (f"New contact-form message {msg_id}\n\nFrom: {sender}\n"
            f"IP: {client_ip or 'unknown'}\n\n{message}\n\n-- \nReply to this e-mail to answer the sender.\n")
    out = outbox.add_email(current_app.config["SALES_EMAIL"],
                           f"Contact form: {name or email}"[:150], text,
                           reply_to=email, source=f"contact:{msg_id}")
    row.outbox_id = out.id  # delivery is enqueued after the commit
    return {"id": msg_id, "status": "queued"}

"""Outbox: reliable delivery of e-mails and outgoing webhooks (DESIGN §9).

Usage from a service::

    with unit_of_work():     # the service's one unit of work
        outbox.add_webhook(url, "alert.fired", body, secret=whsec, source=f"alert_event:{id}")
    # on commit, delivery is enqueued (RQ, or inline without Redis) by an after-commit hook

Outside a unit of work (a test, a shell) the caller commits and calls ``dispatch`` itself.

Delivery is at-least-once with a stable id per message (the Standard Webhooks
``webhook-id`` and the e-mail ``Message-ID``), so receivers can de-duplicate. Each
attempt is claimed first (``attempts += 1`` and ``next_attempt_at`` pushed forward by a
lease) so two workers never send the same message at once and a worker that dies
mid-attempt is retried by the sweep. Failures back off exponentially
(``30 s × 2^(attempt-1)``, capped at 1 h) up to ``max_attempts``; the periodic sweep
(``app/tasks/schedule.py``) re-enqueues everything due, so a Redis outage or a lost job
delays delivery but never loses it.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

import orjson
from sqlalchemy import and_, func, insert, or_, select, update

from app.extensions import db
from app.ids import new_id
from app.logs import mask_emails
from app.models.base import utcnow
from app.models.outbox import OutboxMessage
from app.services.platform import crypto, http, mailer, netguard
from app.services.platform.uow import after_commit, in_unit_of_work, transactional, unit_of_work

log = logging.getLogger(__name__)

LEASE = timedelta(seconds=120)
BACKOFF_BASE = 30
BACKOFF_CAP = 3600
WEBHOOK_TIMEOUT = 10


def add(channel: str, destination: str, payload: dict, *, source: str | None = None,
        account_id: str | None = None, max_attempts: int = 8, flush: bool = True,
        enqueue: bool = True) -> OutboxMessage:
    """Write a message to deliver (in the caller's transaction; no commit). Inside a unit
    of work its delivery is enqueued after that unit commits (never if it rolls back;
    ``enqueue=False``: left to the periodic sweep).

    ``flush=False`` leaves the INSERT to the caller's next flush/commit, so a caller adding
    a few messages gets them written in one batched statement (the id is set already); for
    many at once (a pass of alert firings) ``add_many`` writes no ORM object each."""
    msg = OutboxMessage(id=new_id("msg"), channel=channel, destination=destination,
                        payload=payload, source=source, account_id=account_id,
                        max_attempts=max_attempts, status="pending", attempts=0,
                        next_attempt_at=utcnow(), created_at=utcnow())
    db.session.add(msg)
    if flush:
        db.session.flush()
    if enqueue and in_unit_of_work():
        after_commit(dispatch, msg.id)
    return msg


def message(channel: str, destination: str, payload: dict, *, source: str | None = None,
            account_id: str | None = None, max_attempts: int = 8) -> dict:
    """A message to deliver as the row ``add_many`` writes (the ``payload`` of an e-mail,
    webhook or chat message: ``email_payload``, ``webhook_payload``, ``chat_payload``)."""
    return {"channel": channel, "destination": destination, "payload": payload, "source": source,
            "account_id": account_id, "max_attempts": max_attempts}


def add_many(messages: list[dict], *, enqueue: bool = True) -> list[str]:
    """Write many messages (``message`` rows) in the caller's transaction with one batched
    INSERT and no ORM object per message (a pass that fires 1,000 alerts: ≈ 0.1 s instead
    of ≈ 0.4 s through ``add``); returns their ids, in order. Delivery is enqueued after the
    unit of work commits, as ``add``'s (``enqueue=False``: left to the periodic sweep)."""
    if not messages:
        return []
    now = utcnow()
    rows = [{**m, "id": new_id("msg"), "status": "pending", "attempts": 0, "next_attempt_at": now,
             "created_at": now} for m in messages]
    db.session.execute(insert(OutboxMessage.__table__), rows)
    ids = [r["id"] for r in rows]
    if enqueue and in_unit_of_work():
        for mid in ids:  # one hook each, as add's: a failing enqueue never skips the others
            after_commit(dispatch, mid)
    return ids


def email_payload(subject: str, text: str, *, html: str | None = None, reply_to: str | None = None,
                  headers: dict | None = None, capability: bool = False) -> dict:
    """The payload of an e-mail (``add_email``)."""
    payload = {"subject": subject, "text": text, "html": html, "reply_to": reply_to,
               "headers": headers or {}}
    if capability:
        payload["capability"] = True
    return payload


def webhook_payload(event_type: str, data: dict, *, secret: str | None = None) -> dict:
    """The payload of a Standard Webhooks delivery (``add_webhook``)."""
    return {"type": event_type, "data": data, "secret": secret}


def chat_payload(text: str) -> dict:
    """The payload of a chat message (``add_chat``)."""
    return {"text": text}


def add_email(to: str, subject: str, text: str, *, html: str | None = None,
              reply_to: str | None = None, headers: dict | None = None,
              capability: bool = False, throttle: str | None = None, **kw) -> OutboxMessage | None:
    """An e-mail. ``capability``: the message carries a secret link (a single-use token,
    an unsubscribe token); once delivered, or given up (``failed``), its body and headers are erased
    from the table (``redacted``), so the token never stays at rest in plain text.
    ``throttle``: the config name of a per-recipient limit (``ratelimits.recipient_allowed``),
    given by every mail that someone other than the recipient can trigger (sign-up, console
    sign-in, alert-target and newsletter confirmations); over it the mail is dropped (None,
    logged) and the caller answers as usual, so nobody can aim our mail at an inbox."""
    if throttle is not None:
        from app.ratelimits import recipient_allowed

        if not recipient_allowed(throttle, to):
            log.info("mail throttled for its recipient (%s): %s", throttle, kw.get("source"))
            return None
    return add("email", to, email_payload(subject, text, html=html, reply_to=reply_to, headers=headers,
                                          capability=capability), **kw)


def redacted(payload: dict) -> dict:
    """What stays of a capability e-mail after its last attempt: the subject only."""
    return {"subject": payload.get("subject"), "text": None, "html": None, "reply_to": None,
            "headers": {}, "capability": True, "redacted": True}


def _final(msg: OutboxMessage, **values) -> dict:
    """Column values that end a message's attempts (its secret body erased if it has one)."""
    if (msg.payload or {}).get("capability"):
        values["payload"] = redacted(msg.payload)
    return values


def add_webhook(url: str, event_type: str, data: dict, *, secret: str | None = None,
                **kw) -> OutboxMessage:
    """A Standard Webhooks delivery: body ``{"type", "timestamp", "data"}`` signed with
    ``secret`` (``whsec_…``) when given."""
    return add("webhook", url, webhook_payload(event_type, data, secret=secret), **kw)


def add_chat(url: str, text: str, **kw) -> OutboxMessage:
    return add("chat", url, chat_payload(text), **kw)


def dispatch(*message_ids: str) -> None:
    """Enqueue delivery of committed messages (inline when there is no Redis)."""
    from app.tasks import enqueue

    for mid in message_ids:
        enqueue("app.tasks.outbox.deliver", mid)


def _backoff(attempt: int) -> timedelta:
    return timedelta(seconds=min(BACKOFF_CAP, BACKOFF_BASE * 2 ** max(0, attempt - 1)))


def _claim(message_id: str, now: datetime) -> OutboxMessage | None:
    """Atomically take the next attempt of a due pending message (None if not due); its
    own unit of work, committed before the attempt's network I/O."""
    with unit_of_work():
        res = db.session.execute(
            update(OutboxMessage)
            .where(OutboxMessage.id == message_id, OutboxMessage.status == "pending",
                   OutboxMessage.next_attempt_at <= now)
            .values(attempts=OutboxMessage.attempts + 1, next_attempt_at=now + LEASE)
            .execution_options(synchronize_session=False)
        )
    if res.rowcount != 1:
        return None
    return db.session.get(OutboxMessage, message_id, populate_existing=True)


def signed_webhook_request(msg_id: str, payload: dict, sent_at: datetime) -> tuple[bytes, dict]:
    """Body and headers of a Standard Webhooks delivery (also used for previews/tests)."""
    body = orjson.dumps({"type": payload["type"], "timestamp": sent_at.isoformat(),
                         "data": payload["data"]})
    headers = {"Content-Type": "application/json", "User-Agent": "gateway-webhooks/1.0",
               **crypto.webhook_headers(msg_id, sent_at, body, payload.get("secret"))}
    return body, headers


def _send(msg: OutboxMessage) -> None:
    if msg.channel == "email":
        p = msg.payload
        if p.get("redacted"):
            raise RuntimeError("the message's secret body was erased after its last attempt")
        mailer.send(mailer.build(msg.destination, p["subject"], p["text"], html=p.get("html"),
                                 reply_to=p.get("reply_to"), headers=p.get("headers"),
                                 message_id=msg.id))
        return
    permissive = netguard.allow_private()
    netguard.validate_url(msg.destination, field="destination", resolve=False, allow_private_hosts=permissive)
    if msg.channel == "webhook":
        body, headers = signed_webhook_request(msg.id, msg.payload, utcnow())
    elif msg.channel == "chat":
        body, headers = orjson.dumps({"text": msg.payload["text"]}), {"Content-Type": "application/json"}
    else:
        raise ValueError(f"unknown channel {msg.channel}")
    # The address is screened on the connection that sends (no second lookup to rebind);
    # only the status matters, so the receiver's body is never read.
    with (http.session("webhooks", allow_private_hosts=permissive) as s,
          s.post(msg.destination, data=body, headers=headers, timeout=WEBHOOK_TIMEOUT, stream=True) as resp):
        status = resp.status_code
    if not 200 <= status < 300:
        raise RuntimeError(f"HTTP {status}")


def deliver(message_id: str) -> str:
    """One delivery attempt; returns the message's resulting status (or 'skipped')."""
    now = utcnow()
    msg = _claim(message_id, now)
    if msg is None:
        return "skipped"
    try:
        _send(msg)
    except Exception as exc:  # noqa: BLE001 - any failure is recorded and retried
        err = f"{type(exc).__name__}: {exc}"[:1000]
        done = msg.attempts >= msg.max_attempts
        with unit_of_work():
            db.session.execute(
                update(OutboxMessage).where(OutboxMessage.id == msg.id).values(
                    **(_final(msg) if done else {}), status="failed" if done else "pending",
                    last_error=err, next_attempt_at=utcnow() + _backoff(msg.attempts))
            )
        # as ``status`` shows it: a webhook's or chat's URL (often its credential) by its host only;
        # and, unlike the operator's report, an e-mail address masked, in the error too
        destination, shown = _shown(msg.channel, msg.destination, err)
        log.warning("outbox %s to %s attempt %s failed: %s", msg.id, mask_emails(destination), msg.attempts,
                    mask_emails(shown))
        return "failed" if done else "pending"
    with unit_of_work():
        db.session.execute(
            update(OutboxMessage).where(OutboxMessage.id == msg.id).values(
                **_final(msg, status="delivered", delivered_at=utcnow(), last_error=None))
        )
    return "delivered"


def due_ids(limit: int = 500, now: datetime | None = None) -> list[str]:
    now = now or utcnow()
    return list(db.session.execute(
        select(OutboxMessage.id).where(OutboxMessage.status == "pending",
                                       OutboxMessage.next_attempt_at <= now)
        .order_by(OutboxMessage.next_attempt_at).limit(limit)
    ).scalars())


def sweep(limit: int = 500) -> int:
    """Re-enqueue every pending message that is due; returns how many."""
    ids = due_ids(limit)
    dispatch(*ids)
    return len(ids)


def _shown(channel: str, destination: str, error: str | None) -> tuple[str, str | None]:
    """A destination, and its last error, as an operator report shows them: an e-mail
    address as it is; a webhook's or team chat's URL by its scheme and host only, its path
    cut from the error too (such a URL is often its credential: a Slack incoming webhook)."""
    if channel == "email":
        return destination, error
    scheme, _, rest = destination.partition("://")
    authority, slash, path = rest.partition("/")
    if error and slash and path:
        error = error.replace("/" + path, "/...").replace("/" + path.split("?", 1)[0], "/...")
    return f"{scheme}://{authority.rsplit('@', 1)[-1]}/...", error


def status(limit: int = 20) -> dict:
    """The outbox at a glance (``flask outbox status``): ``counts`` by channel and status;
    ``oldest_pending``, the message waiting longest (its age: a growing one means nothing
    delivers, no worker or sweep, or its destination keeps failing), with ``pending_due``,
    how many wait for an attempt already due; ``failing``: up to ``limit`` messages given up
    (``failed``) or pending after a failed attempt, newest first, with ``failing_total``."""
    now = utcnow()
    counts: dict[str, dict[str, int]] = {}
    for channel, state, n in db.session.execute(
            select(OutboxMessage.channel, OutboxMessage.status, func.count())
            .group_by(OutboxMessage.channel, OutboxMessage.status).order_by(OutboxMessage.channel)):
        counts.setdefault(channel, {})[state] = n
    pending = OutboxMessage.status == "pending"
    oldest = db.session.execute(select(OutboxMessage).where(pending)
                                .order_by(OutboxMessage.created_at).limit(1)).scalar_one_or_none()
    failing_q = or_(OutboxMessage.status == "failed", and_(pending, OutboxMessage.last_error.is_not(None)))
    failing = db.session.execute(select(OutboxMessage).where(failing_q)
                                 .order_by(OutboxMessage.created_at.desc(), OutboxMessage.id).limit(limit)).scalars()

    def row(m: OutboxMessage) -> dict:
        destination, error = _shown(m.channel, m.destination, m.last_error)
        return {"id": m.id, "channel": m.channel, "destination": destination,
                "source": m.source, "status": m.status, "attempts": m.attempts, "max_attempts": m.max_attempts,
                "last_error": error, "created_at": m.created_at.isoformat(),
                "next_attempt_at": m.next_attempt_at.isoformat() if m.status == "pending" else None}

    return {
        "counts": counts,
        "oldest_pending": None if oldest is None else {
            **row(oldest), "age_seconds": int((now - oldest.created_at).total_seconds())},
        "pending_due": db.session.execute(select(func.count()).select_from(OutboxMessage).where(
            pending, OutboxMessage.next_attempt_at <= now)).scalar_one(),
        "failing_total": db.session.execute(select(func.count()).select_from(OutboxMessage)
                                            .where(failing_q)).scalar_one(),
        "failing": [row(m) for m in failing],
    }


def cancel(account_id: str, channel: str, reason: str) -> int:
    """In the caller's transaction: end every message of ``account_id`` on ``channel`` still
    waiting (``pending``) or given up (``failed``, which ``redeliver`` would re-arm) as
    ``cancelled``, never to be sent (a disabled agent's webhook events:
    agents.disable); how many."""
    res = db.session.execute(
        update(OutboxMessage).where(OutboxMessage.account_id == account_id, OutboxMessage.channel == channel,
                                    OutboxMessage.status.in_(("pending", "failed")))
        .values(status="cancelled", last_error=reason[:500]).execution_options(synchronize_session=False))
    return res.rowcount


@transactional
def redeliver(message_id: str | None = None, *, all_failed: bool = False) -> int:
    """Re-arm failed messages (one, or all) for another round of attempts."""
    q = update(OutboxMessage).where(OutboxMessage.status == "failed")
    if message_id:
        q = q.where(OutboxMessage.id == message_id)
    elif not all_failed:
        return 0
    res = db.session.execute(q.values(status="pending", attempts=0, next_attempt_at=utcnow())
                             .execution_options(synchronize_session=False))
    return res.rowcount

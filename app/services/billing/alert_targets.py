"""Alert e-mail targets: an address other than the account's own must be confirmed by
its owner before any alert mail goes there (docs/security.md "Unverified alert targets").

``create_alert`` calls ``require_confirmation`` in its unit of work: when the target
differs from the account's e-mail, the alert starts as ``pending_verification``, a
single-use token (``tokens.ALERT_CONFIRM``, valid ``CONFIRM_TTL``) is issued for it and a
confirmation e-mail with a fixed text (nothing the requester typed, apart from the
account's own address) goes to the target. Evaluation skips pending alerts, so they send
nothing. ``confirm`` redeems the token (once) and makes the alert ``active``.
"""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from app.extensions import db
from app.models import Alert
from app.services.accounts import accounts
from app.services.platform import outbox, tokens
from app.services.platform.uow import transactional

ACTIVE = "active"
PENDING = "pending_verification"
CONFIRM_TTL = timedelta(days=7)
CONFIRM_PATH = "/alerts/confirm"


def require_confirmation(alert: Alert) -> None:
    """Set ``alert.status`` (in the caller's unit of work): ``active``, or
    ``pending_verification`` plus a confirmation e-mail for an e-mail target that is not
    the account's own address."""
    owner = accounts.get_account(alert.account_id).email
    if alert.channel != "email" or (owner and accounts.normalize_email(owner) == alert.target):
        alert.status = ACTIVE
        return
    alert.status = PENDING
    token = tokens.issue(tokens.ALERT_CONFIRM, alert.id, CONFIRM_TTL)
    outbox.add_email(
        alert.target, "Confirm spend alert e-mails",
        f"The gateway account {owner or alert.account_id} asked to send spend alert e-mails "
        f"to this address.\n\nTo allow it, open this link and press the button (valid 7 days):\n"
        f"{tokens.link(CONFIRM_PATH + '?token=' + token)}\n\n"
        "If you did not expect this, ignore this e-mail: nothing will be sent to you.\n",
        source=f"alert_confirm:{alert.id}", account_id=alert.account_id, capability=True,
        throttle="ALERT_CONFIRM_EMAIL_RATE_LIMIT")


def pending_alert(token: str | None) -> Alert | None:
    """The alert a usable token names (for the confirmation page), else None: pending, or
    already active because its target allowed another alert of the account (``confirm``)."""
    row = tokens.lookup(tokens.ALERT_CONFIRM, token)
    if not tokens.is_usable(row):
        return None
    alert = db.session.get(Alert, row.subject)
    return alert if alert is not None and alert.deleted_at is None else None


def confirmed_alert(token: str | None) -> Alert | None:
    """The alert a used token confirmed, when it is active still (a second press of the
    page's button), else None."""
    alert_id = tokens.used_subject(tokens.ALERT_CONFIRM, token)
    alert = db.session.get(Alert, alert_id) if alert_id else None
    return alert if alert is not None and alert.status == ACTIVE and alert.deleted_at is None else None


@transactional
def confirm(token: str | None) -> Alert | None:
    """Redeem a confirmation token (single use): the target allows the account's spend alerts
    (the page's words), so every pending alert of the account to that address becomes active,
    the token's own included — an alert whose confirmation mail the per-target limit dropped,
    or a second link to the same address, no longer stays silent. Returns the token's alert,
    or None when the token is unknown, expired or used, or the alert was deleted."""
    redeemed = tokens.consume(tokens.ALERT_CONFIRM, token)
    if redeemed is None:
        return None
    alert = db.session.get(Alert, redeemed.subject)
    if alert is None or alert.deleted_at is not None:
        return None
    db.session.execute(
        update(Alert).where(Alert.account_id == alert.account_id, Alert.channel == "email",
                            Alert.target == alert.target, Alert.status == PENDING, Alert.deleted_at.is_(None))
        .values(status=ACTIVE).execution_options(synchronize_session=False))
    return db.session.get(Alert, alert.id, populate_existing=True)

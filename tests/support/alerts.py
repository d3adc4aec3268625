"""Alert test helper: confirm an alert's e-mail target through the real confirmation path
(a token of purpose ``alert_confirm`` redeemed by ``alert_targets.confirm``), for tests
about evaluation and delivery whose targets are not the account's own address."""
from __future__ import annotations

from app.extensions import db
from app.services.billing import alert_targets
from app.services.platform import tokens
from app.services.platform.uow import unit_of_work


def confirm(alert_id: str) -> None:
    """Make ``alert_id`` active as its target's owner would (inside an app context)."""
    with unit_of_work():
        token = tokens.issue(tokens.ALERT_CONFIRM, alert_id, 60)
    alert_targets.confirm(token)


def confirm_target(app, alert_id: str) -> None:
    """``confirm`` in its own app context."""
    with app.app_context():
        confirm(alert_id)
        db.session.remove()

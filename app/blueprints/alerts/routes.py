"""Spend alert endpoints (SPEC endpoints 21–24)."""
from app.auth import principal
from app.blueprints.alerts.schemas import (AlertCreatedSchema, AlertCreateSchema,
                                           AlertDeletedSchema, AlertEventListSchema,
                                           AlertListSchema)
from app.blueprints.fields import Extended
from app.blueprints.routing import endpoint
from app.extensions import Blueprint
from app.services.billing import alerts

blp = Blueprint("alerts", __name__, url_prefix="/api/alerts",
                description="Spend alerts: rules evaluated every minute, delivered by e-mail, "
                            "signed webhook or team chat.")


@endpoint(blp, "", "get", "alerts:read", ok=AlertListSchema, name="AlertsView")
def list_alerts():
    """List the account's alerts (oldest first; never the webhook secret)."""
    return {"alerts": alerts.list_alerts(principal().account_id, principal().mode)}


@endpoint(blp, "", "post", "alerts:write", body=AlertCreateSchema, ok=AlertCreatedSchema, status=201,
          errors={409: "`alert_limit_reached`: the account already has the maximum number of alerts (50)."},
          name="AlertCreateView")
def create_alert(body):
    """Create an alert. Webhook alerts get a signing secret `whsec_…`, returned here only.

    At most 50 alerts per account (409 `alert_limit_reached`). A `target` that is not an
    e-mail address (channel `email`) or an https URL on a public host (`webhook`,
    `chat`) is 400 `invalid_request`.
    """
    alert, secret = alerts.create_alert(principal().account_id, mode=principal().mode, **body)
    return Extended(alert, secret=secret)


@endpoint(blp, "/events", "get", "alerts:read", ok=AlertEventListSchema)
def alert_events():
    """The 100 most recent alert firings of the account, newest first, each with its
    delivery status and attempts."""
    return {"events": alerts.list_events(principal().account_id, mode=principal().mode)}


@endpoint(blp, "/<id:alert_id>", "delete", "alerts:write", ok=AlertDeletedSchema, errors={404: None},
          name="AlertView")
def delete_alert(alert_id):
    """Delete an alert: it stops being evaluated; its past events stay listed.
    Unknown, already deleted or another account's id → 404."""
    row = alerts.delete_alert(principal().account_id, alert_id, principal().mode)
    return {"deleted": True, "id": row.id}

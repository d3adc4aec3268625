"""Spend alert endpoints (SPEC endpoints 21–24) and the page confirming an alert e-mail
target (the link e-mailed to a target other than the account's own address)."""
from flask.views import MethodView

from app import pages
from app.auth import principal
from app.blueprints.alerts.schemas import (AlertCreatedSchema, AlertCreateHeadersSchema, AlertCreateSchema,
                                           AlertDeletedSchema, AlertEventListSchema,
                                           AlertListSchema, AlertQuerySchema)
from app.blueprints.fields import Extended
from app.blueprints.newsletter.schemas import TokenFormSchema, TokenQuerySchema
from app.blueprints.routing import acting_account, endpoint, link
from app.extensions import Blueprint
from app.services.billing import alert_targets, alerts
from app.services.platform import netguard

blp = Blueprint("alerts", __name__, url_prefix="/api/alerts",
                description="Spend alerts: rules evaluated every minute, delivered by e-mail, "
                            "signed webhook or team chat.")
pages_blp = Blueprint("alert_pages", __name__, url_prefix="/alerts",
                      description="HTML page opened from an alert target's confirmation e-mail.")

_INVALID = ("This link is invalid, has expired or was already used.",
            "Nothing will be sent to this address unless a new request is confirmed.")


@endpoint(blp, "", "get", "alerts:read", query=AlertQuerySchema, ok=AlertListSchema, name="AlertsView")
def list_alerts(query):
    """List the account's (or with `org_id` the organisation's) alerts (oldest first; never
    the webhook secret)."""
    return {"alerts": alerts.list_alerts(acting_account(query.get("org_id"), "alerts:read"), principal().mode)}


@endpoint(blp, "", "post", "alerts:write", body=AlertCreateSchema, ok=AlertCreatedSchema, status=201,
          errors={409: "`alert_limit_reached`: the account already has the maximum number of alerts (50).",
                  422: "An `email` `target` longer than 254 characters once trimmed (`unprocessable`); a "
                       "`webhook` / `chat` `target`: " + netguard.REFUSED_DOC},
          headers=AlertCreateHeadersSchema, idempotent=True, name="AlertCreateView", links={"DeleteAlert": link(
              "/api/alerts/{alert_id}", "delete", "Delete the alert just created.", alert_id="$response.body#/id")})
def create_alert(body):
    """Create an alert. Webhook alerts get a signing secret `whsec_…`, returned here only.

    At most 50 alerts per account (409 `alert_limit_reached`). A `target` that is not an
    e-mail address (channel `email`) or an https URL on a public host (`webhook`,
    `chat`) is 400 `invalid_request`. With `org_id` the alert watches the organisation.
    With an `Idempotency-Key` a retry creates no second alert: it answers the first
    response (`Idempotent-Replayed: true`).
    """
    account_id = acting_account(body.pop("org_id", None), "alerts:write")
    alert, secret = alerts.create_alert(account_id, mode=principal().mode, **body)
    return Extended(alert, secret=secret)


@endpoint(blp, "/events", "get", "alerts:read", query=AlertQuerySchema, ok=AlertEventListSchema)
def alert_events(query):
    """The 100 most recent alert firings of the account (or organisation), newest first,
    each with its delivery status and attempts."""
    return {"events": alerts.list_events(acting_account(query.get("org_id"), "alerts:read"), mode=principal().mode)}


@endpoint(blp, "/<id:alert_id>", "delete", "alerts:write", query=AlertQuerySchema, ok=AlertDeletedSchema,
          errors={404: None}, name="AlertView")
def delete_alert(query, alert_id):
    """Delete an alert: it stops being evaluated; its past events stay listed.
    Deleting it again answers the same 200 and changes nothing (a retry whose first answer
    was lost), as revoking a key twice does. Unknown or another account's id → 404."""
    row = alerts.delete_alert(acting_account(query.get("org_id"), "alerts:write"), alert_id, principal().mode)
    return {"deleted": True, "id": row.id}


@pages_blp.route("/confirm")
class AlertConfirmPage(MethodView):
    @pages.page(pages_blp, "Page with a button that allows alert e-mails to this address.",
                (200, 404), schema=TokenQuerySchema, location="query")
    def get(self, query):
        """Confirmation page (the e-mailed link). Shows a button; opening it changes nothing."""
        if alert_targets.pending_alert(query["token"]) is None:
            return pages.render("Link not valid", *_INVALID, status=404)
        return pages.render("Allow alert e-mails",
                            "Press the button to receive this account's spend alerts at this address.",
                            pages.form("/alerts/confirm", "Allow alert e-mails", {"token": query["token"]}))

    @pages.page(pages_blp, "The alert is active.", (200, 404), schema=TokenFormSchema, location="form")
    def post(self, form):
        """Confirm the alert target (the page's button). The token works once; pressed again
        (its alert active) the page says the e-mails are allowed, with status 404."""
        if alert_targets.confirm(form["token"]) is None:
            if alert_targets.confirmed_alert(form["token"]) is not None:
                return pages.render("Alert e-mails allowed", "This link was already used: this address "
                                    "receives the alert's e-mails.", status=404)
            return pages.render("Link not valid", *_INVALID, status=404)
        return pages.render("Alert e-mails allowed", "This address will receive the alert's e-mails.")

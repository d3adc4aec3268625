"""Newsletter (SPEC endpoints 32–33), the double opt-in confirmation page and the
RFC 8058 one-click unsubscribe endpoint."""
from flask.views import MethodView

from app import cors, pages
from app.blueprints.newsletter.schemas import (OneClickFormSchema, StatusSchema, SubscribeSchema, TokenFormSchema,
                                          TokenQuerySchema, UnsubscribeSchema)
from app.blueprints.routing import endpoint
from app.extensions import Blueprint
from app.services.platform import tokens as emailtokens
from app.services.public import newsletter

blp = Blueprint("email", __name__, url_prefix="/api/email",
                description="Newsletter lists: double opt-in subscribe, unsubscribe.")
cors.public_endpoints(blp, "email.SubscribeView", "email.UnsubscribeView")  # a website's forms
pages_blp = Blueprint("email_pages", __name__, url_prefix="/email",
                      description="HTML pages opened from newsletter e-mails.")

_INVALID = ("This link is invalid, has expired or was already used.",
            "Subscribe again to get a new confirmation e-mail.")


@endpoint(blp, "/subscribe", "post", public=True, ip_limit="SUBSCRIBE_RATE_LIMIT",
          email_limit="SUBSCRIBE_EMAIL_RATE_LIMIT", body=SubscribeSchema, ok=StatusSchema, status=202)
def subscribe(body):
    """Subscribe to a list with double opt-in. Subscriptions are per mailbox: spellings of
    one inbox (case, a `+tag`, Gmail's dots) are one subscriber. The answer is identical
    whether the mailbox is new, pending or already subscribed; new and pending ones get a
    confirmation e-mail at the address given, whose link (single use, valid 48 h) opens a
    page with a confirm button; confirming makes that address the one list e-mail goes to."""
    return newsletter.subscribe(body["email"], body.get("list"))


@endpoint(blp, "/unsubscribe", "post", public=True, ip_limit="SUBSCRIBE_RATE_LIMIT", body=UnsubscribeSchema,
          ok=StatusSchema)
def unsubscribe(body):
    """Remove the address's mailbox (every spelling of the inbox: case, a `+tag`, Gmail's
    dots) from every list. Same answer whether or not it was subscribed."""
    return newsletter.unsubscribe(body["email"])


@pages_blp.route("/confirm")
class ConfirmPage(MethodView):
    @pages.page(pages_blp, "Page with a button that confirms the subscription.",
                (200, 404), schema=TokenQuerySchema, location="query")
    def get(self, query):
        """Confirmation page (the e-mailed link). Shows a button; opening it changes nothing.
        A used link of a subscribed address (opened again after confirming) says so, with
        status 404, as the button pressed twice does."""
        if newsletter.check_token(query["token"]) is None:
            return _not_pending(query["token"])
        return pages.render("Confirm your subscription",
                            "Press the button to start receiving e-mail from us.",
                            pages.form("/email/confirm", "Confirm subscription",
                                       {"token": query["token"]}))

    @pages.page(pages_blp, "The subscription is confirmed.", (200, 404), schema=TokenFormSchema,
                location="form")
    def post(self, form):
        """Confirm the subscription (the page's button). The token works once; pressed again
        (still subscribed) the page says so, with status 404."""
        sub = newsletter.confirm(form["token"])
        if sub is None:
            return _not_pending(form["token"])
        return _subscribed(sub)


def _not_pending(token: str):
    """The 404 page of a link that confirms nothing: "already used" when it confirmed a
    subscription that still stands (whoever holds it confirmed that address), else invalid."""
    sub = newsletter.confirmed_subscription(token)
    if sub is None:
        return pages.render("Link not valid", *_INVALID, status=404)
    return _subscribed(sub, "This link was already used: ", status=404)


def _subscribed(sub, lead: str = "", status: int = 200):
    return pages.render("You are subscribed", f"{lead}{sub.email} will receive {newsletter.LIST_NAMES[sub.list]}.",
                        "Every e-mail has a one-click unsubscribe link.", status=status)


@pages_blp.route("/unsubscribe/<string(maxlength=600):token>")
class OneClickUnsubscribe(MethodView):
    @pages.page(pages_blp, "Page with a button that unsubscribes the address.", (200, 404))
    def get(self, token):
        """The `List-Unsubscribe` link opened in a browser: a page with a button."""
        if emailtokens.unsubscribe_email(token) is None:
            return pages.render("Link not valid", "This unsubscribe link is not valid.", status=404)
        return pages.render("Unsubscribe", "Stop all list e-mail to this address?",
                            pages.form(f"/email/unsubscribe/{token}", "Unsubscribe",
                                       {"List-Unsubscribe": "One-Click"}))

    @pages.page(pages_blp, "The address is unsubscribed from every list.", (200, 404),
                schema=OneClickFormSchema, location="form")
    def post(self, _form, token):
        """RFC 8058 one-click unsubscribe (`List-Unsubscribe=One-Click`): removes the
        mailbox of the address the signed token names from every list."""
        if not newsletter.one_click_unsubscribe(token):
            return pages.render("Link not valid", "This unsubscribe link is not valid.", status=404)
        return pages.render("Unsubscribed", "You will receive no further list e-mail from us.")

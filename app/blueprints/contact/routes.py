"""Contact form (SPEC endpoint 31)."""
from flask import request
from flask.views import MethodView

from app import cors
from app.auth import public
from app.blueprints.contact.schemas import ContactFormSchema, ContactQueuedSchema
from app.blueprints.routing import document_errors
from app.extensions import Blueprint
from app.ratelimits import count_email, per_ip
from app.services.public import contact

blp = Blueprint("contact", __name__, url_prefix="/api", description="Contact the sales team.")
cors.public_endpoints(blp, "contact.ContactView")  # a website's contact form posts here


@blp.route("/contact")
class ContactView(MethodView):
    @public
    @per_ip("CONTACT_RATE_LIMIT")
    @blp.arguments(ContactFormSchema)
    @blp.response(202, ContactQueuedSchema)
    @document_errors(blp, {429: "Per-IP (`CONTACT_RATE_LIMIT`) or per-address "
                                "(`CONTACT_EMAIL_RATE_LIMIT`) limit reached."})
    def post(self, body):
        """Send a message to sales. It is stored, then e-mailed to `SALES_EMAIL` with
        `Reply-To` set to the sender. The same message from the same address again within
        10 minutes (a double click, a retry) answers the first one's `id`; nothing is sent twice,
        and the repeat does not count against the address's limit (`CONTACT_EMAIL_RATE_LIMIT`)."""
        return contact.submit(body["email"], body["message"], body.get("name"),
                              honeypot=body.get("website"), client_ip=request.remote_addr,
                              admit=lambda: count_email("CONTACT_EMAIL_RATE_LIMIT", body["email"]))

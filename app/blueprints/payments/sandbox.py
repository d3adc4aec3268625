"""The sandbox processor's hosted checkout page (HTML, served by the app). It sends the
security headers of every HTML page (``app.pages.HEADERS``: CSP, frame denial, no
referrer, no caching), its form may post only to itself and to the return URL's origin,
and it redirects only to a return URL that passes ``platform.redirects`` now."""
from flask import make_response, redirect, render_template_string
from flask.views import MethodView

from app import pages
from app.auth import public
from app.blueprints.payments.schemas import PaymentSchema, SandboxActionSchema
from app.extensions import Blueprint
from app.services.billing import sandbox_checkout
from app.services.platform import redirects

blp = Blueprint("sandbox", __name__, url_prefix="/pay/sandbox",
                description="The sandbox processor's hosted checkout page (HTML, no credential: "
                            "the unguessable session id is the capability).")

_HTML = {"description": "HTML page", "content": {"text/html": {"schema": {"type": "string"}}}}


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sandbox checkout</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font-family:system-ui,sans-serif;max-width:28rem;margin:3rem auto;padding:0 1rem}
.box{border:1px solid #ccc;border-radius:8px;padding:1.5rem}.amt{font-size:2rem;font-weight:600}
.msg{padding:.6rem;border-radius:6px;background:#f3f3f3}.bad{background:#fde2e2}.ok{background:#dff5e1}
button{font-size:1rem;padding:.5rem 1rem;margin-right:.5rem}label{display:block;margin:.3rem 0}</style></head>
<body><div class="box"><p><strong>Sandbox checkout</strong> — test mode, no real money moves.</p>
<p>{{ payment.product or "Gateway credits" }}</p>
<p class="amt">${{ "%d.%02d"|format(payment.amount_cents // 100, payment.amount_cents % 100) }}</p>
{% if message %}<p class="msg {{ 'ok' if result in ('paid','processing') else '' if result == 'authenticate' else 'bad' }}">{{ message }}</p>{% endif %}
<p>Status: <strong>{{ payment.status }}</strong></p>
{% if result == 'authenticate' %}
<form method="post"><p>3-D Secure test page: complete or fail the authentication your bank asks for.</p>
<input type="hidden" name="payment_method" value="{{ method }}">{% if save %}<input type="hidden" name="save_method" value="true">{% endif %}
<p><button name="action" value="authenticate">Complete authentication</button><button name="action" value="fail_authentication">Fail authentication</button></p></form>
{% elif payment.status == 'pending' and not closed %}
<form method="post">{% for pm, spec in methods.items() %}
<label><input type="radio" name="payment_method" value="{{ pm }}" {{ 'checked' if loop.first }}>
 {{ pm }} ({{ spec[1] }} ···· {{ spec[2] }}{% if spec[3] != 'succeeds' %}, {{ spec[3]|replace('_', ' ') }}{% endif %})</label>
{% endfor %}<label><input type="checkbox" name="save_method" value="true"> Save this payment method for later payments</label>
<p><button name="action" value="pay">Pay</button><button name="action" value="cancel">Cancel</button></p></form>
{% endif %}
{% if return_url %}<p><a href="{{ return_url }}">Return to the merchant</a></p>{% endif %}
</div></body></html>"""


_PAYMENT = PaymentSchema()


def _render(page: dict, payment, return_url: str | None, **context):
    """The page with the HTML security headers; the CSP lets the form's redirect reach
    the return URL's origin (browsers apply ``form-action`` to the redirect too)."""
    resp = make_response(render_template_string(_PAGE, payment=_PAYMENT.dump(payment),
                                                methods=page["methods"], return_url=return_url, **context))
    resp.headers.update(pages.HEADERS)
    if return_url:
        resp.headers["Content-Security-Policy"] = pages.HEADERS["Content-Security-Policy"].replace(
            "form-action 'self'", f"form-action 'self' {redirects.origin(return_url)}")
    return resp


def _return_url(page: dict) -> str | None:
    url = page["return_url"]
    return url if redirects.is_safe(url) else None

@blp.route("/checkout/<string:session_id>")
class SandboxCheckoutView(MethodView):
    @public
    @blp.doc(responses={"200": _HTML, "404": {"description": "Unknown session"}})
    def get(self, session_id):
        """The sandbox hosted checkout page: amount, test payment methods, Pay / Cancel."""
        page = sandbox_checkout.sandbox_checkout_page(session_id)
        closed = page["awaiting_settlement"]
        message = "Bank payment submitted; waiting for settlement." if closed else None
        return _render(page, page["payment"], _return_url(page), message=message,
                       result="processing" if closed else None, closed=closed)

    @public
    @blp.arguments(SandboxActionSchema, location="form")
    @blp.doc(responses={"200": _HTML, "303": {"description": "Redirect to `return_url` when done"},
                                "404": {"description": "Unknown session"}})
    def post(self, form, session_id):
        """Pay (with a sandbox test method) or cancel. Paying delivers a signed
        `checkout.session.completed` event through the webhook code; ACH settles later. A card
        that requires 3-D Secure answers its challenge first (complete or fail it)."""
        out = sandbox_checkout.sandbox_checkout_action(session_id, form["action"], form.get("payment_method"),
                                                       save_method=form.get("save_method", False))
        page = sandbox_checkout.sandbox_checkout_page(session_id)
        done = _return_url(page)
        if out["result"] in ("paid", "canceled", "processing") and done:
            sep = "&" if "?" in done else "?"
            status = "cancel" if out["result"] == "canceled" else "success"
            return redirect(f"{done}{sep}checkout={status}&payment_id={out['payment'].id}", code=303)
        return _render(page, out["payment"], done, message=out["message"], result=out["result"],
                       closed=out["result"] not in ("declined", "authenticate"), method=out.get("method"),
                       save=out.get("save"))

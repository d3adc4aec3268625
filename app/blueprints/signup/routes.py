"""Self-serve sign-up (SPEC part 1 item 8): e-mail verification, then an account with
promotional credit and its first key, shown once."""
from flask.views import MethodView
from markupsafe import Markup, escape

from app import cors, pages
from app.blueprints.newsletter.schemas import StatusSchema, TokenFormSchema, TokenQuerySchema
from app.blueprints.signup.schemas import SignupCompletedSchema, SignupConfirmSchema, SignupSchema
from app.errors import DomainError
from app.blueprints.routing import endpoint
from app.extensions import Blueprint
from app.blueprints.console import web
from app.services.accounts import console, signup

blp = Blueprint("signup", __name__, url_prefix="/api/signup",
                description="Self-serve sign-up with e-mail verification and free credit.")
cors.public_endpoints(blp, "signup.SignupView")  # a website's sign-up form (the link's pages are ours)
pages_blp = Blueprint("signup_pages", __name__, url_prefix="/signup",
                      description="HTML pages opened from the sign-up e-mail.")


@endpoint(blp, "", "post", public=True, ip_limit="SIGNUP_RATE_LIMIT", email_limit="SIGNUP_EMAIL_RATE_LIMIT",
          body=SignupSchema, ok=StatusSchema, status=202, name="SignupView")
def start(body):
    """Start a sign-up: e-mails a verification link (single use, valid 24 h). The
    answer is identical whether or not the address already has an account (an
    existing account's address is told so by e-mail instead)."""
    return signup.start(body["email"])


@endpoint(blp, "/confirm", "post", public=True, ip_limit="PUBLIC_PAGE_RATE_LIMIT", body=SignupConfirmSchema,
          ok=SignupCompletedSchema, status=201, name="SignupConfirmView", errors={
              404: "`invalid_token`: unknown, expired or already used token.",
              409: "The address already has an account.", 429: None})
def confirm(body):
    """Redeem the verification token (JSON alternative to the page): creates the
    account with 1,000 cents of promotional credit and returns its first key once."""
    return signup.complete(body["token"])


def _key_page(completed: signup.SignupResult):
    result = SignupCompletedSchema().dump(completed)
    key = result["key"]["key"]
    return pages.render(
        "Your account is ready",
        f"Account {result['account']['id']} ({result['account']['email']}) has "
        f"{result['account']['balance_cents'] / 100:.2f} USD of free credit.",
        "Your API key is shown below once. Copy it now and keep it secret; we only store a hash.",
        Markup(f'<code id="api-key">{escape(key)}</code>'),
        Markup('<p class="muted">Use it as <b>Authorization: Bearer &lt;key&gt;</b>. '
               'See <a href="/docs">the API documentation</a>.</p>'
               '<p>You are signed in to the console: <a href="/dashboard">go to your dashboard</a>.</p>'))


@pages_blp.route("/confirm")
class SignupConfirmPage(MethodView):
    @pages.page(pages_blp, "Page with a button that creates the account.",
                (200, 404), schema=TokenQuerySchema, location="query")
    def get(self, query):
        """Sign-up confirmation page (the e-mailed link). Opening it changes nothing."""
        email = signup.check_token(query["token"])
        if email is None:
            return pages.render("Link not valid", "This sign-up link is invalid, has expired "
                                "or was already used.", "Sign up again to get a new link.", status=404)
        return pages.render("Create your account", f"Create the account for {email}?",
                            pages.form("/signup/confirm", "Create account and show my API key",
                                       {"token": query["token"]}))

    @pages.page(pages_blp, "The account is created; its first API key is shown once, and the "
                "browser is signed in to the console (its session cookie is set).",
                (200, 404, 409), schema=TokenFormSchema, location="form")
    def post(self, form):
        """Create the account (the page's button), show its first key once and sign the
        browser in to the console (the link proved the address, as a sign-in link does)."""
        try:
            completed = signup.complete(form["token"])
        except signup.TokenInvalid:
            if not signup.made_account(form["token"]):
                raise
            return pages.render("Your account already exists",
                                "This link already created your account; its first API key was shown "
                                "once, on the page that did.",
                                Markup('<p><a href="/login">Sign in to the console</a> to create a key.</p>'),
                                status=404)
        return web.set_session_cookie(_key_page(completed), console.sign_in_after_signup(completed.account.id))


@pages_blp.errorhandler(DomainError)
def _html_error(err: DomainError):
    """Domain errors of the sign-up pages (used/expired link, address taken) are pages too."""
    return pages.render("Could not create the account", err.message,
                        "Sign up again to get a new link." if err.status == 404 else
                        "Use your existing API keys.", status=err.status)

"""The customer console (issue 19): server-rendered HTML pages in the browser.

Not part of the JSON API: plain Flask routes, left out of the OpenAPI document
(``tests/test_openapi.py`` exempts the ``console.`` endpoints). ``web`` holds the
session, CSRF and header plumbing; ``pages`` the landing, sign-in and dashboard;
``account_pages`` keys and usage; ``money_pages`` billing and alerts; ``agent_pages``
agents and the admin review queue; ``charts`` the server-side SVG charts.
"""
from __future__ import annotations

from flask import Blueprint, current_app, g, request

bp = Blueprint("console", __name__, template_folder="templates", static_folder="static",
               static_url_path="/console/static")

# Endpoints a signed-out visitor may open (everything else redirects to /login).
PUBLIC = {"console.landing", "console.login", "console.login_confirm", "console.invite", "console.static",
          "console.favicon"}


@bp.before_request
def _gate():
    from app.blueprints.console import org_context, web

    web.load_session()
    org_context.load()
    if request.method == "POST" and not web.csrf_ok():
        return web.forbidden_page("The form expired or did not come from this site (missing or wrong "
                                  "CSRF token). Go back, reload the page and try again.")
    if request.endpoint not in PUBLIC and g.account is None:
        return web.login_redirect()
    if g.account is not None:  # who acts, for the audit log of any change a form makes
        from app.services.orgs import audit

        g.audit_token = audit.begin(org_context.actor())
    return None


@bp.teardown_request
def _stop_acting(_exc):
    token = g.pop("audit_token", None)
    if token is not None:
        from app.services.orgs import audit

        audit.end(token)


@bp.after_request
def _finish(response):
    from app.blueprints.console import web

    return web.finish(response)


# Paths of the JSON API and machine endpoints: their 404 stays the JSON error.
API_PREFIXES = ("/api/", "/v1/", "/openapi", "/docs", "/.well-known/", "/healthz", "/readyz", "/metrics")
# Paths of the pages opened from e-mail links (documented as text/html, 404 included): a
# path the router refuses there (a token past its length, a control character) is a page
# too, whatever the client accepts.
PAGE_PREFIXES = ("/email/", "/signup/", "/alerts/confirm", "/pay/sandbox/", "/invites/")


@bp.app_errorhandler(404)
def _not_found(err):
    """A browser asking for a page that does not exist (an unknown path, or a console page's
    unknown id) gets an HTML page with a way back; the API and non-browser clients keep the
    JSON error (``app.errors``)."""
    from flask import render_template

    from app.blueprints.console import web
    from app.errors import handle_http_exception

    wants_html = (request.accept_mimetypes.best_match(["application/json", "text/html"]) == "text/html"
                  or request.path.startswith(PAGE_PREFIXES))
    if request.blueprint != "console" and (request.path.startswith(API_PREFIXES) or not wants_html):
        return handle_http_exception(err)
    page = render_template("console/message.html", title="Page not found", not_found=True,
                           message="There is no page at this address.")
    return web.finish(current_app.make_response((page, 404)))


@bp.app_context_processor
def _context():
    from app.blueprints.console import web

    if not (request.blueprint == "console" and "account" in g):
        return {}
    from app.blueprints.console import org_context

    mode = web.mode()
    acct = g.get("org") or g.account  # the payer the console acts for (org_context)
    balance = None if acct is None else (acct.test_balance_micros if mode == "test" else acct.balance_micros)
    return {"csrf_token": web.csrf_token, "account": g.account, "mode": mode,
            "balance_micros": int(balance or 0), **org_context.template_context(mode)}


@bp.app_template_filter("usd")
def _usd(micros) -> str:
    """Micros as dollars to the micro-dollar (a $0.000123 chat completion is not "$0.00")."""
    from app.services.money.ledger import usd_precise

    return usd_precise(micros)


@bp.app_template_filter("when")
def _when(ts) -> str:
    return ts.strftime("%Y-%m-%d %H:%M UTC") if ts else "—"


from app.blueprints.console import account_pages, agent_pages, money_pages, org_pages, pages  # noqa: E402,F401
from app.blueprints.console import activity_pages  # noqa: E402,F401
from app.blueprints.console import billing_pages  # noqa: E402,F401  (issue 40 item 5)

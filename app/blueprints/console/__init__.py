"""The customer console (issue 19): server-rendered HTML pages in the browser.

Not part of the JSON API: plain Flask routes, left out of the OpenAPI document
(``tests/test_openapi.py`` exempts the ``console.`` endpoints). ``web`` holds the
session, CSRF and header plumbing; ``pages`` the landing, sign-in and dashboard;
``account_pages`` keys and usage; ``money_pages`` billing and alerts; ``agent_pages``
agents and the admin review queue; ``charts`` the server-side SVG charts.
"""
from __future__ import annotations

from flask import Blueprint, g, request

bp = Blueprint("console", __name__, template_folder="templates", static_folder="static",
               static_url_path="/console/static")

# Endpoints a signed-out visitor may open (everything else redirects to /login).
PUBLIC = {"console.landing", "console.login", "console.login_confirm", "console.static"}


@bp.before_request
def _gate():
    from app.blueprints.console import web

    web.load_session()
    if request.method == "POST" and not web.csrf_ok():
        return web.forbidden_page("The form expired or did not come from this site (missing or wrong "
                                  "CSRF token). Go back, reload the page and try again.")
    if request.endpoint not in PUBLIC and g.account is None:
        return web.login_redirect()
    return None


@bp.after_request
def _finish(response):
    from app.blueprints.console import web

    return web.finish(response)


@bp.app_context_processor
def _context():
    from app.blueprints.console import web

    if not (request.blueprint == "console" and "account" in g):
        return {}
    mode = web.mode()
    acct = g.account
    balance = None if acct is None else (acct.test_balance_micros if mode == "test" else acct.balance_micros)
    return {"csrf_token": web.csrf_token, "account": g.account, "mode": mode,
            "balance_micros": int(balance or 0)}


@bp.app_template_filter("usd")
def _usd(micros) -> str:
    """Micros as dollars to the micro-dollar (a $0.000123 chat completion is not "$0.00")."""
    from app.blueprints.console.charts import usd_precise

    return usd_precise(micros)


@bp.app_template_filter("when")
def _when(ts) -> str:
    return ts.strftime("%Y-%m-%d %H:%M UTC") if ts else "—"


from app.blueprints.console import account_pages, agent_pages, money_pages, pages  # noqa: E402,F401

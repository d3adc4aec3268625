"""Console pages: the landing page, passwordless sign-in (the e-mailed link opens a page
with a button: mail scanners prefetch GETs), sign-out, the live/test switch and the
dashboard. Handlers stay thin: services do the work."""
from __future__ import annotations

from flask import g, redirect, render_template, request, url_for

from app.blueprints.console import bp, charts, org_context, web
from app.errors import DomainError
from app.ratelimits import per_ip
from app.services.accounts import accounts
from app.services.accounts import console as console_svc
from app.services.billing import usage
from app.services.gateway import catalog, history
from app.services.money import ledger


@bp.get("/")
def landing():
    """What the service does, the catalog with prices, sign-in and API docs links."""
    modules = catalog.list_modules()
    return render_template("console/landing.html", modules=modules)


@bp.get("/favicon.ico")
def favicon():
    """The icon browsers ask for on a site's first page (a 404 would be an error in their
    console); the pages name the same SVG with ``<link rel="icon">``."""
    return bp.send_static_file("favicon.svg")


@bp.route("/login", methods=["GET", "POST"])
@per_ip("PUBLIC_PAGE_RATE_LIMIT")
def login():
    """GET: the e-mail form. POST: mail a link (or a sign-up link), same answer for all."""
    if g.account is not None and request.method == "GET":
        return redirect(web.safe_next(request.args.get("next")), code=303)
    if request.method == "GET":
        return render_template("console/login.html", errors={}, email="")
    email = (request.form.get("email") or "").strip()
    if not email or len(email) > 320 or "@" not in email or any(c.isspace() for c in email):
        return render_template("console/login.html", email=email,
                               errors={"email": "Enter the e-mail address of your account."}), 400
    try:
        console_svc.request_link(email)
    except DomainError as exc:  # an address the mailer refuses
        return render_template("console/login.html", email=email, errors={"email": exc.message}), 400
    return render_template("console/message.html", title="Check your inbox",
                           message="If an account uses this address, we sent it a sign-in link "
                                   "(otherwise, a link to create one). It works once, for a short time.")


@bp.route("/login/confirm", methods=["GET", "POST"])
@per_ip("PUBLIC_PAGE_RATE_LIMIT")
def login_confirm():
    """GET (the e-mailed link): a button, nothing used yet. POST: use the link once and
    start the session."""
    token = request.values.get("token", "")
    if request.method == "GET":
        address = console_svc.link_address(token)  # the confirmation names the account
        return render_template("console/confirm.html", token=token, usable=address is not None,
                               address=address), 200 if address else 404
    try:
        _account_id, session_token = console_svc.sign_in(token)
    except console_svc.SignInLinkInvalid as exc:
        return render_template("console/confirm.html", token="", usable=False, error=exc.message), 404
    g.session_token, g.new_pre = session_token, False
    return redirect(url_for("console.dashboard"), code=303)


@bp.post("/logout")
def logout():
    """End the session server-side and clear the cookie."""
    console_svc.sign_out(g.session_token)
    g.session_token, g.signed_out, g.account = None, True, None  # the page: no navigation, no "Sign out"
    return render_template("console/message.html", title="Signed out", message="You are signed out.",
                           signed_out=True)


@bp.post("/mode")
def switch_mode():
    """The live/test switch: which mode's usage, calls and keys the pages show."""
    target = "test" if request.form.get("mode") == "test" else "live"
    response = redirect(web.safe_next(request.form.get("next")), code=303)
    response.set_cookie(web.MODE_COOKIE, target, httponly=True, samesite="Lax",
                        secure=web._secure(), path="/")
    return response


def daily_charts(account_id: str, days: int, mode: str) -> dict:
    """The spend and calls bar charts of the last ``days`` days."""
    series = usage.daily_rows(account_id, days, mode=mode)
    return {"series": series,
            "spend": charts.bars(series, "spend_micros", ledger.usd_precise, empty_top=10_000),
            "calls": charts.bars(series, "calls", charts.count_fmt, whole=True)}


@bp.get("/dashboard")
def dashboard():
    """Balance, this month's calls and spend (against the plan in live mode), 30-day chart,
    top products and recent calls: every figure of the mode shown (test mode: test only)."""
    acct, mode = g.get("org") or g.account, web.mode()  # the payer the console acts for (org_context)
    plan_cents = accounts.plan_cents(acct.plan)
    start, end = usage.billing_period()
    current = usage.totals(acct.id, start, end, mode=mode)
    top = usage.by_product(acct.id, start, end, mode=mode)[:5]
    return render_template(
        "console/dashboard.html", current=current, plan_cents=plan_cents, top=top,
        meter=charts.meter(current["spend_micros"], plan_cents * 10_000), chart=daily_charts(acct.id, 30, mode),
        calls=history.recent_activity(acct.id, mode=mode, limit=10, filters=org_context.calls_filter()))

"""Console pages: billing (top up through the hosted checkout, payment history, the
saved card, credits and the connected wallet) and alerts (create and delete rules with
the SPEC fields, recent firings with their delivery status)."""
from __future__ import annotations

from flask import Response, abort, g, redirect, request, url_for

from app.blueprints.console import bp, org_context, web
from app.blueprints.alerts.schemas import AlertCreateSchema
from app.blueprints.console.account_pages import dollars_to_cents, field_errors
from app.blueprints.payments.schemas import MAX_AMOUNT_CENTS, CheckoutSchema
from app.errors import DomainError
from app.services.billing import alert_targets
from app.services.billing import alerts as alerts_svc
from app.services.billing import invoices, payments, wallets

ALERT_FIELDS = ("name", "metric", "op", "threshold", "window", "channel", "target")
# Each metric as the console shows it, with its unit: spend in dollars like every money
# field of the console (the API's ``spend_cents`` is in cents), the others as the API's.
ALERT_METRICS = {"spend_cents": ("spend", "USD"), "calls": ("calls", "count"), "error_rate": ("error rate", "%"),
                 "plan_pct": ("plan usage", "% of the plan")}
THRESHOLD_HINT = ("In the metric's unit: spend in dollars (e.g. 5 or 2.50), calls a count, error rate and plan "
                  "usage a percentage.")


@bp.get("/billing", endpoint="billing")
def _billing_page(status: int = 200, **extra):
    """Credits, top-up form, saved card, wallet and payment history.
    Also the page its forms answer with: a status and ``extra`` (errors, the form echoed back)."""
    from app.blueprints.console import billing_pages

    if (refused := org_context.guard(billing_pages.READ)):
        return refused
    payer = org_context.payer_id()  # the personal account or the chosen organisation
    ctx = {"payments": payments.history(payer, web.mode()),
           "wallet": wallets.get_wallet(payer), "errors": {}, "amount": "",
           "checkout": request.args.get("checkout"), "done": billing_pages.done_message(),
           "invoices": invoices.list_invoices(payer, web.mode(), limit=24)["invoices"],
           **billing_pages.context()}
    return web.page("console/billing.html", status, ctx, extra)


@bp.get("/billing/invoices/<string:invoice_id>.pdf")
def invoice_pdf(invoice_id):
    """An invoice of the paying account the console acts for (the person or the chosen
    organisation, its mode) as PDF; another's or none: 404."""
    from app.blueprints.console import billing_pages

    if (refused := org_context.guard(billing_pages.READ)):
        return refused
    inv = invoices.get_invoice(org_context.payer_id(), web.mode(), invoice_id)
    return Response(invoices.invoice_pdf(inv), mimetype="application/pdf",
                    headers={"Content-Disposition": f'attachment; filename="{inv.number}.pdf"'})


@bp.post("/billing/topup")
def topup():
    """Start a hosted checkout for the amount and send the browser to it; credits arrive
    when the processor confirms (the checkout returns here)."""
    if (refused := org_context.guard(("billing:write",))):
        return refused
    amount = (request.form.get("amount") or "").strip()
    cents = dollars_to_cents(amount.removeprefix("$"))  # exactly: a float made "inf" a 500, "10.005" $10.00
    if cents is None or not 100 <= cents <= MAX_AMOUNT_CENTS:  # the schema's range, said in dollars
        return _billing_page(400, errors={"amount": f"Enter an amount in dollars from 1.00 to "
                                                    f"{MAX_AMOUNT_CENTS // 100:,}, with at most 2 decimals "
                                                    "(e.g. 10 or 25.50)."}, amount=amount)
    body = CheckoutSchema().load({"amount_cents": cents, "return_url": url_for("console.billing", _external=True)})
    try:
        out = payments.create_checkout(org_context.payer_id(), web.mode(), body["amount_cents"],
                                       "Gateway credits", body["return_url"])
    except DomainError as exc:
        return _billing_page(400, errors={"amount": exc.message}, amount=amount)
    return redirect(out["url"], code=303)


@bp.get("/alerts", endpoint="alerts")
def _alerts_page(status: int = 200, **extra):
    """Alert rules and their recent firings.
    Also the page its forms answer with: a status and ``extra`` (errors, the form echoed back)."""
    if (refused := org_context.guard(("alerts:read",))):
        return refused
    acct, payer = g.account, org_context.payer_id()
    mode = web.mode()
    ctx = {"alerts": alerts_svc.list_alerts(payer, mode), "events": alerts_svc.list_events(payer, limit=20, mode=mode),
           "metrics": {m: "%s (%s)" % ALERT_METRICS[m] for m in alerts_svc.METRICS},
           "metric_names": {m: name for m, (name, _unit) in ALERT_METRICS.items()}, "threshold_hint": THRESHOLD_HINT,
           "ops": tuple(alerts_svc.OPS), "windows": tuple(alerts_svc.WINDOWS),
           "channels": alerts_svc.CHANNELS, "confirm_days": alert_targets.CONFIRM_TTL.days, "errors": {}, "form": {"target": acct.email or ""},
           "secret": None}
    return web.page("console/alerts.html", status, ctx, extra)


@bp.post("/alerts")
def create_alert():
    """Create a rule (a webhook's signing secret is shown once)."""
    if (refused := org_context.guard(("alerts:write",))):
        return refused
    form = {f: (request.form.get(f) or "").strip() for f in ALERT_FIELDS}
    threshold = web.form_number(form["threshold"])
    if form["metric"] == "spend_cents":  # typed in dollars: the API's cents, exactly
        cents = dollars_to_cents(form["threshold"].removeprefix("$"))
        if cents is None:
            return _alerts_page(400, errors={"threshold": "Enter the spend in dollars, at most 2 decimals (e.g. 5 or 2.50)."}, form=form)
        threshold = cents
    # the API's rules, the same input policy
    body, errors = web.load_form(AlertCreateSchema(), {**form, "threshold": threshold})
    if errors:
        return _alerts_page(400, errors=errors, form=form)
    try:
        _alert, secret = alerts_svc.create_alert(org_context.payer_id(), **body, mode=web.mode())
    except DomainError as exc:
        return _alerts_page(400, errors=field_errors(exc, ALERT_FIELDS), form=form)
    if secret:
        return _alerts_page(secret=secret)
    return redirect(url_for("console.alerts"), code=303)


@bp.app_template_filter("alert_value")
def _alert_value(value, metric: str) -> str:
    """A threshold or a fired value in its metric's unit: spend as dollars (the API keeps
    cents, fractions kept: 250.5 is $2.505), calls as a count, the rates as a percentage."""
    if metric == "spend_cents":
        return alerts_svc.spend_text(value)
    number = f"{value:,.2f}".rstrip("0").rstrip(".")
    return number if metric == "calls" else number + "%"


@bp.post("/alerts/<alert_id>/delete")
def delete_alert(alert_id: str):
    """Delete one of the account's rules (another account's id: 404)."""
    if (refused := org_context.guard(("alerts:write",))):
        return refused
    try:
        alerts_svc.delete_alert(org_context.payer_id(), alert_id, web.mode())
    except DomainError:
        abort(404)
    return redirect(url_for("console.alerts"), code=303)

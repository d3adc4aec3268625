"""Console pages: activity (module calls and chat completions together, filterable by key,
module or model, status and date, downloadable as CSV) and the models and prices page (the
chat catalog, what ``auto`` picks, the modules with their prices and MCP tool names)."""
from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

from flask import Response, render_template, request, stream_with_context

from app.blueprints.console import bp, org_context, web
from app.errors import DomainError
from app.models.base import utcnow
from app.services.accounts import keys as keys_svc
from app.services.billing import export
from app.services.gateway import history, pricelist

LISTED = 200  # the newest rows a page lists; the CSV has every row of the window
STATUSES = ("succeeded", "pending", "refunded", "settled", "held", "released", "sandbox")
DEFAULT_DAYS = 30


def _day(text: str | None, default: date) -> date | None:
    if not text:
        return default
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


def _query() -> tuple[dict, dict]:
    """The page's filters from the query string: ``({"filters", "start", "end", "form"},
    errors)``. ``product`` is ``module:<slug>`` or ``model:<id>``; ``from``/``to`` are
    UTC dates (``to`` included)."""
    args = request.args
    today = utcnow().date()
    form = {k: (args.get(k) or "").strip()[:140] for k in ("key", "product", "status", "from", "to")}
    errors = {}
    first = _day(form["from"], today - timedelta(days=DEFAULT_DAYS - 1))
    last = _day(form["to"], today)
    if first is None:
        errors["from"] = "Enter a date as YYYY-MM-DD."
    if last is None:
        errors["to"] = "Enter a date as YYYY-MM-DD."
    elif last == date.max:  # the window ends the next day, which the calendar does not have
        errors["to"], last = "Enter a date before 9999-12-31.", None
    if first and last and first > last:
        errors["to"] = "The last day must not be before the first."
    kind, _, name = form["product"].partition(":")
    if form["product"] and (kind not in ("module", "model") or not name):
        errors["product"] = "Choose a module or a model from the list."
    if form["status"] and form["status"] not in STATUSES:
        errors["status"] = "Choose a status from the list."
    filters = {"key_id": form["key"] or None, "status": form["status"] or None, "mode": web.mode(),
               "module": name if kind == "module" else None, "model": name if kind == "model" else None}
    start = end = None
    if first and last:
        start = datetime(first.year, first.month, first.day, tzinfo=timezone.utc)
        end = datetime(last.year, last.month, last.day, tzinfo=timezone.utc) + timedelta(days=1)
    form["from"], form["to"] = (first or today).isoformat(), (last or today).isoformat()
    return {"filters": filters, "start": start, "end": end, "form": form}, errors


@bp.get("/activity")
def activity():
    """Module calls and chat completions of the mode shown, newest first, filtered."""
    q, errors = _query()
    payer = org_context.payer_id()  # the chosen organisation's calls (the role's share of them), else one's own
    rows = [] if errors else history.recent_activity(payer, mode=web.mode(), limit=LISTED,
                                                     filters={**q["filters"], **org_context.calls_filter()},
                                                     start=q["start"], end=q["end"])
    keys = org_context.visible_keys(keys_svc.list_keys(payer, web.mode()))
    products = ([("module:" + m["slug"], m["slug"]) for m in pricelist.modules()]
                + [("model:" + m["id"], m["id"] + " (chat)") for m in pricelist.chat_models()])
    return render_template("console/activity.html", calls=rows, form=q["form"], errors=errors, keys=keys,
                           key_names={k.id: k.name for k in keys}, products=products, statuses=STATUSES,
                           listed=LISTED, total_micros=sum(r["cost_micros"] for r in rows)), 400 if errors else 200


@bp.get("/activity/export.csv")
def activity_export():
    """The rows of the activity page's filters as CSV (every row of the window, at most 31
    days): the columns of ``GET /api/usage/export``."""
    q, errors = _query()
    if errors:
        return activity()
    try:
        start, end = export.window(q["start"], q["end"])
    except DomainError as exc:
        return render_template("console/message.html", title="Export refused", message=exc.message), 400
    body = stream_with_context(export.rows(org_context.payer_id(), start, end, "csv", q["filters"],
                                           member=org_context.calls_member()))
    return Response(body, mimetype="text/csv", headers={
        "Content-Disposition": f'attachment; filename="activity-{start:%Y%m%d}-{end:%Y%m%d}.csv"'})


@bp.get("/models")
def models():
    """The chat models with their prices, what ``auto`` picks, and the modules."""
    return render_template("console/models.html", chat=pricelist.chat_models(), picks=pricelist.auto_picks(),
                           modules=pricelist.modules())

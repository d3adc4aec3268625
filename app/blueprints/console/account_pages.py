"""Console pages: API keys (list with limits and expiry, create with a spend limit and an
expiry — the secret shown exactly once —, rotate, revoke) and usage (daily chart with a
range picker, by-module table, CSV export, a call with its receipt and a receipt
verification against the published keys)."""
from __future__ import annotations

import json
import re
from datetime import timedelta
from decimal import Decimal

from flask import Response, abort, g, redirect, render_template, request, stream_with_context, url_for

from app.blueprints.console import bp, org_context, web
from app.blueprints.console.pages import daily_charts
from app.blueprints.keys.schemas import KeyCreateSchema
from app.errors import DomainError
from app.scopes import ALL_SCOPES
from app.services.accounts import keys as keys_svc
from app.models.base import utcnow
from app.services.money.spend import PERIODS
from app.services.billing import export, usage
from app.services.gateway import history, receipts

RANGES = (7, 30, 90)
# The scopes the create-key form checks by default (docs/decisions.md §12): read everything
# and call (modules and chat); changing keys, money, alerts or agents is asked for.
DEFAULT_SCOPES = tuple(s for s in ALL_SCOPES if s.endswith(":read")) + ("call:write",)
_DOLLARS = re.compile(r"\d{1,7}(?:\.\d{1,2})?")


def dollars_to_cents(text: str) -> int | None:
    """A dollar amount typed in a form ("5", "2.5", "2.50") as cents, exactly (Decimal, never
    a float: "0.29" is 29 cents, not 28); None if not one (a sign, more than 2 decimals, an
    exponent, anything else). Every money field of the console is read by it."""
    return None if _DOLLARS.fullmatch(text) is None else int(Decimal(text) * 100)


def field_errors(exc: DomainError, fields: tuple[str, ...]) -> dict:
    """A service error's message placed next to its field ("name: must not…"), else on
    the form as a whole (key ``_form``)."""
    head, sep, rest = exc.message.partition(":")
    if sep and head.strip() in fields:
        return {head.strip(): rest.strip()}
    return {"_form": exc.message}


@bp.get("/keys", endpoint="keys")
def _keys_page(status: int = 200, **extra):
    """The account's active keys of the current mode.
    Also the page its forms answer with: a status and ``extra`` (errors, the form echoed back)."""
    rows = org_context.visible_keys(keys_svc.list_keys(org_context.payer_id(), web.mode()))
    ctx = {"keys": rows, "all_scopes": ALL_SCOPES, "default_scopes": DEFAULT_SCOPES, "periods": PERIODS,
           "errors": {}, "form": {}, "created": None, "key_members": org_context.key_members()}
    return web.page("console/keys.html", status, ctx, extra)


@bp.post("/keys")
def create_key():
    """Create a key (optional spend limit and expiry); the page answering this POST is the
    only place its secret appears."""
    if (refused := org_context.guard(("keys:write",))):
        return refused
    fields = ("name", "spend_limit", "spend_limit_period", "expires_in_days")
    form = {f: (request.form.get(f) or "").strip() for f in fields}
    form["scopes"] = scopes = [s for s in request.form.getlist("scopes") if s]
    _, errors = web.load_form(KeyCreateSchema(only=("name", "scopes")), {"name": form["name"], "scopes": scopes})
    if errors:
        return _keys_page(400, errors=errors, form=form)
    if not scopes:
        return _keys_page(400, errors={"scopes": "Choose at least one scope."}, form=form)
    numbers = {}
    if form["spend_limit"]:
        cents = dollars_to_cents(form["spend_limit"].removeprefix("$"))
        if cents is None:
            return _keys_page(400, errors={"spend_limit": "Enter an amount in dollars, e.g. 5 or 2.50."}, form=form)
        numbers["spend_limit_cents"] = cents
    if form["expires_in_days"]:
        if not form["expires_in_days"].isdigit():
            return _keys_page(400, errors={"expires_in_days": "Enter a whole number of days (1 to 365)."}, form=form)
        numbers["expires_in_days"] = int(form["expires_in_days"])
    days = numbers.get("expires_in_days")
    if days is not None and not 1 <= days <= 365:
        return _keys_page(400, errors={"expires_in_days": "Enter a whole number of days (1 to 365)."}, form=form)
    try:
        row, secret = keys_svc.create_key(
            org_context.payer_id(), form["name"], scopes, creator_scopes=frozenset(ALL_SCOPES),
            member_account_id=org_context.member_id(), actor=org_context.key_actor(),
            creator_mode=web.mode(), spend_limit_cents=numbers.get("spend_limit_cents"),
            spend_limit_period=(form["spend_limit_period"] or None) if "spend_limit_cents" in numbers else None,
            expires_at=utcnow() + timedelta(days=days) if days else None)
    except DomainError as exc:
        errors = field_errors(exc, ("name", "scopes", "spend_limit_cents", "spend_limit_period", "expires_at"))
        if "spend_limit_cents" in errors:  # the service's field is the form's dollars
            errors["spend_limit"] = errors.pop("spend_limit_cents")
        return _keys_page(400, errors=errors, form=form)
    return _keys_page(created={"key": row, "secret": secret})


def _on_key(key_id: str, service, *args, **kwargs):
    """``service(payer, key_id, *args, actor=…)`` on a key the person may manage; a refusal
    (another account's key, one the person's role does not show) is a 404, a conflict with
    the key's state (409) is raised for the page to say why."""
    try:
        org_context.check_key(key_id)
        return service(org_context.payer_id(), key_id, *args, actor=org_context.key_actor(), **kwargs)
    except DomainError as exc:
        if exc.status == 409:
            raise
        abort(404)


ROTATE_REFUSED = {"key_already_rotated": "This key was already rotated and is retiring: rotate its newest key "
                                         "(the row of the same name not marked retiring) instead."}


@bp.post("/keys/<key_id>/rotate")
def rotate_key(key_id: str):
    """Rotate a key: the new key is shown once; the old one keeps working for a day."""
    if (refused := org_context.guard(("keys:write",))):
        return refused
    try:
        row, secret = _on_key(key_id, keys_svc.rotate_key, None, creator_scopes=frozenset(ALL_SCOPES),
                              mode=web.mode())
    except DomainError as exc:  # already rotated (its successor works), or the key cap: the page says why
        return _keys_page(409, errors={"rotate": ROTATE_REFUSED.get(exc.code, exc.message)})
    return _keys_page(created={"key": row, "secret": secret, "rotated": True, "old_id": key_id})


@bp.post("/keys/<key_id>/revoke")
def revoke_key(key_id: str):
    """Revoke one of the account's keys (another account's id: 404)."""
    if (refused := org_context.guard(("keys:write",))):
        return refused
    _on_key(key_id, keys_svc.revoke_key, web.mode())
    return redirect(url_for("console.keys"), code=303)


@bp.get("/usage")
def usage_page():
    """Daily spend and calls over 7, 30 or 90 days, and this month by module."""
    days = request.args.get("days", type=int)
    days = days if days in RANGES else 30
    start, end = usage.billing_period()
    return render_template("console/usage.html", days=days, ranges=RANGES,
                           chart=daily_charts(org_context.payer_id(), days, web.mode()),
                           by_module=usage.by_product(org_context.payer_id(), start, end, mode=web.mode()),
                           calls=history.recent_activity(org_context.payer_id(), mode=web.mode(), limit=50,
                                                         filters=org_context.calls_filter()))


@bp.get("/usage/export.csv")
def usage_export():
    """The account's calls of the last ``days`` (1–31, default 30) as CSV, streamed: the same
    rows as ``GET /api/usage/export`` (a browser session has no bearer key to call it)."""
    days = request.args.get("days", type=int) or 30
    days = min(max(days, 1), 31)
    end = utcnow()
    start, end = export.window(end - timedelta(days=days), end)
    body = stream_with_context(export.rows(org_context.payer_id(), start, end, "csv",
                                           member=org_context.calls_member()))
    return Response(body, mimetype="text/csv", headers={
        "Content-Disposition": f'attachment; filename="usage-{start:%Y%m%d}-{end:%Y%m%d}.csv"'})


def _call_page(call_id: str, status: int = 200, **extra):
    try:
        call = history.get_call(org_context.payer_id(), call_id)
        org_context.check_call(call)
    except DomainError:
        abort(404)
    published = {k["kid"]: k for k in receipts.public_keys()}
    kid = (call.receipt or {}).get("kid")
    ctx = {"call": call, "kid_published": kid in published, "verify": None, "pasted": ""}
    return web.page("console/call.html", status, ctx, extra)


@bp.get("/usage/calls/<call_id>")
def call_detail(call_id: str):
    """One call: status, price, its receipt, and the form to verify a saved response."""
    return _call_page(call_id)


@bp.post("/usage/calls/<call_id>/verify")
def verify_call(call_id: str):
    """Verify a saved call response (pasted JSON) with the published receipt keys."""
    pasted = (request.form.get("response") or "")[:200_000]
    keys_by_kid = {k["kid"]: k["public_key"] for k in receipts.public_keys()}
    try:
        doc = json.loads(pasted)
        if not isinstance(doc, dict) or doc.get("call_id") != call_id:
            raise receipts.ReceiptInvalid("this is not the response of this call")
        facts = receipts.verify_response(doc, keys_by_kid)
        verdict = {"ok": True, "text": f"Valid: signed by key {facts['kid']} at {facts['ts']}."}
    except (ValueError, receipts.ReceiptInvalid) as exc:
        verdict = {"ok": False, "text": f"Not valid: {exc}"}
    return _call_page(call_id, verify=verdict, pasted=pasted)

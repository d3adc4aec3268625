"""Console pages: API keys (list, create — the secret shown exactly once —, revoke) and
usage (daily chart with a range picker, by-module table, a call with its receipt and a
receipt verification against the published keys)."""
from __future__ import annotations

import json

from flask import abort, g, redirect, render_template, request, url_for

from app.blueprints.console import bp, web
from app.blueprints.console.pages import daily_charts
from app.errors import DomainError
from app.scopes import ALL_SCOPES
from app.services.accounts import keys as keys_svc
from app.services.billing import usage
from app.services.gateway import history, receipts

RANGES = (7, 30, 90)


def field_errors(exc: DomainError, fields: tuple[str, ...]) -> dict:
    """A service error's message placed next to its field ("name: must not…"), else on
    the form as a whole (key ``_form``)."""
    head, sep, rest = exc.message.partition(":")
    if sep and head.strip() in fields:
        return {head.strip(): rest.strip()}
    return {"_form": exc.message}


def _keys_page(status: int = 200, **extra):
    rows = keys_svc.list_keys(g.account.id, web.mode())
    ctx = {"keys": rows, "all_scopes": ALL_SCOPES, "errors": {}, "form": {}, "created": None}
    ctx.update(extra)
    return render_template("console/keys.html", **ctx), status


@bp.get("/keys")
def keys():
    """The account's active keys of the current mode."""
    return _keys_page()


@bp.post("/keys")
def create_key():
    """Create a key; the page answering this POST is the only place its secret appears."""
    name = (request.form.get("name") or "").strip()
    scopes = [s for s in request.form.getlist("scopes") if s]
    form = {"name": name, "scopes": scopes}
    if not scopes:
        return _keys_page(400, errors={"scopes": "Choose at least one scope."}, form=form)
    try:
        row, secret = keys_svc.create_key(g.account.id, name[:100], scopes,
                                          creator_scopes=frozenset(ALL_SCOPES), creator_mode=web.mode())
    except DomainError as exc:
        return _keys_page(400, errors=field_errors(exc, ("name", "scopes")), form=form)
    return _keys_page(created={"key": row, "secret": secret})


@bp.post("/keys/<key_id>/revoke")
def revoke_key(key_id: str):
    """Revoke one of the account's keys (another account's id: 404)."""
    try:
        keys_svc.revoke_key(g.account.id, key_id, web.mode())
    except DomainError:
        abort(404)
    return redirect(url_for("console.keys"), code=303)


@bp.get("/usage")
def usage_page():
    """Daily spend and calls over 7, 30 or 90 days, and this month by module."""
    days = request.args.get("days", type=int)
    days = days if days in RANGES else 30
    start, end = usage.billing_period()
    return render_template("console/usage.html", days=days, ranges=RANGES,
                           chart=daily_charts(g.account.id, days, web.mode()),
                           by_module=usage.by_product(g.account.id, start, end, mode=web.mode()),
                           calls=history.recent_calls(g.account.id, mode=web.mode(), limit=50))


def _call_page(call_id: str, status: int = 200, **extra):
    try:
        call = history.get_call(g.account.id, call_id)
    except DomainError:
        abort(404)
    published = {k["kid"]: k for k in receipts.public_keys()}
    kid = (call.receipt or {}).get("kid")
    ctx = {"call": call, "kid_published": kid in published, "verify": None, "pasted": ""}
    ctx.update(extra)
    return render_template("console/call.html", **ctx), status


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

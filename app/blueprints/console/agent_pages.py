"""Console pages: agents (register by public key, fund from the account's balance, disable,
earnings and monthly statements,
submitted modules with their review status) and, for admin accounts, the module review
queue (approve / reject)."""
from __future__ import annotations

import secrets

from flask import abort, g, redirect, request, url_for

from app.blueprints.console import bp, web
from app.blueprints.agents.schemas import RegisterSchema
from app.blueprints.builds.schemas import ApproveSchema
from app.blueprints.console.account_pages import dollars_to_cents, field_errors
from app.errors import DomainError
from app.services.agents import builds, disable, earnings, funding, identity
from app.services.money import ledger

FUND_REFUSED = (f"Enter an amount in dollars, more than 0 and at most {funding.MAX_FUND_CENTS // 100:,}, "
                "with at most 2 decimals (e.g. 5 or 2.50).")


@bp.get("/agents", endpoint="agents")
def _agents_page(status: int = 200, **extra):
    """The account's agents, their earnings and submitted modules; the review queue.
    Also the page its forms answer with: a status and ``extra`` (errors, the form echoed back)."""
    acct, mode = g.account, web.mode()  # the console's mode: a test session sees test agents only
    agents = identity.owned_agents(acct.id, mode)
    ctx = {"agents": [{"agent": a, "earnings": earnings.agent_earnings(a),
                       "balance_micros": ledger.cached_balance(a.account_id, mode)} for a in agents],
           "submissions": builds.list_builds(agent_id=None, account_id=acct.id, mode=mode),
           "queue": builds.pending() if _may_review() else [], "errors": {}, "form": {},
           "fund_form": {},  # the Fund row a refused amount echoes back (as typed, marked invalid)
           # one Idempotency-Key per rendered form: a double submit funds once
           "fund_key": "console-" + secrets.token_urlsafe(16)}
    return web.page("console/agents.html", status, ctx, extra)


def _may_review() -> bool:
    """The console's admin review follows the API's rule: an admin account, in live mode."""
    return bool(g.account.is_admin) and web.mode() == "live"


@bp.post("/agents")
def register_agent():
    """Register an agent by its ed25519 public key (idempotent per key)."""
    form = {f: (request.form.get(f) or "").strip() for f in ("name", "pubkey", "webhook")}
    body, errors = web.load_form(RegisterSchema(), {**form, "webhook": form["webhook"] or None})
    if errors:
        return _agents_page(400, errors=errors, form=form)
    try:
        identity.register(g.account.id, name=body["name"], pubkey=body["pubkey"],
                          webhook=body["webhook"], mode=web.mode(), registered_by=g.account.id)
    except DomainError as exc:
        return _agents_page(400, errors=field_errors(exc, ("name", "pubkey", "webhook")), form=form)
    return redirect(url_for("console.agents"), code=303)


@bp.post("/agents/<agent_id>/disable")
def disable_agent(agent_id: str):
    """Disable one of the account's agents (the browser asks first): sessions revoked,
    sign-in refused, its balance back to the account (``agents.disable``)."""
    try:
        disable.disable(g.account.id, agent_id, mode=web.mode())
    except DomainError:
        abort(404)
    return redirect(url_for("console.agents"), code=303)


@bp.post("/agents/<agent_id>/fund")
def fund_agent(agent_id: str):
    """Move dollars from the account's balance to one of its agents (once per form). The
    amount is typed in dollars, as every money field of the console (until 2026-11-29 in
    cents), and read exactly (``dollars_to_cents``)."""
    typed = {"agent_id": agent_id, "amount": request.form.get("amount") or ""}
    cents = dollars_to_cents(typed["amount"].strip().removeprefix("$"))
    if cents is None or not 1 <= cents <= funding.MAX_FUND_CENTS:
        return _agents_page(400, errors={"fund": FUND_REFUSED}, fund_form=typed)
    try:
        funding.fund(g.account.id, agent_id, cents,
                     idempotency_key=(request.form.get("fund_key") or "")[:128] or None, mode=web.mode())
    except DomainError as exc:
        if exc.status == 404:
            abort(404)
        return _agents_page(400, errors={"fund": exc.message}, fund_form=typed)
    return redirect(url_for("console.agents"), code=303)


@bp.post("/agents/review/<slug>")
def review(slug: str):
    """Admins only, in live mode (as the API's admin routes: a live key of an admin
    account): approve or reject the pending submission for ``slug``."""
    if not g.account.is_admin:
        abort(404)
    if not _may_review():
        return web.forbidden_page("Module review is a live-mode action: switch the console to live mode.")
    decision, notes = request.form.get("decision"), (request.form.get("notes") or "").strip()
    _, errors = web.load_form(ApproveSchema(), {"notes": notes or None}, rename={"notes": "review"})
    if errors:
        return _agents_page(400, errors=errors)
    reviewer = g.account.email or g.account.id
    try:
        if decision == "approve":
            builds.approve(slug, reviewer=reviewer, notes=notes or None)
        elif decision == "reject":
            builds.reject(slug, reviewer=reviewer, reason=notes or "Rejected in the console review.")
        else:
            abort(400)
    except DomainError as exc:
        return _agents_page(400, errors={"review": exc.message})
    return redirect(url_for("console.agents"), code=303)

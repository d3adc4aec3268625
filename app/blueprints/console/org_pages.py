"""Console pages of organisations: the e-mailed invitation link (issue 37 item 3). Opening
it changes nothing (mail scanners prefetch GETs); its button accepts: the invitation's
address gets an account if it has none, joins the organisation, and is signed in here.

And (issue 40 item 4) the organisation list and creation, the switcher's form, the chosen
organisation's members, invitations, roles and budgets, and its audit log."""
from __future__ import annotations

from flask import Response, abort, g, redirect, render_template, request, stream_with_context, url_for

from app.blueprints.console import bp, org_context, web
from app.blueprints.console.account_pages import dollars_to_cents
from app.blueprints.orgs.schemas import InviteCreateSchema, OrgCreateSchema
from app.errors import DomainError
from app.models.orgs import ROLES
from app.ratelimits import per_ip, recipient_allowed
from app.services.billing import usage
from app.services.orgs import audit, invites, orgs, roles


@bp.route("/invites/<string:token>", methods=["GET", "POST"])
@per_ip("PUBLIC_PAGE_RATE_LIMIT")
def invite(token):
    """GET: what the invitation is for and a button. POST: accept it, sign in and act for
    the organisation joined (its dashboard; the switcher goes back to the personal account)."""
    if request.method == "GET":
        pending = invites.preview(token)
        org_name = invites.name_of_org(pending.org_id) if pending else None
        inviter = invites.inviter_email(pending) if pending else None
        return render_template("console/invite.html", token=token, invite=pending, org_name=org_name,
                               inviter=inviter), \
            200 if pending else 404
    try:
        _account_id, org_id, session_token = invites.accept_from_link(token, request_id=g.get("request_id"),
                                                                      ip=request.remote_addr)
    except DomainError as exc:
        return render_template("console/invite.html", token=token, invite=None, error=exc.message), exc.status
    g.session_token, g.new_pre = session_token, False
    return _switch_to(redirect(url_for("console.dashboard"), code=303), org_id)


# --- organisations in the console (issue 40 item 4) ---------------------------------------
# The switcher (``org_context``) chooses the payer; these pages list, create and manage the
# organisations through the same services as ``/api/orgs`` (``services.orgs``), so every
# role rule is the API's: a refused action is the service's 403, shown as a page naming
# the roles that may and the person's role.

AUDIT_PAGE = 50


def _chosen():
    """The chosen organisation, or a redirect to the list to choose one."""
    if g.get("org") is None:
        return None, redirect(url_for("console.orgs_page"), code=303)
    return g.org, None


def _switch_to(response, org_id: str | None):
    if org_id:
        response.set_cookie(org_context.COOKIE, org_id, httponly=True, samesite="Lax", secure=web._secure(), path="/")
    else:
        response.delete_cookie(org_context.COOKIE, path="/", httponly=True, samesite="Lax", secure=web._secure())
    return response


@bp.get("/orgs", endpoint="orgs_page")
def _orgs_page(status: int = 200, **extra):
    """The person's organisations (role, balance) and the form to create one.
    Also the page its forms answer with: a status and ``extra`` (errors, the form echoed back)."""
    ctx = {"orgs_list": orgs.list_orgs(org_context.principal(web.mode())), "errors": {}, "name": ""}
    return web.page("console/orgs.html", status, ctx, extra)


@bp.post("/orgs")
def create_org():
    """Create an organisation (the person is its owner) and act for it."""
    name = request.form.get("name") or ""
    body, errors = web.load_form(OrgCreateSchema(), {"name": name})
    if errors:
        return _orgs_page(400, errors=errors, name=name)
    try:
        org = orgs.create_org(org_context.principal(web.mode()), org_context.actor(), body["name"])
    except DomainError as exc:
        return _orgs_page(exc.status, errors={"name": exc.message}, name=name)
    return _switch_to(redirect(url_for("console.org_members"), code=303), org["id"])


@bp.post("/orgs/switch")
def switch_org():
    """The switcher: act for one of the person's organisations, or for the personal account
    (empty ``org_id``). An organisation the person does not belong to is a 404."""
    org_id = (request.form.get("org_id") or "").strip()
    if org_id and orgs.member_role(org_id[:32], g.account.id) is None:
        abort(404)
    return _switch_to(redirect(web.safe_next(request.form.get("next")), code=303), org_id or None)


@bp.get("/org/members", endpoint="org_members")
def _members_page(status: int = 200, **extra):
    """The chosen organisation: balance, this month's usage, members (roles, budgets) and
    pending invitations.
    Also the page its forms answer with: a status and ``extra`` (errors, the form echoed back)."""
    org, back = _chosen()
    if back:
        return back
    p, mode = org_context.principal(web.mode()), web.mode()
    manage = org_context.allows(action="manage_members")
    start, end = usage.billing_period()
    members = orgs.list_members(p, org.id)
    ctx = {"members": members,
           "invites": invites.list_invites(p, org.id) if manage else [],
           "manage": manage, "owner": g.org_role == roles.OWNER, "roles": ROLES,
           "usage_now": usage.totals(org.id, start, end, mode=mode),
           "member_usage": _member_usage(org.id, members, start, end, mode),
           "errors": {}, "form": {"email": "", "role": "developer"}, "me": g.account.id,
           # the member row a refused change echoes back (what was typed, marked invalid)
           "member_form": {},
           # agents a role change or removal just disabled (``_members_after``)
           "disabled_agents": request.args.get("disabled_agents", 0, type=int),
           "revoked_invites": request.args.get("revoked_invites", 0, type=int)}
    return web.page("console/org_members.html", status, ctx, extra)


def _member_usage(org_id: str, members: list[dict], start, end, mode: str) -> list[dict]:
    """This month's calls and spend of each member's organisation keys (one statement,
    ``usage.by_member``), every current member listed (0 when they made no call) and former
    members who called this month after them. Owners, admins and billing see every member
    (``read_member_usage``, as ``member_id`` on the usage routes); the others their own row."""
    rows = {u["member_id"]: u for u in usage.by_member(org_id, start, end, mode=mode)}
    out = [{"member_id": m["member_id"], "email": m["email"], "calls": 0, "spend_micros": 0,
            **rows.pop(m["member_id"], {})} for m in members]
    out += [{"email": None, **u} for u in rows.values()]
    if not org_context.allows(action="read_member_usage"):
        out = [u for u in out if u["member_id"] == g.account.id]
    return out


def _refused(exc: DomainError, status_page):
    """A service's refusal: the role's 403 page, a 404, or the message on the page."""
    if exc.status == 403:
        return org_context.refused_page(exc)
    if exc.status == 404:
        abort(404)
    return status_page(exc.status, errors={"_form": exc.message})


def _manage(service, *args, **kwargs):
    """A change to the chosen organisation, ``service(principal, actor, org id, *args)``:
    ``(None, its result)`` when done, else ``(the answer, None)``: the redirect to choose an
    organisation first, or the refusal as ``_refused`` shows it on the members page."""
    org, back = _chosen()
    if back:
        return back, None
    try:
        return None, service(org_context.principal(web.mode()), org_context.actor(), org.id, *args, **kwargs)
    except DomainError as exc:
        return _refused(exc, _members_page), None


def _members_after(result: dict):
    """Back to the members page, saying how many of the member's agents the change disabled
    and of the invitations they sent it revoked."""
    counts = {name: len(result.get(name) or ()) for name in ("disabled_agents", "revoked_invites")}
    return redirect(url_for("console.org_members", **{k: n for k, n in counts.items() if n}), code=303)


@bp.post("/org/invites")
def org_invite():
    """Invite a person by e-mail with a role (owners and admins; only an owner invites an
    owner); the e-mail carries the single-use link."""
    org, back = _chosen()
    if back:
        return back
    form = {"email": (request.form.get("email") or "").strip(), "role": request.form.get("role") or ""}
    if (refused := org_context.guard(action="manage_members")):
        return refused
    body, errors = web.load_form(InviteCreateSchema(), form)
    if errors:
        return _members_page(400, errors=errors, form=form)
    if not recipient_allowed("INVITE_EMAIL_RATE_LIMIT", body["email"]):
        return _members_page(429, errors={"email": "This address was sent too many invitations; try again later."},
                             form=form)
    try:
        invites.invite(org_context.principal(web.mode()), org_context.actor(), org.id, body["email"], body["role"])
    except DomainError as exc:
        if exc.status in (403, 404):
            return _refused(exc, _members_page)
        return _members_page(exc.status, errors={"email": exc.message}, form=form)
    return redirect(url_for("console.org_members", invited=body["email"]), code=303)


@bp.post("/org/invites/<invite_id>/revoke")
def org_revoke_invite(invite_id: str):
    """Revoke a pending invitation: its link stops working."""
    refused, _ = _manage(invites.revoke, invite_id)
    return refused or redirect(url_for("console.org_members"), code=303)


@bp.post("/org/members/<member_id>")
def org_update_member(member_id: str):
    """Change a member's role (and monthly budget, when offered). The last owner keeps the
    role: the page shows the service's ``last_owner`` error."""
    role = request.form.get("role") or ""
    kwargs = {}
    if "monthly_budget" in request.form:
        text = (request.form.get("monthly_budget") or "").strip().removeprefix("$")
        cents = None if not text else dollars_to_cents(text)
        if text and cents is None:
            return _members_page(400, errors={"_form": "Monthly budget: enter an amount in dollars, e.g. 50 or "
                                                       "12.50 (empty: no budget)."},
                                 member_form={"member_id": member_id, "role": role,
                                              "monthly_budget": request.form.get("monthly_budget") or ""})
        kwargs["monthly_budget_cents"] = cents
    refused, result = _manage(orgs.update_member, member_id, role, **kwargs)
    return refused or _members_after(result)


@bp.post("/org/members/<member_id>/remove")
def org_remove_member(member_id: str):
    """Remove a member, or leave (one's own id); their organisation keys are revoked. The
    last owner cannot leave or be removed (the page shows why)."""
    refused, result = _manage(orgs.remove_member, member_id)
    if refused:
        return refused
    if member_id == g.account.id:  # left: back on the personal account
        return _switch_to(redirect(url_for("console.orgs_page"), code=303), None)
    return _members_after(result)


@bp.get("/org/audit")
def org_audit():
    """The organisation's audit log, newest first, in cursor pages (owners and admins), with
    the CSV download of every entry."""
    org, back = _chosen()
    if back:
        return back
    cursor = request.args.get("cursor") or None
    try:
        page = audit.entries(org_context.principal(web.mode()), org.id, AUDIT_PAGE, cursor)
    except DomainError as exc:
        if exc.status == 400:  # a cursor that is not one of this list
            abort(404)
        return _refused(exc, _members_page)
    return render_template("console/org_audit.html", entries=page["entries"], next_cursor=page["next_cursor"],
                           first=cursor is None, people=audit.people(page["entries"]))


@bp.get("/org/audit.csv")
def org_audit_csv():
    """Every audit entry as CSV (the rows of ``GET /api/orgs/{id}/audit?format=csv``)."""
    org, back = _chosen()
    if back:
        return back
    p = org_context.principal(web.mode())
    try:
        audit.check_csv(p, org.id)
    except DomainError as exc:
        return _refused(exc, _members_page)
    body = stream_with_context(audit.csv_rows(p, org.id))
    return Response(body, mimetype="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="audit-{org.id}.csv"'})


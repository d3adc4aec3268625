"""Console pages of organisations: the e-mailed invitation link (issue 37 item 3). Opening
it changes nothing (mail scanners prefetch GETs); its button accepts: the invitation's
address gets an account if it has none, joins the organisation, and is signed in here."""
from __future__ import annotations

from flask import g, redirect, render_template, request, url_for

from app.blueprints.console import bp
from app.errors import DomainError
from app.ratelimits import per_ip
from app.services.orgs import invites


@bp.route("/invites/<string:token>", methods=["GET", "POST"])
@per_ip("PUBLIC_PAGE_RATE_LIMIT")
def invite(token):
    """GET: what the invitation is for and a button. POST: accept it and sign in."""
    if request.method == "GET":
        pending = invites.preview(token)
        return render_template("console/invite.html", token=token, invite=pending), 200 if pending else 404
    try:
        _account_id, session_token = invites.accept_from_link(token, request_id=g.get("request_id"),
                                                              ip=request.remote_addr)
    except DomainError as exc:
        return render_template("console/invite.html", token=token, invite=None, error=exc.message), exc.status
    g.session_token, g.new_pre = session_token, False
    return redirect(url_for("console.dashboard"), code=303)

"""Which payer the console acts for (issue 40 item 4): the person's own account or one of
their organisations, chosen with the switcher in the header (cookie ``gw_console_org``,
like the live/test switch).

The cookie only names a choice: on every request the membership is read again
(``orgs.member_role``), so a person removed from an organisation is back on their own
account at their next click. ``g.org`` / ``g.org_role`` hold the organisation and the
person's role in it (None on the personal account). The role narrows the console exactly
as it narrows an organisation key on the API (``roles.SCOPE_ROLES`` / ``roles.ACTIONS``,
the same functions): a page or form the role does not allow answers a 403 page that names
the roles that would be allowed and the person's role."""
from __future__ import annotations

from flask import g, request

from app.auth import Principal
from app.errors import DomainError
from app.scopes import ALL_SCOPES
from app.services.orgs import roles
from app.services.orgs.audit import Actor

COOKIE = "gw_console_org"
CREDENTIAL = "console"  # the credential named in the audit log for changes made in the console


def load() -> None:
    """Before each signed-in request: ``g.org`` and ``g.org_role`` from the cookie (a
    choice the person may no longer make is ignored)."""
    from app.extensions import db
    from app.models import Account
    from app.services.orgs import orgs

    g.org, g.org_role = None, None
    chosen = request.cookies.get(COOKIE)
    if g.get("account") is None or not chosen or len(chosen) > 32:
        return
    role = orgs.member_role(chosen, g.account.id)
    if role is not None:
        g.org, g.org_role = db.session.get(Account, chosen), role


def payer_id() -> str:
    """The account the console acts on: the chosen organisation, else the person's own."""
    return g.org.id if g.get("org") is not None else g.account.id


def principal(mode: str) -> Principal:
    """The signed-in person as the orgs services see a personal credential (their own
    account; every scope: the role checks are the services' own)."""
    return Principal(account_id=g.account.id, credential_id=CREDENTIAL, credential_hash="", kind="session",
                     mode=mode, scopes=frozenset(ALL_SCOPES))


def actor() -> Actor:
    return Actor(g.account.id, CREDENTIAL, g.get("request_id"), request.remote_addr)


def refusal(scopes: tuple[str, ...] = (), action: str | None = None) -> DomainError | None:
    """The 403 the API would answer an organisation key of the person's role for
    ``scopes`` / ``action`` (None: allowed, or the personal account)."""
    if g.get("org") is None:
        return None
    try:
        roles.require_scopes(g.org_role, scopes, g.org.id)
        if action is not None:
            roles.require(g.org_role, action, g.org.id)
    except DomainError as exc:
        return exc
    return None


def allows(*scopes: str, action: str | None = None) -> bool:
    """For templates: whether to show a control (a developer sees no billing controls)."""
    return refusal(tuple(scopes), action) is None


def refused_page(exc: DomainError):
    """The 403 page of a refused role: the service's message names the roles and the role."""
    from flask import render_template

    return render_template("console/message.html", title="Not allowed for your role",
                           message=exc.message), 403


def guard(scopes: tuple[str, ...] = (), action: str | None = None):
    """A handler's first line: ``if (r := org_context.guard(...)): return r``."""
    exc = refusal(scopes, action)
    return None if exc is None else refused_page(exc)


def template_context(mode: str) -> dict:
    """The switcher's choices and the chosen organisation, for every signed-in page."""
    from app.services.orgs import orgs

    if g.get("account") is None:
        return {"org": None, "org_role": None, "my_orgs": [], "allows": allows, "scope_needs": roles.scope_needs}
    return {"org": g.get("org"), "org_role": g.get("org_role"),
            "my_orgs": orgs.list_orgs(principal(mode)), "allows": allows, "scope_needs": roles.scope_needs}


# --- whose calls the per-call pages list (the rule of ``orgs.usage_scope``, ``per_call``) ---

def calls_member() -> str | None:
    """In the chosen organisation, owners, admins and billing see every member's calls
    (``read_member_usage``, as the API's export without ``member_id``); developers and
    viewers their own (their organisation keys'). None: every call of the payer."""
    if g.get("org") is None or g.org_role in roles.ACTIONS["read_member_usage"]:
        return None
    return g.account.id


def calls_filter() -> dict:
    """``calls_member`` as the call-log filter of ``history.recent_activity`` /
    ``export.narrowed`` ({}: no narrowing)."""
    from app.services.billing.usage_log import member_keys

    member = calls_member()
    return {} if member is None else {"member_keys": member_keys(g.org.id, member)}


def check_call(call) -> None:
    """404 for a call of another member's key when the role sees only its own calls."""
    from app.errors import NotFound
    from app.extensions import db
    from app.models import ApiKey

    member = calls_member()
    if member is None:
        return
    row = db.session.get(ApiKey, call.actor) if call.actor else None
    if row is None or row.member_account_id != member:
        raise NotFound("No such call.")


# --- keys of an organisation (the API's rules: ``orgs.own_items_only`` / ``orgs.keys_of``) ---

def member_id() -> str | None:
    """The member who owns a key created for the chosen organisation (None: personal)."""
    return g.account.id if g.get("org") is not None else None


def key_actor() -> Actor | None:
    return actor() if g.get("org") is not None else None


def _own_keys_only() -> str | None:
    """The member whose keys alone the person sees and changes in the chosen payer (None:
    all) — the API's rule, ``orgs.own_items_only``, for the console's person."""
    from app.blueprints.console import web
    from app.services.orgs import orgs

    return orgs.own_items_only(principal(web.mode()), payer_id())


def visible_keys(rows: list) -> list:
    """Owners and admins see every key of the organisation; other members their own."""
    only = _own_keys_only()
    return rows if only is None else [row for row in rows if row.member_account_id == only]


def key_members() -> dict[str, str] | None:
    """For a keys page that lists every member's keys (owners and admins of the chosen
    organisation): each member's e-mail by account id, to name whose key a row is; else None."""
    if g.get("org") is None or not allows(action="manage_keys"):
        return None
    from app.blueprints.console import web
    from app.services.orgs import orgs

    return {m["member_id"]: m["email"] for m in orgs.list_members(principal(web.mode()), g.org.id)}


def check_key(key_id: str) -> None:
    """404 for another member's key when the role sees only its own (``orgs.keys_of``)."""
    from app.blueprints.console import web
    from app.services.orgs import orgs

    orgs.keys_of(principal(web.mode()), g.org.id if g.get("org") is not None else None, "keys:read", key_id)

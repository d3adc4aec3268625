"""Roles of an organisation's members and what each may do (docs/teams.md, "Roles").

A credential's scopes say what the credential may do; on an organisation key the member's
role narrows that on every route (``app.auth.check_scopes`` calls ``require_scopes``), so
lowering a role narrows the member's keys, and raising it never widens a key past its
scopes. Organisation actions that are not a scope (members, invites, the audit log, other
members' keys and usage) are named in ``ACTIONS``."""
from __future__ import annotations

from app.errors import Forbidden
from app.models.orgs import ROLES

OWNER, ADMIN, BILLING, DEVELOPER, VIEWER = ROLES
EVERYONE = ROLES
_BUILDERS = (OWNER, ADMIN, DEVELOPER)

# scope -> the roles whose organisation keys may use it
SCOPE_ROLES: dict[str, tuple[str, ...]] = {
    "call:read": EVERYONE,
    "call:write": _BUILDERS,
    "agent:read": EVERYONE,
    "agent:write": _BUILDERS,
    "account:read": EVERYONE,
    "keys:read": EVERYONE,
    "keys:write": _BUILDERS,
    "billing:read": (OWNER, ADMIN, BILLING, VIEWER),
    "billing:write": (OWNER, BILLING),
    "alerts:read": EVERYONE,
    "alerts:write": (OWNER, ADMIN, BILLING),
    "analytics:read": (OWNER, ADMIN),
    "orgs:read": EVERYONE,
    "orgs:write": (OWNER, ADMIN),
    "admin": (),  # an organisation is never an admin account
}

# organisation actions -> the roles that may take them
ACTIONS: dict[str, tuple[str, ...]] = {
    "manage_members": (OWNER, ADMIN),   # change roles and budgets, remove members, invite
    "manage_owners": (OWNER,),          # make, change or remove an owner
    "manage_keys": (OWNER, ADMIN),      # see and change other members' keys
    "read_audit": (OWNER, ADMIN),
    "read_member_usage": (OWNER, ADMIN, BILLING),
}


# how a refusal names each action (the message a person reads, not the table's key)
ACTION_NAMES: dict[str, str] = {
    "manage_members": "Managing members and invitations",
    "manage_owners": "Inviting, changing or removing an owner",
    "manage_keys": "Another member's keys",
    "read_audit": "The audit log",
    "read_member_usage": "Another member's usage",
}


class OrgRoleRequired(Forbidden):
    code = "org_role_required"
    description = ("The member's role in the organisation does not allow this; the message and "
                   "`roles` name the roles that do (docs/teams.md).")


def listed(allowed: tuple[str, ...]) -> str:
    """Roles as a sentence lists them: "owner, admin or developer"."""
    return (" or ".join((", ".join(allowed[:-1]), allowed[-1])) if len(allowed) > 1 else "".join(allowed)) \
        or "(none: organisations cannot do this)"


def scope_needs(scope: str) -> str:
    """The roles whose members may use ``scope``, listed (for pages that say why not)."""
    return listed(SCOPE_ROLES.get(scope, ()))


def _refuse(allowed: tuple[str, ...], role: str, org_id: str, what: str) -> None:
    needed = listed(allowed)
    raise OrgRoleRequired(f"{what} needs role {needed} in organisation {org_id}; your role is {role}.",
                          extra={"roles": list(allowed), "role": role, "org_id": org_id})


def require(role: str, action: str, org_id: str, what: str | None = None) -> None:
    """403 ``org_role_required`` unless ``role`` may take ``action`` (``what``: how the
    message names it)."""
    allowed = ACTIONS[action]
    if role not in allowed:
        _refuse(allowed, role, org_id, what or ACTION_NAMES[action])


def require_scopes(role: str, scopes, org_id: str) -> None:
    """403 ``org_role_required`` unless ``role`` may use every scope of ``scopes``."""
    for scope in scopes:
        allowed = SCOPE_ROLES.get(scope, ())
        if role not in allowed:
            _refuse(allowed, role, org_id, f"Scope {scope}")

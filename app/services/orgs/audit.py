"""The organisations' audit log: every change to an organisation's members, roles,
budgets, invites, keys, money and settings, appended in the unit of work of the change
(so it is recorded exactly when the change commits) and never updated or deleted (a
database trigger refuses it with the ledger's ``gw_ledger_append_only``, migration
0003_teams)."""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from app.errors import InvalidRequest
from app.extensions import db
from app.models.base import utcnow
from app.models.orgs import OrgAuditEntry

MAX_PAGE = 200


@dataclass(frozen=True)
class Actor:
    """Who acts: the person (``account_id``, their own account), the credential they used,
    and the request it came in (for the audit log)."""

    account_id: str
    credential_id: str | None = None
    request_id: str | None = None
    ip: str | None = None


def record(org_id: str, actor: Actor, action: str, target: str | None = None, *,
           before: dict | None = None, after: dict | None = None) -> None:
    """Append one entry in the caller's unit of work."""
    db.session.add(OrgAuditEntry(org_id=org_id, actor_account_id=actor.account_id,
                                 credential_id=actor.credential_id, action=action, target=target,
                                 before=before, after=after, request_id=actor.request_id,
                                 ip=actor.ip, created_at=utcnow()))


def entries(org_id: str, limit: int, cursor: str | None) -> dict:
    """The organisation's entries, newest first; ``cursor`` is the ``next_cursor`` of the
    previous page (the last id seen)."""
    query = select(OrgAuditEntry).where(OrgAuditEntry.org_id == org_id)
    if cursor is not None:
        if not cursor.isdigit() or len(cursor) > 18:
            raise InvalidRequest("cursor: not a cursor of this list.")
        query = query.where(OrgAuditEntry.id < int(cursor))
    rows = list(db.session.execute(query.order_by(OrgAuditEntry.id.desc()).limit(limit + 1)).scalars())
    more = len(rows) > limit
    rows = rows[:limit]
    return {"entries": rows, "next_cursor": str(rows[-1].id) if more else None}

"""The organisations' audit log: every change to an organisation's members, roles,
budgets, invites, keys, money and settings, appended in the unit of work of the change
(so it is recorded exactly when the change commits) and never updated or deleted (a
database trigger refuses it with the ledger's ``gw_ledger_append_only``, migration
0003_teams)."""
from __future__ import annotations

import csv
import io
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

import orjson

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

    account_id: str | None
    credential_id: str | None = None
    request_id: str | None = None
    ip: str | None = None


def actor_of(principal, request_id: str | None = None, ip: str | None = None) -> Actor:
    """The person behind a credential (an organisation key's member, else the credential's
    own account), with the credential, request id and client IP."""
    return Actor(principal.extra.get("member") or principal.account_id, principal.credential_id, request_id, ip)


# Who acts in the current request: set by the route layer around each authenticated
# route (``app.blueprints.routing.endpoint``) and by the console for a signed-in person
# (``begin``/``end``, credential ``console``), so a service deep below records its change
# with the actor without every signature carrying it. Outside a request (jobs, webhooks,
# the CLI) it is unset: the entry names no person.
_acting: ContextVar[Actor | None] = ContextVar("audit_actor", default=None)


@contextmanager
def acting(actor: Actor):
    token = _acting.set(actor)
    try:
        yield actor
    finally:
        _acting.reset(token)


def begin(actor: Actor):
    """``acting`` for a request whose start and end are two hooks (the console's
    ``before_request`` / ``teardown_request``): returns the token ``end`` takes."""
    return _acting.set(actor)


def end(token) -> None:
    _acting.reset(token)


def current() -> Actor | None:
    """The actor of the current request (None outside one)."""
    return _acting.get()


def record(org_id: str, actor: Actor | None, action: str, target: str | None = None, *,
           before: dict | None = None, after: dict | None = None) -> None:
    """Append one entry to the log of the account ``org_id`` (an organisation, or a
    personal account: its own log, ``GET /api/audit``) in the caller's unit of work.
    ``actor`` None: the current request's (``current``), else no person (a job, a
    processor's webhook)."""
    actor = actor or _acting.get() or Actor(None)
    db.session.add(OrgAuditEntry(org_id=org_id, actor_account_id=actor.account_id,
                                 credential_id=actor.credential_id, action=action, target=target,
                                 before=before, after=after, request_id=actor.request_id,
                                 ip=actor.ip, created_at=utcnow()))


def last_removal(account_id: str, action: str, *, target: str | None = None,
                 mode: str | None = None) -> OrgAuditEntry | None:
    """The account's latest ``action`` entry (on ``target`` and of ``mode`` when given): the
    record that something the account had was removed. A DELETE whose row is deleted outright
    (a saved method, the auto top-up rule, the payout destination) answers a repeat from it, as
    alerts and keys answer from the row they keep (docs/decisions.md "Deleting an alert
    twice"); no entry: it never existed here, 404."""
    query = select(OrgAuditEntry).where(OrgAuditEntry.org_id == account_id, OrgAuditEntry.action == action)
    if target is not None:
        query = query.where(OrgAuditEntry.target == target)
    if mode is not None:
        query = query.where(OrgAuditEntry.before["mode"].astext == mode)
    return db.session.execute(query.order_by(OrgAuditEntry.id.desc()).limit(1)).scalar_one_or_none()


COLUMNS = ("id", "created_at", "actor_account_id", "credential_id", "action", "target", "before", "after",
           "request_id", "ip")
BATCH = 1000


def _newest_first(org_id: str, cursor: str | None):
    query = select(OrgAuditEntry).where(OrgAuditEntry.org_id == org_id)
    if cursor is not None:
        if not cursor.isdigit() or len(cursor) > 18:
            raise InvalidRequest("cursor: not a cursor of this list.")
        query = query.where(OrgAuditEntry.id < int(cursor))
    return query.order_by(OrgAuditEntry.id.desc())


def entries(principal, org_id: str, limit: int, cursor: str | None) -> dict:
    """GET /api/orgs/{id}/audit: the organisation's entries, newest first (owners and
    admins); ``cursor`` is the ``next_cursor`` of the previous page (the last id seen)."""
    _may_read(principal, org_id)
    return page(org_id, limit, cursor)


def page(account_id: str, limit: int, cursor: str | None) -> dict:
    """One page of an account's log, newest first, and the cursor of the next."""
    rows = list(db.session.execute(_newest_first(account_id, cursor).limit(limit + 1)).scalars())
    more = len(rows) > limit
    rows = rows[:limit]
    return {"entries": rows, "next_cursor": str(rows[-1].id) if more else None}


def people(rows) -> dict[str, str]:
    """The e-mail of each person the entries ``rows`` name (who acted; a member a change was
    made to), by account id, for a page that shows them (one statement)."""
    from app.models import Account

    ids = {r.actor_account_id for r in rows} | {r.target for r in rows if (r.target or "").startswith("acct_")}
    ids.discard(None)
    if not ids:
        return {}
    found = db.session.execute(select(Account.id, Account.email).where(Account.id.in_(ids), Account.email.is_not(None)))
    return dict(found.all())


def _may_read(principal, org_id: str) -> None:
    from app.services.orgs import roles
    from app.services.orgs.orgs import membership

    roles.require(membership(principal, org_id).role, "read_audit", org_id)


def csv_rows(principal, org_id: str) -> Iterator[str]:
    """GET /api/orgs/{id}/audit?format=csv: every entry, newest first, as CSV lines (a
    header row first), read in batches (a server-side cursor: constant memory). The caller
    checks access first (``check_csv``), so a refusal is a JSON error before any byte."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(COLUMNS)
    for row in db.session.execute(_newest_first(org_id, None).execution_options(yield_per=BATCH)).scalars():
        writer.writerow([row.id, row.created_at.isoformat().replace("+00:00", "Z"), row.actor_account_id or "",
                         row.credential_id or "", row.action, row.target or "",
                         "" if row.before is None else orjson.dumps(row.before).decode(),
                         "" if row.after is None else orjson.dumps(row.after).decode(),
                         row.request_id or "", row.ip or ""])
        yield out.getvalue()
        out.seek(0)
        out.truncate()
    yield out.getvalue()


def check_csv(principal, org_id: str) -> None:
    """The CSV export's access check (owners and admins), before streaming starts."""
    _may_read(principal, org_id)


def own_log(principal) -> str:
    """GET /api/audit: the log of the credential's own account — a person's changes to
    their account (keys, payments, funding, auto top-up, wallet, alerts); an organisation
    key's is its organisation's, for owners and admins (403 ``org_role_required``)."""
    from app.services.orgs import roles
    from app.services.orgs.orgs import org_role_of

    role = org_role_of(principal)
    if role is not None:
        roles.require(role, "read_audit", principal.account_id)
    return principal.account_id

"""Organisations (members, roles, invitations, the audit log) and provider keys (BYOK),
sync and async, against the live server."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gateway_client import (AsyncGateway, Conflict, InvalidRequest, NotFound, PermissionDenied,
                            ProviderKeys)
from tests.api.test_org_invites import _token


def invite_token(app, email: str) -> str:
    """The token of the last invitation's link to ``email``: the server queued the mail
    (no job worker here), delivered now from the outbox to the test mail folder."""
    from sqlalchemy import select

    from app.extensions import db
    from app.models.outbox import OutboxMessage
    from app.services.platform import outbox

    with app.app_context():
        for (message_id,) in db.session.execute(select(OutboxMessage.id).where(
                OutboxMessage.destination == email, OutboxMessage.status == "pending")).all():
            outbox.deliver(message_id)
        db.session.remove()
    return _token(app, email)


def test_org_members_invitations_and_audit(app, make_account, gw_factory, tmp_path):
    email = f"member-{os.urandom(4).hex()}@example.com"
    owner_acct, person = make_account(cents=500), make_account(email=email)
    owner, gw = gw_factory(owner_acct.key), gw_factory(person.key)
    org = owner.orgs.create("ACME")
    assert (org.name, org.role, org.balance_cents) == ("ACME", "owner", 0)
    assert org.id in [o.id for o in owner.orgs.list()] and owner.orgs.get(org.id) == org
    with pytest.raises(NotFound):
        gw.orgs.get(org.id)  # not a member

    stale = owner.orgs.invite(org.id, "nobody@example.com", "viewer")
    assert owner.orgs.revoke_invite(org.id, stale.id).revoked_at is not None
    sent = owner.orgs.invite(org.id, email, "developer")
    assert [i.id for i in owner.orgs.invites(org.id)] == [sent.id] and sent.role == "developer"
    joined = gw.orgs.accept_invite(invite_token(app, email))
    assert (joined.id, joined.role) == (org.id, "developer")
    with pytest.raises(NotFound):
        gw.orgs.accept_invite(invite_token(app, email))  # single use

    members = {m.email: m for m in owner.orgs.members(org.id)}
    assert members[email].role == "developer" and members[email].monthly_budget_cents is None
    changed = owner.orgs.update_member(org.id, person.id, role="viewer", monthly_budget_cents=100)
    assert (changed.role, changed.monthly_budget_cents, changed.disabled_agents) == ("viewer", 100, [])
    with pytest.raises(PermissionDenied):
        gw.orgs.invite(org.id, "x@example.com", "viewer")  # a viewer does not manage members
    with pytest.raises(Conflict):
        owner.orgs.remove_member(org.id, owner_acct.id)  # the last owner
    removed = owner.orgs.remove_member(org.id, person.id)
    assert removed.removed and removed.member_id == person.id

    page = owner.orgs.audit(org.id, limit=2)
    assert [e.action for e in page.entries] == ["member.remove", "member.update"] and page.next_cursor
    rest = owner.orgs.audit(org.id, limit=200, cursor=page.next_cursor)
    assert {"org.create", "invite.create", "invite.revoke", "member.add"} <= {e.action for e in rest.entries}
    assert rest.entries[-1].action == "org.create" and rest.entries[-1].actor_account_id == owner_acct.id
    exported = owner.orgs.audit_export(org.id, str(tmp_path / "audit.csv"))
    header, *rows = Path(exported).read_text().splitlines()
    assert header.startswith("id,created_at,actor_account_id,") and len(rows) == len(page.entries + rest.entries)


def test_async_orgs(server, make_account):
    acct = make_account()

    async def run():
        async with AsyncGateway(acct.key, server.url) as gw:
            org = await gw.orgs.create("Async Ltd")
            assert [m.role for m in await gw.orgs.members(org.id)] == ["owner"]
            assert org.id in [o.id for o in await gw.orgs.list()]
            return (await gw.orgs.audit(org.id)).entries[0].action

    assert asyncio.run(run()) == "org.create"


def test_provider_keys(make_account, gw_factory):
    gw = gw_factory(make_account().key)
    assert gw.provider_keys.list() == ProviderKeys(byok_only=False, byok_fallback=False, provider_keys=[])
    with pytest.raises(NotFound):
        gw.provider_keys.add("no-such-provider", "sk-own-key-123456")
    with pytest.raises(InvalidRequest):
        gw.provider_keys.add("demo_llm", "has spaces")
    key = gw.provider_keys.add("demo_llm", "sk-own-key-123456")
    assert (key.provider, key.prefix) == ("demo_llm", "sk-own-k")
    assert [k.id for k in gw.provider_keys.list().provider_keys] == [key.id]
    settings = gw.provider_keys.update_settings(byok_fallback=True)
    assert (settings.byok_only, settings.byok_fallback) == (False, True)
    assert gw.provider_keys.delete(key.id) is True
    with pytest.raises(NotFound):
        gw.provider_keys.delete(key.id)


def test_own_audit_log_paged_and_exported(make_account, gw_factory, server, tmp_path):
    """``gw.audit`` reads the caller's own account's log (``GET /api/audit``), as
    ``gw.orgs.audit`` reads an organisation's: pages by cursor, every entry as CSV, async too."""
    acct = make_account()
    gw = gw_factory(acct.key)
    key = gw.keys.create("ci", scopes=["call:write"])
    gw.keys.revoke(key.id)
    page = gw.audit(limit=1)
    assert [(e.action, e.target) for e in page.entries] == [("key.revoke", key.id)] and page.next_cursor
    rest = gw.audit(limit=200, cursor=page.next_cursor)
    assert [e.action for e in rest.entries] == ["key.create"] and rest.next_cursor is None
    exported = gw.audit_export(str(tmp_path / "audit.csv"))
    header, *rows = Path(exported).read_text().splitlines()
    assert header.startswith("id,created_at,actor_account_id,") and len(rows) == 2

    async def run():
        async with AsyncGateway(acct.key, server.url) as agw:
            first = await agw.audit(limit=1)
            return first.entries[0].action, await agw.audit_export(str(tmp_path / "async.csv"))

    action, path = asyncio.run(run())
    assert action == "key.revoke" and Path(path).read_text() == Path(exported).read_text()

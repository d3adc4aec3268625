"""Helpers for organisation tests: create an organisation over the API, add members the
way an accepted invitation does (the service), make organisation keys."""
from __future__ import annotations

from app.extensions import db
from app.models import Account


def h(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def make_org(client, owner, name="Acme") -> dict:
    r = client.post("/api/orgs", json={"name": name}, headers=owner.headers)
    assert r.status_code == 201, r.get_json()
    return r.get_json()


def join(app, org_id: str, acct, role: str) -> None:
    from app.services.orgs import orgs
    from app.services.orgs.audit import Actor
    from app.services.platform.uow import unit_of_work

    with app.app_context():
        with unit_of_work():
            orgs.add_member(org_id, acct.id, role, Actor(acct.id), via="test")
        db.session.remove()


def org_key(client, acct, org_id: str, **body) -> dict:
    r = client.post("/api/keys", json={"name": "org key", "org_id": org_id, **body}, headers=acct.headers)
    assert r.status_code == 201, r.get_json()
    return r.get_json()


def balances(app, *account_ids: str) -> list[int]:
    """Live balances in cents."""
    with app.app_context():
        out = [db.session.get(Account, a).balance_micros // 10_000 for a in account_ids]
        db.session.remove()
    return out


def fund(app, org_id: str, cents: int, plan: str | None = None) -> None:
    """Credit ``cents`` to the organisation's live balance (a test grant through the
    ledger), optionally on ``plan`` (its rate limit is the organisation's)."""
    from app.services.money import ledger

    with app.app_context():
        ledger.post("test_grant", [("adjust:test", -cents * 10_000), (ledger.customer(org_id), cents * 10_000)])
        if plan is not None:
            db.session.get(Account, org_id).plan = plan
        db.session.commit()
        db.session.remove()

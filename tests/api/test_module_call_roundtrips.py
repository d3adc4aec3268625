"""The metered call's database round trips (issue 18): on PostgreSQL one autocommit
statement before forwarding (``gw_open_calls``) and one after (``gw_finalize_calls``), no
BEGIN/COMMIT; a 402 leaves nothing behind (not even the reserved Idempotency-Key); a
replay runs one statement."""
from __future__ import annotations

import pytest
from sqlalchemy import Engine, func, select

from tests.support.finalize import drain
from tests.support.sqlevents import listening
from app.extensions import db
from app.models import IdempotencyRecord, ModuleCall, UsageHourly
from tests.gateway_helpers import balance_cents, call, mod, provider, provider_server  # noqa: F401


@pytest.fixture
def statements(app):  # noqa: ARG001
    """The SQL statements the app runs on any engine (pool pre-pings excluded) while the
    test runs; commits are listed as "COMMIT"."""
    seen: list[str] = []

    def _sql(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        if statement.strip().upper() != "SELECT 1":
            seen.append(statement)

    def _commit(conn):  # noqa: ARG001
        seen.append("COMMIT")

    with listening(Engine, ("before_cursor_execute", _sql), ("commit", _commit)):
        yield seen


def test_one_statement_before_and_one_after_forwarding(app, client, make_account, mod, statements,
                                                       ledger_clean):
    acct = make_account(cents=100)
    call(client, acct, {"action": "ok"}, key="rt-1")  # warm caches (credential, catalog)
    drain(app)  # rt-1's finalize, written after its answer, is not rt-2's
    statements.clear()
    r = call(client, acct, {"action": "ok"}, key="rt-2")
    assert r.status_code == 200, r.get_json()
    drain(app)  # rt-2's finalize is written by the process's writer after the answer
    writes = [s for s in statements if "gw_open_calls" in s or "gw_finalize_calls" in s or "module_calls" in s
              or "idempotency_records" in s or "ledger" in s or "usage_hourly" in s]
    assert len(writes) == 2, statements
    assert "gw_open_calls" in writes[0] and "gw_finalize_calls" in writes[1]
    # nothing else (the tests run without the credential cache): no COMMIT, no usage upsert
    assert [s for s in statements if s not in writes and "FROM api_keys" not in s] == [], statements
    # a replay: one statement, no second charge
    statements.clear()
    again = call(client, acct, {"action": "ok"}, key="rt-2")
    assert again.headers.get("Idempotent-Replayed") == "true" and again.data == r.data
    assert sum("gw_open_calls" in s for s in statements) == 1
    assert balance_cents(app, acct.id) == 100 - 2 * 3
    ledger_clean()


def test_402_rolls_back_the_reserved_key_and_writes_nothing(app, client, make_account, mod,
                                                             ledger_clean):
    acct = make_account(cents=2)  # the action costs 3 cents
    r = call(client, acct, {"action": "ok"}, key="poor-1")
    assert r.status_code == 402 and r.get_json()["error"] == "payment_required"
    with app.app_context():
        for model in (IdempotencyRecord, ModuleCall, UsageHourly):
            n = db.session.execute(select(func.count()).select_from(model)
                                   .where(model.account_id == acct.id)).scalar_one()
            assert n == 0, model.__tablename__
        db.session.remove()
    assert balance_cents(app, acct.id) == 2
    ledger_clean()


def test_key_spend_limit_refusal_leaves_nothing_and_frees_the_key(app, client, make_account, mod,
                                                                  ledger_clean):
    """The key's limit is checked inside the charging statement: a refusal undoes the
    reserved Idempotency-Key too, so the same key works once the limit allows it."""
    from app.models import KeySpend

    acct = make_account(cents=100)
    r = client.post("/api/keys", json={"name": "k", "spend_limit_cents": 2, "spend_limit_period": "day"},
                    headers=acct.headers)
    key = r.get_json()
    r = call(client, acct, {"action": "ok"}, key="lim-1", bearer=key["key"])  # costs 3 cents
    assert r.status_code == 402 and r.get_json()["error"] == "key_spend_limit_reached"
    assert r.get_json()["spent_cents"] == 0
    with app.app_context():
        for model in (IdempotencyRecord, ModuleCall):
            n = db.session.execute(select(func.count()).select_from(model)
                                   .where(model.account_id == acct.id)).scalar_one()
            assert n == 0, model.__tablename__
        assert db.session.execute(select(func.coalesce(func.sum(KeySpend.spent_micros), 0))).scalar_one() == 0
        db.session.remove()
    client.patch(f"/api/keys/{key['id']}", json={"spend_limit_cents": 9}, headers=acct.headers)
    assert call(client, acct, {"action": "ok"}, key="lim-1", bearer=key["key"]).status_code == 200
    assert balance_cents(app, acct.id) == 97
    ledger_clean()


def test_a_budgeted_org_keys_call_takes_the_same_two_statements(app, client, make_account, mod, statements,
                                                                 ledger_clean):
    """Issue 37 item 4: the member's budget is reserved inside ``gw_open_calls``, so an
    organisation key's call with a budget runs no statement more than a personal key's
    (besides resolving the credential: the key, the member's role); refused, it runs the
    one open statement and writes nothing."""
    from tests.orgkit import fund, h, join, make_org, org_key

    owner, dev = make_account(), make_account()
    org = make_org(client, owner)
    join(app, org["id"], dev, "developer")
    fund(app, org["id"], 100)
    key = org_key(client, dev, org["id"])
    r = client.patch(f"/api/orgs/{org['id']}/members/{dev.id}", json={"monthly_budget_cents": 6},
                     headers=owner.headers)
    assert r.status_code == 200, r.get_json()
    assert call(client, None, {"action": "ok"}, bearer=key["key"]).status_code == 200  # warm caches
    drain(app)
    for expected, writes_expected in ((200, 2), (402, 1)):
        statements.clear()
        r = client.post("/v1/module/svc/call", json={"action": "ok"}, headers=h(key["key"]))
        assert r.status_code == expected, r.get_json()
        drain(app)
        writes = [s for s in statements if "gw_open_calls" in s or "gw_finalize_calls" in s
                  or "module_calls" in s or "ledger" in s]
        assert len(writes) == writes_expected and "gw_open_calls" in writes[0], statements
        credential = [s for s in statements if "FROM api_keys" in s or "FROM org_members" in s]
        rest = [s for s in statements if s not in writes + credential]
        if expected == 200:
            assert rest == [], statements
        else:  # the 402's details: reads only
            assert not any(s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")) for s in rest), rest
    assert balance_cents(app, org["id"]) == 100 - 2 * 3
    ledger_clean()

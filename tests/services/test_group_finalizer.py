"""Group commit of the metered call's finalize (``money.charging.GroupFinalizer``):
finalizations that arrive while one is being written go out together in the next
statement; each caller gets its own outcome, an error reaches every member of its group,
the lead always passes on (no caller is left waiting), and on PostgreSQL one statement
finalizes exactly the calls that are still pending."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select

from app.extensions import db
from app.models import IdempotencyRecord, ModuleCall
from app.services.money import charging
from app.services.money.refunds import refund
from tests.gateway_helpers import balance_cents, call, mod, provider, provider_server  # noqa: F401


def _item(call_id: str) -> charging._Member:
    return charging._Member({"id": call_id})


def test_calls_arriving_during_a_write_share_the_next_statement(monkeypatch):
    groups: list[list[str]] = []
    first_started = threading.Event()

    def write(rows):
        groups.append([r["id"] for r in rows])
        first_started.set()
        time.sleep(0.05)  # the statement's round trip
        return {r["id"] for r in rows if not r["id"].endswith("-late")}

    monkeypatch.setattr(charging, "_write_group", write)
    fin = charging.GroupFinalizer()
    with ThreadPoolExecutor(max_workers=12) as pool:
        lead = pool.submit(fin.finalize, _item("c-0"))
        first_started.wait(2)
        rest = {f"c-{i}" + ("-late" if i == 5 else ""): None for i in range(1, 12)}
        futures = {cid: pool.submit(fin.finalize, _item(cid)) for cid in rest}
        assert lead.result(5) is True
        outcomes = {cid: f.result(5) for cid, f in futures.items()}
    assert outcomes == {cid: not cid.endswith("-late") for cid in rest}
    assert groups[0] == ["c-0"]
    assert sorted(c for g in groups[1:] for c in g) == sorted(rest)  # each written once
    assert len(groups) < 1 + len(rest)  # ... and not one statement each
    assert not fin._busy and fin._queue == []


def test_an_error_reaches_every_member_of_its_group_and_the_lead_passes_on(monkeypatch):
    calls = {"n": 0}
    gate = threading.Event()

    def write(rows):
        calls["n"] += 1
        if calls["n"] == 1:
            gate.wait(2)  # everyone else queues behind the first statement
            return {rows[0]["id"]}
        if calls["n"] == 2:
            raise RuntimeError("database went away")
        return {r["id"] for r in rows}

    monkeypatch.setattr(charging, "_write_group", write)
    fin = charging.GroupFinalizer()
    with ThreadPoolExecutor(max_workers=8) as pool:
        first = pool.submit(fin.finalize, _item("a"))
        time.sleep(0.05)
        queued = [pool.submit(fin.finalize, _item(f"b{i}")) for i in range(5)]
        time.sleep(0.05)
        gate.set()
        assert first.result(5) is True
        for f in queued:  # the second statement carried all five and failed for all
            with pytest.raises(RuntimeError, match="went away"):
                f.result(5)
        assert fin.finalize(_item("c")) is True  # the finalizer is free again
    assert calls["n"] == 3 and not fin._busy


def test_many_rounds_never_leave_a_caller_waiting(monkeypatch):
    monkeypatch.setattr(charging, "_write_group", lambda rows: time.sleep(0.001) or {r["id"] for r in rows})
    fin = charging.GroupFinalizer()
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda i: fin.finalize(_item(f"x{i}")), range(2000), timeout=30))
    assert results == [True] * 2000 and not fin._busy and fin._queue == []


def test_one_statement_finalizes_only_the_calls_still_pending(app, make_account, mod, ledger_clean):
    """Three pending calls (with keys), one refunded by the sweep meanwhile: one group
    statement moves the other two to succeeded with their keys' stored responses."""
    from app.services.gateway import calls as gateway
    from app.services.gateway import catalog

    acct = make_account(cents=100)
    with app.test_request_context():
        m = catalog.get_module("svc")
        act = catalog.get_action(m, "ok")
        opened = [gateway.open_call(account_id=acct.id, mode="live", mod=m, act=act, body={"action": "ok", "n": i},
                                    idempotency_key=f"grp-{i}") for i in range(3)]
        assert refund(opened[1], "provider_timeout") is True
        rows = [{"id": str(c), "created_at": c.created_at, "ok": True, "provider_status": 200,
                 "receipt": {"hash": "h", "sig": "s"}, "finished_at": c.created_at, "account_id": acct.id,
                 "idem_key": f"grp-{i}", "response_body": f'{{"n": {i}}}'} for i, c in enumerate(opened)]
        assert charging._write_group(rows) == {str(opened[0]), str(opened[2])}
        db.session.remove()
    with app.app_context():
        status = dict(db.session.execute(select(ModuleCall.id, ModuleCall.status)
                                         .where(ModuleCall.account_id == acct.id)).all())
        assert status == {str(opened[0]): "succeeded", str(opened[1]): "refunded",
                          str(opened[2]): "succeeded"}
        keys = {r.key: (r.status, r.response_body) for r in db.session.execute(
            select(IdempotencyRecord).where(IdempotencyRecord.account_id == acct.id)).scalars()}
        assert keys["grp-0"] == ("done", '{"n": 0}') and keys["grp-2"] == ("done", '{"n": 2}')
        assert keys.get("grp-1", ("released",))[0] != "done"  # released by the refund
        db.session.remove()
    assert balance_cents(app, acct.id) == 100 - 2 * 3
    ledger_clean()


def test_concurrent_calls_each_get_their_own_answer(app, make_account, mod, ledger_clean, monkeypatch):
    """8 threads of calls through the real route, finalized durably (grouped finalizes on
    PostgreSQL): every answer is the caller's own call, charged once, with a verifying
    receipt."""
    from app.services.gateway import receipts

    monkeypatch.setitem(app.config, "CALL_FINALIZE_DEFERRED", False)  # the durable mode's groups

    accts = [make_account(cents=1000) for _ in range(16)]  # 4 calls each: under the plan's rate limit

    def one(i):
        with app.test_client() as c:
            r = call(c, accts[i % 16], {"action": "ok", "i": i}, key=f"conc-{i}")
            return i, r.status_code, r.get_json()

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(one, range(64)))
    with app.app_context():
        keys = {k["kid"]: k["public_key"] for k in receipts.public_keys()}
    ids = set()
    for i, status, data in answers:
        assert status == 200, data
        assert data["result"]["echo"]["i"] == i
        assert receipts.verify_response(data, keys)["call_id"] == data["call_id"]
        ids.add(data["call_id"])
    assert len(ids) == 64
    for a in accts:
        assert balance_cents(app, a.id) == 1000 - 4 * 3
    ledger_clean()

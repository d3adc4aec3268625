"""A process dying between the debit and the finalize leaves a pending call; the sweep
refunds it exactly once, and a late finalize after the sweep is not charged."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select, update

from app.tasks import job_paths as as_paths
from app.extensions import db
from app.models import LedgerTransaction, ModuleCall
from app.models.base import utcnow
from app.services.gateway import catalog
from app.services.gateway import calls as gateway
from app.services.money import charging, ledger
from app.services.gateway import upstream
from tests.gateway_helpers import balance_cents, mod, provider, provider_server  # noqa: F401


def _crashed_call(app, acct, key=None) -> str:
    """Run only the charging transaction, as if the process died right after it."""
    with app.app_context():
        m = catalog.get_module("svc")
        call_id = gateway.open_call(account_id=acct.id, mode="live", mod=m, act=m.actions["ok"],
                                    body={"action": "ok"}, idempotency_key=key)
        db.session.remove()
    return call_id


def _expire(app, call_id):
    """Move the call's deadline into the past; returns the call id carrying that deadline
    (what the process that opened it would hold by now)."""
    deadline = utcnow() - timedelta(seconds=1)
    with app.app_context():
        db.session.execute(update(ModuleCall).where(ModuleCall.id == call_id)
                           .values(deadline_at=deadline))
        db.session.commit()
        db.session.remove()
    return charging.OpenedCall(str(call_id), call_id.created_at, deadline)


def test_sweep_refunds_crashed_call_exactly_once(app, client, make_account, mod, ledger_clean):
    acct = make_account(cents=10)
    call_id = _crashed_call(app, acct, key="crash-key")
    assert balance_cents(app, acct.id) == 7
    # in flight until resolved
    r = client.post("/v1/module/svc/call", json={"action": "ok"},
                    headers={**acct.headers, "Idempotency-Key": "crash-key"})
    assert r.status_code == 409 and r.get_json()["error"] == "idempotency_key_in_use"
    with app.app_context():
        assert gateway.sweep_pending() == 0  # not past its deadline yet
        db.session.remove()
    _expire(app, call_id)
    with app.app_context():
        assert gateway.sweep_pending() == 1
        assert gateway.sweep_pending() == 0
        assert gateway.refund(call_id, "swept") is False
        refunds = db.session.execute(select(func.count()).select_from(LedgerTransaction)
                                     .where(LedgerTransaction.ref == f"call_refund:{call_id}")).scalar_one()
        row = db.session.get(ModuleCall, call_id)
        assert (row.status, row.error) == ("refunded", "swept")
        db.session.remove()
    assert refunds == 1
    assert balance_cents(app, acct.id) == 10
    u = client.get("/api/usage/current", headers=acct.headers).get_json()
    assert (u["calls"], u["spend_cents"]) == (1, 0)
    # the key was released: the client's retry is a fresh call
    r = client.post("/v1/module/svc/call", json={"action": "ok"},
                    headers={**acct.headers, "Idempotency-Key": "crash-key"})
    assert r.status_code == 200 and r.get_json()["call_id"] != call_id
    ledger_clean()


def test_late_finalize_after_sweep_is_not_charged(app, make_account, mod, ledger_clean):
    acct = make_account(cents=10)
    # finishing past its deadline, the call's finalize is written before any answer (in
    # the deferred mode too: charging.finalize_pg), and finds the call refunded
    call_id = _expire(app, _crashed_call(app, acct))
    with app.app_context():
        assert gateway.sweep_pending() == 1
        m = catalog.get_module("svc")
        answer = upstream.ProviderAnswer(status=200, ok=True, result={"late": True})
        try:
            gateway._finalize(call_id, acct.id, "svc", m.actions["ok"], "live", answer, None)
            raised = None
        except gateway.ProviderTimeout as exc:
            raised = exc
        status = db.session.get(ModuleCall, call_id).status
        db.session.remove()
    assert raised is not None and status == "refunded"
    assert balance_cents(app, acct.id) == 10
    ledger_clean()


def test_sweep_job_and_cli(app, make_account, mod):
    from app.tasks.gateway import purge_idempotency, sweep_pending_calls
    from app.tasks.schedule import SCHEDULE

    names = {name: path for name, _i, path in as_paths(SCHEDULE)}
    assert names["calls-sweep"] == "app.tasks.gateway.sweep_pending_calls"
    assert names["idempotency-purge"] == "app.tasks.gateway.purge_idempotency"
    acct = make_account(cents=10)
    _expire(app, _crashed_call(app, acct))
    with app.app_context():
        assert sweep_pending_calls() == 1 and purge_idempotency() == 0
        db.session.remove()
    _expire(app, _crashed_call(app, acct))
    r = app.test_cli_runner().invoke(args=["calls", "sweep"])
    assert r.exit_code == 0 and '"refunded": 1' in r.output
    assert balance_cents(app, acct.id) == 10
    with app.app_context():
        assert ledger.check() == []
        db.session.remove()


def test_failure_while_finalizing_refunds_at_once(app, client, make_account, mod, monkeypatch, ledger_clean):
    from app.services.gateway import receipts

    def broken(**kwargs):
        raise OSError("keyring unreadable")

    monkeypatch.setattr(receipts, "sign", broken)
    acct = make_account(cents=10)
    r = client.post("/v1/module/svc/call", json={"action": "ok"}, headers=acct.headers)
    assert r.status_code == 500 and r.get_json()["error"] == "internal_error"
    assert balance_cents(app, acct.id) == 10
    with app.app_context():
        row = db.session.execute(select(ModuleCall)).scalar_one()
        assert (row.status, row.error) == ("refunded", "internal_error")
        db.session.remove()
    ledger_clean()

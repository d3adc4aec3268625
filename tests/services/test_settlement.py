"""Monthly settlement: amounts, idempotency, crash safety, notifications, CLI, schedule."""
from __future__ import annotations

from app.tasks import job_paths as as_paths
import json
from datetime import datetime, timezone

import pytest
from sqlalchemy import func, select
from standardwebhooks import Webhook

from app.extensions import db
from app.models import Account, AgentSettlement, LedgerTransaction, OutboxMessage
from app.services.money import ledger
from app.services.platform import outbox
from app.services.money import settlement
from tests.agentkit import Keypair, charge, refund, register
from tests.support.concurrency import at_once
from tests.support.standin import recorder

SEPT = datetime(2026, 9, 15, 12, tzinfo=timezone.utc)
OCT = datetime(2026, 10, 3, 12, tzinfo=timezone.utc)
LATER = datetime(2026, 11, 2, tzinfo=timezone.utc)


@pytest.fixture
def agents(client, make_account):
    def make(n=1, webhook=None):
        out = []
        for i in range(n):
            owner = make_account()
            out.append(register(client, owner, Keypair(), name=f"agent{i}", webhook=webhook).get_json())
        return out
    return make


@pytest.fixture
def payer(make_account):
    return make_account(cents=100_000)


def _balance(account_id):
    return db.session.get(Account, account_id, populate_existing=True).balance_micros


def _txn_count():
    return db.session.execute(select(func.count()).select_from(LedgerTransaction)).scalar_one()


def test_settles_month_once(app, agents, payer, ledger_clean):
    (ag,) = agents()
    with app.app_context():
        charge(payer.id, ag["id"], 100, at=SEPT)      # 30 cents in September
        charge(payer.id, ag["id"], 50, at=OCT)        # 15 cents in October: not in September's run
        summary = settlement.settle_month("2026-09", now=LATER)
        assert summary["settled"] == 1 and summary["total_cents"] == 30
        assert _balance(ag["account_id"]) == 300_000
        assert ledger.balance(ledger.earnings(ag["id"])) == 150_000
        stmt = db.session.query(AgentSettlement).one()
        assert stmt.month == "2026-09" and stmt.amount_micros == 300_000
        txn = db.session.get(LedgerTransaction, stmt.ledger_txn_id)
        assert txn.ref == f"settle:{ag['id']}:2026-09" and txn.kind == "agent_settlement"
        before = _txn_count()
        again = settlement.settle_month("2026-09", now=LATER)
        assert again["settled"] == 0 and again["already_settled"] == 1
        assert _txn_count() == before and _balance(ag["account_id"]) == 300_000
        october = settlement.settle_month("2026-10", now=LATER)
        assert october["total_cents"] == 15 and _balance(ag["account_id"]) == 450_000
        assert ledger.balance(ledger.earnings(ag["id"])) == 0
    ledger_clean()


def test_earnings_endpoint_after_settlement(app, client, agents, payer, make_account):
    owner = make_account()
    kp = Keypair()
    ag = register(client, owner, kp).get_json()
    with app.app_context():
        charge(payer.id, ag["id"], 100, at=SEPT)
        charge(payer.id, ag["id"], 10, at=OCT)
        settlement.settle_month("2026-09", now=LATER)
    body = client.get(f"/api/agent/{ag['id']}/earnings", headers=owner.headers).get_json()
    assert (body["accrued_cents"], body["settled_cents"], body["lifetime_cents"]) == (3, 30, 33)
    assert [(s["month"], s["amount_cents"]) for s in body["settlements"]] == [("2026-09", 30)]


def test_unfinished_month_and_bad_month_refused(app, agents):
    with app.app_context():
        for month in ("2026-13", "26-01", "", "2026-1"):
            with pytest.raises(settlement.InvalidRequest):
                settlement.settle_month(month, now=LATER)
        with pytest.raises(settlement.InvalidRequest):  # November has not ended
            settlement.settle_month("2026-11", now=LATER)
        with pytest.raises(settlement.InvalidRequest):  # ended, but within the grace period
            settlement.settle_month("2026-10", now=datetime(2026, 11, 1, 0, 30, tzinfo=timezone.utc))


def test_late_refund_never_overdraws_earnings(app, agents, payer, ledger_clean):
    (ag,) = agents()
    with app.app_context():
        charge(payer.id, ag["id"], 100, at=SEPT)
        refund(payer.id, ag["id"], 100, at=OCT)       # refund of a September call, in October
        charge(payer.id, ag["id"], 10, at=OCT)
        s = settlement.settle_month("2026-09", now=LATER)
        # September accrued 30, but only 3 remain after the refund: never more than that
        assert s["total_cents"] == 3 and ledger.balance(ledger.earnings(ag["id"])) == 0
    ledger_clean()


def test_crash_midway_leaves_each_agent_all_or_nothing(app, agents, payer, monkeypatch, ledger_clean):
    trio = agents(3, webhook="http://127.0.0.1:9/hook")
    with app.app_context():
        for ag in trio:
            charge(payer.id, ag["id"], 100, at=SEPT)
    victim = sorted(a["id"] for a in trio)[1]
    real_add = outbox.add_webhook

    def flaky(url, event, data, **kw):
        if data["agent_id"] == victim:
            raise RuntimeError("disk full")  # after the ledger posting, before commit
        return real_add(url, event, data, **kw)

    monkeypatch.setattr(outbox, "add_webhook", flaky)
    monkeypatch.setattr(outbox, "dispatch", lambda *ids: None)
    with app.app_context():
        with pytest.raises(settlement.SettlementIncomplete) as exc:
            settlement.settle_month("2026-09", now=LATER)
        assert exc.value.extra["summary"]["failed"] == 1
        for ag in trio:
            settled = ag["id"] != victim
            assert _balance(ag["account_id"]) == (300_000 if settled else 0)
            assert ledger.balance(ledger.earnings(ag["id"])) == (0 if settled else 300_000)
            assert db.session.query(AgentSettlement).filter_by(agent_id=ag["id"]).count() == int(settled)
            assert db.session.query(OutboxMessage).filter_by(
                source=f"settlement:{db.session.query(AgentSettlement.id).filter_by(agent_id=ag['id']).scalar()}"
            ).count() == int(settled)
        assert not ledger.already_posted(f"settle:{victim}:2026-09")
    ledger_clean()
    monkeypatch.setattr(outbox, "add_webhook", real_add)
    with app.app_context():
        s = settlement.settle_month("2026-09", now=LATER)
        assert s["settled"] == 1 and s["already_settled"] == 2
        assert all(_balance(ag["account_id"]) == 300_000 for ag in trio)
    ledger_clean()


class ProcessDied(BaseException):
    """Stands in for the process being killed mid-settlement."""


def test_process_death_rolls_back_the_agent_in_progress(app, agents, payer, monkeypatch, ledger_clean):
    pair = agents(2)
    with app.app_context():
        for ag in pair:
            charge(payer.id, ag["id"], 100, at=SEPT)
    first, second = sorted(a["id"] for a in pair)
    real_post = ledger.post

    def dying(kind, legs, **kw):
        txn = real_post(kind, legs, **kw)
        if kind == "agent_settlement" and kw["ref"].startswith(f"settle:{second}:"):
            raise ProcessDied()
        return txn

    monkeypatch.setattr(ledger, "post", dying)
    with app.app_context():
        with pytest.raises(ProcessDied):
            settlement.settle_month("2026-09", now=LATER)
        db.session.remove()
    with app.app_context():
        assert ledger.already_posted(f"settle:{first}:2026-09")
        assert not ledger.already_posted(f"settle:{second}:2026-09")
        assert db.session.query(AgentSettlement).count() == 1
    ledger_clean()
    monkeypatch.setattr(ledger, "post", real_post)
    with app.app_context():
        assert settlement.settle_month("2026-09", now=LATER)["settled"] == 1
        assert db.session.query(AgentSettlement).count() == 2
    ledger_clean()


def test_settlement_webhook_is_signed(app, client, make_account, payer):
    rec = recorder([200])
    with rec as url:
        owner = make_account()
        ag = register(client, owner, Keypair(), webhook=url + "/agent").get_json()
        with app.app_context():
            charge(payer.id, ag["id"], 100, at=SEPT)
            settlement.settle_month("2026-09", now=LATER)
            settlement.settle_month("2026-09", now=LATER)
    assert len(rec.requests) == 1
    got = rec.requests[0]
    payload = Webhook(ag["webhook_secret"]).verify(got.body, {k.lower(): v for k, v in got.headers.items()})
    assert payload["type"] == "settlement.completed"
    assert payload["data"]["agent_id"] == ag["id"] and payload["data"]["amount_cents"] == 30
    assert payload["data"]["month"] == "2026-09" and payload["data"]["account_id"] == ag["account_id"]


def test_cli_and_schedule(app, agents, payer, ledger_clean):
    (ag,) = agents()
    with app.app_context():
        charge(payer.id, ag["id"], 100, at=SEPT)
    runner = app.test_cli_runner()
    out = runner.invoke(args=["settle", "--month", "2026-09"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["total_cents"] == 30
    out = runner.invoke(args=["settle", "--month", "2026-09"])
    assert json.loads(out.output)["settled"] == 0
    assert runner.invoke(args=["settle", "--month", "nope"]).exit_code == 1
    from app.tasks.schedule import SCHEDULE
    assert ("agent-settlement", 6 * 3600, "app.tasks.agents.settle_due") in as_paths(SCHEDULE)
    with app.app_context():
        assert settlement.settle_due(datetime(2026, 10, 1, 0, 10, tzinfo=timezone.utc)) is None  # grace
        res = settlement.settle_due(datetime(2026, 10, 1, 6, tzinfo=timezone.utc))
        assert res["month"] == "2026-09" and res["already_settled"] == 1
        assert settlement.previous_month(datetime(2026, 1, 5, tzinfo=timezone.utc)) == "2025-12"
    ledger_clean()


def test_concurrent_runs_settle_each_agent_once(app, agents, payer, ledger_clean):
    trio = agents(3)
    with app.app_context():
        for ag in trio:
            charge(payer.id, ag["id"], 100, at=SEPT)

    def run():
        with app.app_context():
            try:
                settlement.settle_month("2026-09", now=LATER)
            except Exception as exc:  # noqa: BLE001 - asserted below: none
                return exc
            finally:
                db.session.remove()

    errors = [e for e in at_once(4, run) if e is not None]
    with app.app_context():
        assert errors == []  # row locks: the losers just skip
        assert db.session.query(AgentSettlement).count() == 3
        for ag in trio:
            assert _balance(ag["account_id"]) == 300_000
            assert ledger.balance(ledger.earnings(ag["id"])) == 0
    ledger_clean()

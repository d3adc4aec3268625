"""Monthly partitions (the baseline migration, app/services/platform/partitions.py): what
the baseline makes, the partition-creation job (gw_create_month_partition,
app/services/platform/sql/), and the call-log retention job, which never touches the
ledger."""
from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from app.extensions import db
from app.models import ChatCompletion, LedgerEntry, ModuleCall
from app.services.money import ledger
from app.services.platform import partitions
from app.services.platform.uow import unit_of_work
from tests.gateway_helpers import mod, provider, provider_server  # noqa: F401
from tests.support.finalize import drain

TABLES = ("module_calls", "chat_completions", "ledger_entries")


@pytest.fixture
def pg(app, ctx):
    made = []
    yield made
    # drop the partitions a test created, so the shared test schema stays as migrated
    db.session.rollback()
    for name in made:
        db.session.execute(text(f'DROP TABLE IF EXISTS "{name}"'))
    db.session.commit()


def _at(y, m, d=15):
    return datetime(y, m, d, 12, tzinfo=timezone.utc)


def _call(call_id, at, status="succeeded", account="acct_p"):
    return ModuleCall(id=call_id, account_id=account, module_id=1, module_slug="svc", action="ok",
                      mode="live", status=status, price_micros=10, charged=False,
                      created_at=at, deadline_at=at + timedelta(minutes=1))


def _where(table, key, value) -> str:
    return db.session.execute(text(f"SELECT tableoid::regclass::text FROM {table} WHERE {key} = :v"),
                              {"v": value}).scalar_one()


def _relkind(table) -> str:
    return db.session.execute(text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"),
                              {"t": table}).scalar_one()


def _pk(table) -> str:
    return db.session.execute(text(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = to_regclass(:t) "
        "AND contype = 'p'"), {"t": table}).scalar_one()


def test_the_baseline_partitions_the_call_log_and_the_ledger_legs(app, pg):
    """Each table partitioned by month with primary key (id, created_at), a DEFAULT
    partition and this month's and the next 3; rows land in their month's partition; the
    ledger's foreign key, id sequence and global ref still hold."""
    now = datetime.now(timezone.utc)
    months = [partitions.month_start(now.date(), n) for n in range(4)]
    for table in TABLES:
        assert _relkind(table) == "p"
        assert _pk(table) == "PRIMARY KEY (id, created_at)"
        names = {p.name for p in partitions.partitions(table)}
        assert {f"{table}_default"} | {f"{table}_p{m:%Y_%m}" for m in months} <= names
    with unit_of_work():
        db.session.add(_call("call_new", now))
        db.session.add(ChatCompletion(id="chatcmpl-new", account_id="acct_p", requested_model="m",
                                      status="settled", created_at=now))
        txn = ledger.post("grant", [("promo:grants", -500), ("external:test", 500)], ref="grant:partition-test")
    assert _where("module_calls", "id", "call_new") == f"module_calls_p{now:%Y_%m}"
    assert _where("chat_completions", "id", "chatcmpl-new") == f"chat_completions_p{now:%Y_%m}"
    assert {_where("ledger_entries", "id", i) for i, in db.session.execute(
        text("SELECT id FROM ledger_entries WHERE txn_id = :t"), {"t": txn})} == {f"ledger_entries_p{now:%Y_%m}"}
    with pytest.raises(Exception):
        with unit_of_work():
            db.session.add(LedgerEntry(txn_id=10**12, ledger_account="x", amount_micros=1))
    with pytest.raises(Exception):
        with unit_of_work():
            ledger.post("grant", [("promo:grants", -1), ("external:test", 1)], ref="grant:partition-test")


def test_ensure_ahead_creates_the_coming_months_once(app, pg):
    pg += [f"{t}_p2031_{m:02d}" for t in TABLES for m in (1, 2, 3)]
    created = partitions.ensure_ahead(2, today=date(2031, 1, 20))
    assert sorted(created) == sorted(pg)
    assert partitions.ensure_ahead(2, today=date(2031, 1, 20)) == []
    names = [p.name for p in partitions.partitions("module_calls")]
    assert names[-1] == "module_calls_default"
    assert names.index("module_calls_p2031_01") < names.index("module_calls_p2031_03")
    with unit_of_work():
        db.session.add(_call("call_2031", _at(2031, 2)))
    assert _where("module_calls", "id", "call_2031") == "module_calls_p2031_02"


def test_a_row_without_partition_lands_in_default_and_moves_when_its_month_is_created(app, pg):
    pg += [f"{t}_p2032_05" for t in TABLES]
    with unit_of_work():
        db.session.add(_call("call_2032", _at(2032, 5)))
    assert _where("module_calls", "id", "call_2032") == "module_calls_default"
    assert "module_calls_p2032_05" in partitions.ensure_ahead(0, today=date(2032, 5, 2))
    assert _where("module_calls", "id", "call_2032") == "module_calls_p2032_05"
    assert db.session.execute(text("SELECT count(*) FROM module_calls_default")).scalar() == 0


def test_retention_drops_old_call_log_months_and_never_the_ledger(app, pg):
    pg += [f"{t}_p2020_{m:02d}" for t in TABLES for m in (1, 2, 3)]
    for m in (1, 2, 3):
        for t in TABLES:
            db.session.execute(text("SELECT gw_create_month_partition(:t, :m)"), {"t": t, "m": date(2020, m, 1)})
    db.session.commit()
    with unit_of_work():
        db.session.add_all([_call("call_jan", _at(2020, 1)), _call("call_feb_pending", _at(2020, 2), "pending"),
                            _call("call_mar", _at(2020, 3))])
        db.session.add(ChatCompletion(id="chatcmpl-jan", account_id="acct_p", requested_model="m",
                                      status="settled", created_at=_at(2020, 1)))
        ledger.post("grant", [("promo:grants", -7), ("external:test", 7)], ref="grant:2020-01",
                    created_at=_at(2020, 1))
    res = partitions.drop_expired(1, today=date(2020, 4, 10))  # keep March (and newer)
    assert sorted(res.dropped) == ["chat_completions_p2020_01", "chat_completions_p2020_02",
                                   "module_calls_p2020_01"]
    assert res.kept_unfinished == ["module_calls_p2020_02"]  # a pending call: money not settled
    assert db.session.get(ModuleCall, "call_jan") is None
    assert db.session.get(ModuleCall, "call_feb_pending") is not None
    assert db.session.get(ModuleCall, "call_mar") is not None
    # the ledger: every partition and every leg still there, and the books still balance
    assert {"ledger_entries_p2020_01", "ledger_entries_p2020_02"} <= {
        p.name for p in partitions.partitions("ledger_entries")}
    assert db.session.execute(text("SELECT count(*) FROM ledger_entries WHERE created_at < '2020-02-01'")
                              ).scalar() == 2
    assert ledger.check() == []
    with pytest.raises(ValueError):
        partitions.drop_expired(1, today=date(2020, 4, 10), tables=("ledger_entries",))


def test_retention_zero_keeps_everything(app, pg):
    pg += [f"{t}_p2019_06" for t in TABLES]
    for t in TABLES:
        db.session.execute(text("SELECT gw_create_month_partition(:t, :m)"), {"t": t, "m": date(2019, 6, 1)})
    db.session.commit()
    assert app.config["CALL_LOG_RETENTION_MONTHS"] == 0
    assert partitions.drop_expired(today=date(2030, 1, 1)).dropped == []
    assert "module_calls_p2019_06" in {p.name for p in partitions.partitions("module_calls")}


def test_partition_names():
    assert partitions.is_partition("module_calls_p2026_11")
    assert partitions.is_partition("ledger_entries_default")
    assert not partitions.is_partition("module_calls")
    assert not partitions.is_partition("accounts_p2026_11")
    assert partitions.month_start(date(2026, 1, 31), -1) == date(2025, 12, 1)
    assert partitions.month_start(date(2026, 11, 5), 3) == date(2027, 2, 1)


def test_cli_lists_the_partitions_and_retention_refuses_the_ledger(app, ctx):
    with pytest.raises(ValueError):
        partitions.drop_expired(1, tables=("module_calls", "ledger_entries"))
    out = app.test_cli_runner().invoke(args=["partitions", "list"])
    assert out.exit_code == 0
    listed = json.loads(out.output)  # the migration made this month's and the default
    month = f"{datetime.now(timezone.utc):%Y_%m}"
    assert all({f"{t}_p{month}", f"{t}_default"} <= set(listed[t]) for t in TABLES)
    assert partitions.drop_expired(3).dropped == []


def test_single_row_statements_of_a_call_prune_to_its_month(app, pg, make_account, mod):
    """The finalize and the refund of a call just opened carry its ``created_at``: a row
    with the same id in another month (possible only because the key is (id, created_at))
    is not touched — without the pruning predicate both rows would be updated."""
    from app.services.gateway import calls as gateway, catalog, upstream

    acct = make_account(cents=10)
    m = catalog.get_module("svc")
    done, failed = (gateway.open_call(account_id=acct.id, mode="live", mod=m, act=m.actions["ok"],
                                      body={"action": "ok"}) for _ in range(2))
    with unit_of_work():
        db.session.add_all([_call(str(done), _at(2020, 1), "pending", acct.id),
                            _call(str(failed), _at(2020, 1), "pending", acct.id)])
    answer = upstream.ProviderAnswer(status=200, ok=True, result={"x": 1})
    gateway._finalize(done, acct.id, "svc", m.actions["ok"], "live", answer, None)
    drain(app)  # the finalize is written after _finalize returns (deferred finalize)
    assert gateway.refund(failed, "provider_error") is True
    rows = dict(db.session.execute(text("SELECT id || ':' || extract(year FROM created_at), status "
                                        "FROM module_calls")).all())
    assert rows == {f"{done}:{done.created_at.year}": "succeeded", f"{done}:2020": "pending",
                    f"{failed}:{failed.created_at.year}": "refunded", f"{failed}:2020": "pending"}

"""Usage from the call logs (issue 18): nothing on a metered path writes usage; readers
sum the rolled hours and the call log after the mark; the roll job is idempotent and
rolls only final hours."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import select, text

from app.extensions import db
from app.models import ChatCompletion, ModuleCall, UsageHourly, UsageRollupState
from app.services.billing import usage, usage_log

T = datetime(2026, 3, 15, 10, 20, tzinfo=timezone.utc)
H = timedelta(hours=1)


def _call(n, account_id, status, at, price=30_000, mode="live", slug="echo"):
    db.session.add(ModuleCall(id=f"call_{n}", account_id=account_id, module_id=1, module_slug=slug,
                              action="ok", mode=mode, status=status, price_micros=price, charged=True,
                              created_at=at, deadline_at=at + timedelta(seconds=90)))


def _chat(n, account_id, status, at, cost=5_000, error=None, mode="live", model="m1", settled_at=None):
    db.session.add(ChatCompletion(id=f"chatcmpl-{n}", account_id=account_id, mode=mode,
                                  requested_model="auto",
                                  model=model if status != "released" else None, status=status,
                                  cost_micros=cost if status != "released" else 0, error=error,
                                  created_at=at, settled_at=None if status == "held" else (settled_at or at)))


def _never_rolled():
    """As on a database where the roll job never ran (the migration sets the mark to the
    hour it ran; the tests' timestamps are older)."""
    db.session.execute(UsageRollupState.__table__.delete())


def _seed(account_id):
    _never_rolled()
    _call(1, account_id, "succeeded", T)
    _call(2, account_id, "refunded", T + timedelta(minutes=5))           # error, no spend
    _call(3, account_id, "succeeded", T + H, slug="other")
    _call(4, account_id, "succeeded", T, mode="test")
    _chat(1, account_id, "settled", T)
    _chat(2, account_id, "released", T + H)                               # error, no spend
    _chat(3, account_id, "settled", T + H, error="upstream cut the stream")  # error, charged
    _chat(4, account_id, "held", T + 3 * H)                               # not counted yet
    db.session.commit()


def _hourly(account_id):
    return sorted((r.product, r.mode, r.hour, r.calls, r.errors, r.spend_micros) for r in db.session.execute(
        select(UsageHourly).where(UsageHourly.account_id == account_id)).scalars())


def test_readers_count_the_call_log_before_and_after_the_roll(app, account):
    with app.app_context():
        _seed(account.id)
        start, end = usage.billing_period(T)
        expect = {"calls": 6, "errors": 3, "spend_micros": 30_000 + 30_000 + 5_000 + 5_000}
        assert usage.totals(account.id, start, end) == expect           # all from the log
        assert usage.totals(account.id, start, end, mode="test")["calls"] == 1
        by = {r["product"]: r for r in usage.by_product(account.id, start, end)}
        assert by["chat:m1"] == {"product": "chat:m1", "calls": 2, "errors": 1, "spend_micros": 10_000}
        assert by["chat:auto"]["errors"] == 1 and by["echo"]["calls"] == 2
        days = usage.daily_rows(account.id, 3, now=T + timedelta(days=1))
        assert [d["calls"] for d in days] == [0, 6, 0]

        assert usage_log.roll(now=T + 3 * H) == 3  # 10:00, 11:00, 12:00 (13:00 is not over yet)
        rolled = _hourly(account.id)
        assert ("echo", "live", usage_log.hour_of(T), 2, 1, 30_000) in rolled
        assert usage.totals(account.id, start, end) == expect           # rolled + tail: the same
        assert usage.daily_rows(account.id, 3, now=T + timedelta(days=1))[1]["calls"] == 6
        # idempotent: rolling the same hours again from the log gives the same rows
        db.session.execute(UsageRollupState.__table__.update().values(rolled_through=usage_log.hour_of(T)))
        db.session.commit()
        usage_log.roll(now=T + 3 * H)
        assert _hourly(account.id) == rolled
        assert usage_log.roll(now=T + 3 * H) == 0


def test_an_hour_with_a_pending_call_or_inside_the_margin_is_not_rolled(app, account):
    with app.app_context():
        _never_rolled()
        _call(1, account.id, "succeeded", T)
        _call(2, account.id, "pending", T + H)
        db.session.commit()
        assert usage_log.roll(now=T + 5 * H) == 1                        # hour of T only
        assert usage_log.rolled_through() == usage_log.hour_of(T + H)
        db.session.execute(ModuleCall.__table__.update().where(ModuleCall.id == "call_2")
                           .values(status="refunded"))
        db.session.commit()
        start, end = usage.billing_period(T)
        assert usage.totals(account.id, start, end)["errors"] == 1       # the refund shows at once
        # an hour ended less than USAGE_ROLL_MARGIN_SECONDS ago is not final yet
        assert usage_log.roll(now=T + 2 * H + timedelta(seconds=10) - timedelta(minutes=20)) == 0
        assert usage_log.roll(now=T + 5 * H) == 4
        assert usage.totals(account.id, start, end) == {"calls": 2, "errors": 1, "spend_micros": 30_000}


def test_a_completion_counts_in_the_hour_it_was_created_and_a_held_one_holds_its_hour(app, account):
    """Chat usage is counted by ``created_at`` (the partition key of the call log): a
    completion that settles in a later hour counts once, in its first hour, before and
    after the roll; an hour with a completion still held is not final."""
    with app.app_context():
        _never_rolled()
        _chat(1, account.id, "held", T)
        _chat(2, account.id, "settled", T + 2 * H)
        db.session.commit()
        assert usage_log.roll(now=T + 5 * H) == 0                        # hour of T holds a hold
        db.session.execute(ChatCompletion.__table__.update().where(ChatCompletion.id == "chatcmpl-1")
                           .values(status="settled", cost_micros=7_000, model="m1", settled_at=T + H))
        db.session.commit()
        start, end = usage.billing_period(T)
        expect = {"calls": 2, "errors": 0, "spend_micros": 12_000}
        assert usage.totals(account.id, start, end) == expect
        assert usage.daily_rows(account.id, 2, now=T + timedelta(days=1))[0]["calls"] == 2
        assert usage_log.roll(now=T + 5 * H) == 5                        # 10:00 … 14:00
        assert ("chat:m1", "live", usage_log.hour_of(T), 1, 0, 7_000) in _hourly(account.id)
        assert usage.totals(account.id, start, end) == expect           # rolled + tail: the same


def test_the_roll_job_is_scheduled():
    from app.tasks.schedule import SCHEDULE
    from app.tasks.usage import roll_usage

    assert ("usage-roll", 60, roll_usage) in SCHEDULE


# --- the tail roll: settled minutes of the hours not final yet ---------------------------

M = timedelta(minutes=1)
HOUR0 = usage_log.hour_of(T)  # 10:00


def _log_sums(account_id):
    """What every reader must show: the sums straight from the call logs."""
    calls = db.session.execute(select(ModuleCall).where(ModuleCall.account_id == account_id)).scalars().all()
    chats = db.session.execute(select(ChatCompletion).where(ChatCompletion.account_id == account_id,
                                                            ChatCompletion.status != "held")).scalars().all()
    return {"calls": len(calls) + len(chats),
            "errors": sum(c.status == "refunded" for c in calls)
            + sum(c.status == "released" or c.error is not None for c in chats),
            "spend_micros": sum(c.price_micros for c in calls if c.status != "refunded")
            + sum(c.cost_micros for c in chats if c.status != "released")}


def _totals(account_id):
    start, end = usage.billing_period(T)
    return usage.totals(account_id, start, end)


def _state():
    return db.session.execute(select(UsageRollupState.rolled_through, UsageRollupState.tail_through)).one()


def test_the_tail_roll_adds_settled_minutes_so_readers_read_only_the_last_ones(app, account):
    with app.app_context():
        _never_rolled()
        _call(1, account.id, "succeeded", HOUR0 + 20 * M)
        _call(2, account.id, "refunded", HOUR0 + 25 * M)
        _chat(1, account.id, "settled", HOUR0 + 30 * M)
        _call(3, account.id, "succeeded", HOUR0 + 39 * M + timedelta(seconds=30))  # minute 10:39
        db.session.commit()
        expect = _log_sums(account.id)
        assert _totals(account.id) == expect

        # 10:40: no hour is final; the minutes before 10:39 (ended USAGE_TAIL_MARGIN_SECONDS ago) are added
        assert usage_log.roll(now=HOUR0 + 40 * M) == 0
        assert tuple(_state()) == (HOUR0, HOUR0 + 39 * M)
        assert usage_log.tail_through() == HOUR0 + 39 * M
        assert sorted(_hourly(account.id)) == [("chat:m1", "live", HOUR0, 1, 0, 5_000),
                                               ("echo", "live", HOUR0, 2, 1, 30_000)]
        assert _totals(account.id) == expect                     # rows + the one call after the tail mark
        rolled = _hourly(account.id)
        assert usage_log.roll(now=HOUR0 + 40 * M + timedelta(seconds=50)) == 0  # same minute: nothing to add
        assert _hourly(account.id) == rolled and _totals(account.id) == expect

        # a pending call holds the tail at its minute; its refund shows at once (it is in the tail)
        _call(4, account.id, "pending", HOUR0 + 45 * M)
        _call(5, account.id, "succeeded", HOUR0 + 50 * M)
        db.session.commit()
        usage_log.roll(now=HOUR0 + 70 * M)
        assert tuple(_state()) == (HOUR0, HOUR0 + 45 * M)
        db.session.execute(ModuleCall.__table__.update().where(ModuleCall.id == "call_4").values(status="refunded"))
        db.session.commit()
        expect = _log_sums(account.id)
        assert _totals(account.id) == expect

        # 11:10: the tail runs on into 11:00 …
        _call(6, account.id, "succeeded", HOUR0 + H + 2 * M)
        db.session.commit()
        assert usage_log.roll(now=HOUR0 + H + 3 * M) == 0        # 10:00 not final until 11:05
        assert tuple(_state()) == (HOUR0, HOUR0 + H + 2 * M)
        assert ("echo", "live", HOUR0 + H, 0, 0, 0) not in _hourly(account.id)
        expect = _log_sums(account.id)
        assert _totals(account.id) == expect
        # … and 10:00's final roll rewrites the hour from the log: nothing counted twice
        _call(7, account.id, "succeeded", HOUR0 + H + 5 * M)
        db.session.commit()
        assert usage_log.roll(now=HOUR0 + H + 10 * M) == 1
        assert tuple(_state()) == (HOUR0 + H, HOUR0 + H + 9 * M)
        assert ("echo", "live", HOUR0, 5, 2, 90_000) in _hourly(account.id)
        assert ("echo", "live", HOUR0 + H, 2, 0, 60_000) in _hourly(account.id)
        expect = _log_sums(account.id)
        assert _totals(account.id) == expect
        assert usage.daily_rows(account.id, 2, now=T + timedelta(days=1))[0]["calls"] == expect["calls"]

        # the tail catches up with a final roll: the mark alone again (NULL), same rows
        assert usage_log.roll(now=HOUR0 + 2 * H + 6 * M + timedelta(seconds=1)) == 1
        assert usage_log.rolled_through() == HOUR0 + 2 * H
        assert _totals(account.id) == expect


def test_a_call_committed_after_the_tail_passed_its_minute_counts_at_its_hours_final_roll(app, account):
    """The documented cost of the short tail margin: a call whose transaction committed
    more than USAGE_TAIL_MARGIN_SECONDS after its ``created_at`` is not seen by the tail
    roll that passed its minute; the hour's final roll (longer margin) counts it."""
    with app.app_context():
        _never_rolled()
        _call(1, account.id, "succeeded", HOUR0 + 5 * M)
        db.session.commit()
        usage_log.roll(now=HOUR0 + 40 * M)
        _call(2, account.id, "succeeded", HOUR0 + 30 * M)  # committed at 10:40 with 10:30's timestamp
        db.session.commit()
        assert _totals(account.id)["calls"] == 1               # late, not lost …
        assert usage_log.roll(now=HOUR0 + H + 5 * M) == 1
        assert _totals(account.id) == _log_sums(account.id) == {"calls": 2, "errors": 0, "spend_micros": 60_000}


def test_the_tail_roll_can_be_turned_off(app, account, monkeypatch):
    monkeypatch.setitem(app.config, "USAGE_TAIL_MARGIN_SECONDS", 0)
    with app.app_context():
        _never_rolled()
        _call(1, account.id, "succeeded", HOUR0 + 5 * M)
        db.session.commit()
        usage_log.roll(now=HOUR0 + 40 * M)
        assert tuple(_state()) == (HOUR0, None) and _hourly(account.id) == []
        assert _totals(account.id)["calls"] == 1


def _plan_indexes(statement) -> tuple[set[str], set[str]]:
    """(index names, scan node types) of ``statement``'s plan on the test database."""
    sql = str(statement.compile(dialect=db.engine.dialect, compile_kwargs={"literal_binds": True}))
    nodes, stack = [], [db.session.execute(text(f"EXPLAIN (FORMAT JSON) {sql}")).scalar()[0]["Plan"]]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.get("Plans", []))
    return ({n["Index Name"] for n in nodes if "Index Name" in n},
            {n["Node Type"] for n in nodes if "Scan" in n["Node Type"]})


def test_the_roll_finds_the_oldest_open_call_by_an_index_of_the_open_calls_only(app, account):
    """The roll's min(created_at) of the pending calls is the first entry of
    the partial index ix_module_calls_pending_created — never a walk of the whole log in
    created_at order (2.4-5.3 s per roll at 10M calls when no call was pending) — and the
    held completions' by chat's (status, created_at) index. Read on the tables as a
    migration leaves them (TRUNCATEd: never vacuumed nor analysed, the planner's estimate
    for a young table), not with what earlier tests' deleted rows and autovacuum left in
    their statistics (tests/conftest.py empties tables by DELETE)."""
    with app.app_context():
        db.session.execute(text("TRUNCATE module_calls, chat_completions"))
        for n in range(20):
            _call(n, account.id, "succeeded", T + timedelta(minutes=n))
        _call(99, account.id, "pending", T + 2 * H)
        db.session.commit()
        calls, chat = usage_log.OLDEST_OPEN
        names, scans = _plan_indexes(calls)
        assert names and all(n.endswith("_pending_created") for n in names), (names, scans)
        assert not scans & {"Seq Scan", "SCAN"}, scans
        names, scans = _plan_indexes(chat)
        assert names and all("status_created" in n for n in names), names
        assert db.session.execute(calls).scalar() == T + 2 * H
        db.session.rollback()

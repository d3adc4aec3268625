"""Usage from the call logs (issue 18): nothing on a metered path writes usage; readers
sum the rolled hours and the call log after the mark; the roll job is idempotent and
rolls only final hours."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import select

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

    assert ("usage-roll", 300, roll_usage) in SCHEDULE

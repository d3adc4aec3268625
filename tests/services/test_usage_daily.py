"""Daily rollups (``usage_daily``): the roll job writes the days that became fully rolled,
and readers taking whole days from them give exactly the numbers of the hourly rows and
the call log, at every window boundary (randomized data, both databases)."""
from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from sqlalchemy import func, select

from app.extensions import db
from app.models import ModuleCall, UsageDaily, UsageHourly, UsageRollupState
from app.services.billing import alerts, usage, usage_log

T = datetime(2026, 3, 20, 13, 40, tzinfo=timezone.utc)  # the roll runs here: mid-day mark
H = timedelta(hours=1)
D = timedelta(days=1)


def _seed_calls(rng, accounts, n=400):
    """Calls over [T − 40 days, T + 2 days) (the tail after the mark included)."""
    calls = []
    for i in range(n):
        at = T - 40 * D + timedelta(seconds=rng.randrange(int(42 * D.total_seconds())))
        c = (rng.choice(accounts), rng.choice(("echo", "other")), rng.choice(("live", "live", "test")),
             at, rng.random() < 0.2, rng.randrange(1, 90_000))
        calls.append(c)
        acct, slug, mode, at, refunded, price = c
        db.session.add(ModuleCall(id=f"call_d{i}", account_id=acct, module_id=1, module_slug=slug,
                                  action="ok", mode=mode, status="refunded" if refunded else "succeeded",
                                  price_micros=price, charged=True, created_at=at,
                                  deadline_at=at + timedelta(seconds=90)))
    db.session.execute(UsageRollupState.__table__.delete())  # never rolled: start at the log
    db.session.commit()
    assert usage_log.roll(now=T, max_hours=2000) > 38 * 24
    assert usage_log.rolled_through() == usage_log.hour_of(T - timedelta(minutes=5))
    return calls


def _expect(calls, acct, mode, start, end):
    """The hourly-granularity sums straight from the calls: calls in [start, end)."""
    rows = [c for c in calls if c[0] == acct and c[2] == mode and start <= c[3] < end]
    return {"calls": len(rows), "errors": sum(1 for c in rows if c[4]),
            "spend_micros": sum(c[5] for c in rows if not c[4])}


def test_the_roll_writes_each_fully_rolled_day_as_the_sum_of_its_hours(app, make_account):
    rng = random.Random(18)
    with app.app_context():
        accts = [make_account().id for _ in range(2)]
        _seed_calls(rng, accts, n=150)
        days_mark = db.session.execute(select(UsageRollupState.days_rolled_through)).scalar_one()
        assert days_mark == usage_log.day_of(T)
        hourly = db.session.execute(
            select(UsageHourly.account_id, UsageHourly.product, UsageHourly.mode, UsageHourly.hour,
                   UsageHourly.calls, UsageHourly.errors, UsageHourly.spend_micros)
            .where(UsageHourly.account_id.in_(accts))).all()
        sums: dict = {}
        for acct, product, mode, hour, n, e, s in hourly:
            if hour < days_mark:
                key = (acct, product, mode, usage_log.day_of(hour))
                sums[key] = tuple(a + b for a, b in zip(sums.get(key, (0, 0, 0)), (n, e, s)))
        daily = {(r.account_id, r.product, r.mode, r.day): (r.calls, r.errors, r.spend_micros)
                 for r in db.session.execute(select(UsageDaily).where(UsageDaily.account_id.in_(accts)))
                 .scalars()}
        assert daily == sums and len(daily) > 30
        # idempotent: rolling the same days again rewrites the same rows
        db.session.execute(UsageRollupState.__table__.update().values(
            rolled_through=usage_log.hour_of(T - 3 * D), days_rolled_through=usage_log.day_of(T - 3 * D)))
        db.session.commit()
        usage_log.roll(now=T, max_hours=2000)
        again = {(r.account_id, r.product, r.mode, r.day): (r.calls, r.errors, r.spend_micros)
                 for r in db.session.execute(select(UsageDaily).where(UsageDaily.account_id.in_(accts)))
                 .scalars()}
        assert again == daily
        assert db.session.execute(select(UsageRollupState.days_rolled_through)).scalar_one() == days_mark


def test_alert_windows_read_whole_days_daily_and_match_the_calls_exactly(app, make_account):
    rng = random.Random(1818)
    with app.app_context():
        accts = [make_account().id for _ in range(3)]
        calls = _seed_calls(rng, accts)
        assert db.session.execute(select(func.count()).select_from(UsageDaily)
                                  .where(UsageDaily.account_id.in_(accts))).scalar_one() > 0
        # every boundary case: windows starting on a 00:00, at any hour, before and after
        # the mark, ``now`` in the rolled past and in the tail
        nows = [T, T + 10 * H, usage_log.day_of(T) + timedelta(minutes=7), usage_log.day_of(T) - H]
        nows += [T - 6 * D + timedelta(minutes=rng.randrange(12 * 24 * 60)) for _ in range(16)]
        for now in nows:
            got = alerts.usage_by_mode(now, accts)
            end = usage_log.hour_of(now) + H
            period_start, _ = usage.billing_period(now)
            for acct in accts:
                for mode in ("live", "test"):
                    entry = got.get((acct, mode), alerts._EMPTY)
                    for w in alerts.WINDOWS:
                        assert entry[w] == _expect(calls, acct, mode, alerts.window_start(w, now), end), (now, w)
                    assert entry["period_spend_micros"] == \
                        _expect(calls, acct, mode, period_start, end)["spend_micros"], now


def test_usage_readers_over_arbitrary_ranges_match_the_calls_exactly(app, make_account):
    rng = random.Random(4242)
    with app.app_context():
        accts = [make_account().id for _ in range(2)]
        calls = _seed_calls(rng, accts)
        for _ in range(25):
            start = usage_log.hour_of(T - 40 * D + H * rng.randrange(41 * 24))
            end = start + H * rng.randrange(1, 20 * 24)
            for acct in accts:
                assert usage.totals(acct, start, end) == _expect(calls, acct, "live", start, end), (start, end)
        for now in (T, T - 9 * D + 5 * H, T + D):
            days = usage.daily_rows(accts[0], 35, now=now)
            for row in days:
                day = datetime(row["date"].year, row["date"].month, row["date"].day, tzinfo=timezone.utc)
                assert {k: row[k] for k in ("calls", "errors", "spend_micros")} == \
                    _expect(calls, accts[0], "live", day, day + D), (now, day)

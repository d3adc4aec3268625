"""``bench/alerts_eval.py`` seeds the rollups as the usage-roll job leaves them: the
``usage_rollup_state`` marks set (the hours before the current one final, the days before
today rolled into ``usage_daily``), so the alert pass it times reads whole days from
``usage_daily`` as on a rolled database. The migrations stopped writing that row with the
baseline (the old chain's 0016 did); without it the benchmark's reads took every hour of
30 days from ``usage_hourly`` and the pass grew with the seeded calls. The benchmark's
timings are not run here: a tiny data set in its own schema of the test database."""
from __future__ import annotations

import os
from datetime import timedelta

from sqlalchemy import func, select, text

URL = os.environ.get("DATABASE_URL", "")


def test_the_seed_sets_the_rollup_marks_and_the_daily_rollups():
    from app.extensions import db
    from app.models import UsageDaily, UsageHourly, UsageRollupState
    from app.services.billing import alerts
    from app.services.billing.usage_log import day_of
    from bench import alerts_eval

    app = alerts_eval.make_app(URL)
    alerts_eval.reset_schema(app)
    try:
        with app.app_context():
            rows = alerts_eval.seed(rules=20, calls=24_000)  # 4 accounts with rules, 8 with usage
            s = db.session
            assert s.execute(select(func.count()).select_from(UsageHourly)).scalar_one() == rows
            state = s.execute(select(UsageRollupState)).scalar_one()
            newest = s.execute(select(func.max(UsageHourly.hour))).scalar_one()
            assert state.rolled_through == newest  # the current hour: every hour before it final
            assert state.days_rolled_through == day_of(newest) and state.tail_through is None
            # every rolled day has its daily rows, with the sums of its hours
            per_day: dict = {}
            for a, p, m, h, *vals in s.execute(
                    select(UsageHourly.account_id, UsageHourly.product, UsageHourly.mode, UsageHourly.hour,
                           UsageHourly.calls, UsageHourly.errors, UsageHourly.spend_micros)
                    .where(UsageHourly.hour < state.days_rolled_through)):
                acc = per_day.setdefault((a, p, m, day_of(h)), [0, 0, 0])
                for i, v in enumerate(vals):
                    acc[i] += v
            daily = {(a, p, m, d): [c, e, sp] for a, p, m, d, c, e, sp in s.execute(
                select(UsageDaily.account_id, UsageDaily.product, UsageDaily.mode, UsageDaily.day,
                       UsageDaily.calls, UsageDaily.errors, UsageDaily.spend_micros))}
            assert daily and daily == per_day
            # the alert pass's read (whole days from usage_daily) sees every seeded call of its windows
            now = newest + timedelta(minutes=30)
            usage = alerts.usage_by_mode(now)
            start = alerts.window_start("month", now)
            expected = dict(s.execute(select(UsageHourly.account_id, func.sum(UsageHourly.calls))
                                      .where(UsageHourly.hour >= start,
                                             UsageHourly.account_id.in_(select(alerts.Alert.account_id)))
                                      .group_by(UsageHourly.account_id)).all())
            assert {a: u["month"]["calls"] for (a, _), u in usage.items()} == expected
            db.session.remove()
    finally:
        with app.app_context():
            with db.engine.begin() as conn:
                conn.execute(text(f"DROP SCHEMA IF EXISTS {alerts_eval.SCHEMA} CASCADE"))
            db.engine.dispose()

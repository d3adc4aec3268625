"""Alert metrics over the usage rollups, windows and periods, the firing rule, and the
bounded number of queries of one evaluation pass."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from tests.support.concurrency import at_once
from tests.support.sqlevents import listening
from app.blueprints.alerts.schemas import AlertEventSchema
from app.extensions import db
from app.models import Account, AlertEvent, OutboxMessage
from app.services.billing import alerts
from tests import usage_seed

NOW = datetime(2026, 11, 18, 14, 30, tzinfo=timezone.utc)  # a Wednesday, ISO week 47


def _shown(events):
    """The events as ``GET /api/alerts/events`` shows them."""
    return AlertEventSchema(many=True).dump(events)


def make_alert(account_id, **kw):
    """An active e-mail alert to the account's own address (no confirmation needed)."""
    fields = {"name": "spend", "metric": "spend_cents", "op": ">", "threshold": 100,
              "window": "day", "channel": "email", "target": db.session.get(Account, account_id).email}
    fields.update(kw)
    alert, _ = alerts.create_alert(account_id, **fields)
    return alert


def rec(account_id, cents=0, *, at=NOW, calls=1, error=False, mode="live", product="mod"):
    usage_seed.record(account_id, product, spend_micros=int(cents * 10_000), calls=calls,
                 error=error, mode=mode, at=at)
    db.session.commit()


def test_window_starts_and_period_keys():
    assert alerts.window_start("hour", NOW) == datetime(2026, 11, 18, 13, tzinfo=timezone.utc)
    assert alerts.window_start("day", NOW) == datetime(2026, 11, 17, 14, tzinfo=timezone.utc)
    assert alerts.window_start("week", NOW) == datetime(2026, 11, 11, 14, tzinfo=timezone.utc)
    assert alerts.window_start("month", NOW) == datetime(2026, 10, 19, 14, tzinfo=timezone.utc)
    assert [alerts.period_key(w, NOW) for w in ("hour", "day", "week", "month")] == \
        ["2026-11-18T14", "2026-11-18", "2026-W47", "2026-11"]
    # ISO week-years: 2027-01-01 is in week 53 of 2026
    assert alerts.period_key("week", datetime(2027, 1, 1, tzinfo=timezone.utc)) == "2026-W53"


def test_metrics_from_rollups(app, account):
    with app.app_context():
        rec(account.id, 50, at=NOW)                                   # current hour
        rec(account.id, 25, at=NOW - timedelta(hours=1), error=True)  # previous hour bucket
        rec(account.id, 10, at=NOW - timedelta(hours=2))              # outside "hour"
        rec(account.id, 1000, at=NOW - timedelta(days=3))             # in week, not day
        rec(account.id, 7, at=NOW, mode="test")                       # sandbox: never counted
        rec(account.id, 9, at=NOW + timedelta(hours=2))               # after now: not counted
        rec(account.id, 0.25, at=NOW, product="chat:m")               # fractions of a cent kept
        m = alerts.current_metrics(account.id, NOW)
        assert m["hour"]["spend_cents"] == 75.25 and m["hour"]["calls"] == 3
        assert m["hour"]["error_rate"] == pytest.approx(100 / 3)
        assert m["day"]["spend_cents"] == 85.25 and m["day"]["calls"] == 4
        assert m["week"]["spend_cents"] == 1085.25 and m["week"]["error_rate"] == 20
        # plan_pct: November spend 1085.25 cents of the starter plan's 2,000 cents
        assert m["hour"]["plan_pct"] == m["month"]["plan_pct"] == pytest.approx(54.2625)


def test_plan_pct_counts_billing_period_only(app, make_account):
    acct = make_account(plan="pro")  # 20,000 cents
    with app.app_context():
        rec(acct.id, 5000, at=datetime(2026, 10, 31, 23, tzinfo=timezone.utc))  # October
        rec(acct.id, 2000, at=datetime(2026, 11, 1, 0, tzinfo=timezone.utc))
        m = alerts.current_metrics(acct.id, NOW)
        assert m["day"]["plan_pct"] == 10.0
        assert m["month"]["spend_cents"] == 7000  # the rolling 30 days still see October


def test_error_rate_without_calls_is_zero(app, account):
    with app.app_context():
        a = make_alert(account.id, metric="error_rate", op="<=", threshold=0, window="hour")
        assert alerts.current_metrics(account.id, NOW)["hour"]["error_rate"] == 0
        out = alerts.evaluate_all(NOW, dispatch=False)
        assert out["fired"] == 1
        ev = db.session.execute(select(AlertEvent)).scalar_one()
        assert (ev.alert_id, ev.value, ev.period_key) == (a.id, 0.0, "2026-11-18T14")


def test_fires_once_per_period_and_again_in_next(app, account):
    with app.app_context():
        a = make_alert(account.id, threshold=100, window="day")
        rec(account.id, 100, at=NOW)
        assert alerts.evaluate_all(NOW, dispatch=False)["fired"] == 0  # 100 > 100 is false
        rec(account.id, 1, at=NOW)
        assert alerts.evaluate_all(NOW, dispatch=False)["fired"] == 1
        for later in (NOW + timedelta(minutes=1), NOW + timedelta(hours=9)):
            assert alerts.evaluate_all(later, dispatch=False)["fired"] == 0  # same UTC day
        nxt = datetime(2026, 11, 19, 0, 5, tzinfo=timezone.utc)  # still > 100 over 24 h
        assert alerts.evaluate_all(nxt, dispatch=False)["fired"] == 1
        events = _shown(alerts.list_events(account.id))
        assert [e["period"] for e in events] == ["2026-11-19", "2026-11-18"]
        assert all(e["alert_id"] == a.id and e["delivery_status"] == "pending" for e in events)
        # each firing has exactly one outbox message, linked by source
        assert db.session.execute(select(func.count()).select_from(OutboxMessage)).scalar_one() == 2
        # condition no longer holds two days later: no firing
        assert alerts.evaluate_all(NOW + timedelta(days=2), dispatch=False)["fired"] == 0


def test_messages_say_spend_in_dollars_to_the_fraction_of_a_cent(app, account):
    """People read money in dollars: a spend rule's e-mail and chat text give its value and
    threshold as dollars (sub-cent spend keeps its digits); the webhook's JSON keeps cents."""
    with app.app_context():
        make_alert(account.id, threshold=0.5, window="day")
        make_alert(account.id, name="chatty", metric="calls", threshold=1, channel="chat",
                   target="https://chat.example.com/hook")
        rec(account.id, 0.75, at=NOW, calls=2)  # $0.0075
        alerts.evaluate_all(NOW, dispatch=False)
        msgs = {m.channel: m.payload for m in db.session.execute(select(OutboxMessage)).scalars()}
        assert msgs["email"]["subject"].endswith(": spend $0.0075 > $0.005")
        assert "The spend is $0.0075 over the last day (> $0.005)." in msgs["email"]["text"]
        assert "calls is 2 over the last day (> 1)" in msgs["chat"]["text"]  # not money: a number


def test_less_than_and_hour_window(app, account):
    with app.app_context():
        make_alert(account.id, metric="calls", op="<", threshold=2, window="hour")
        rec(account.id, 1, at=NOW - timedelta(hours=1))
        assert alerts.evaluate_all(NOW, dispatch=False)["fired"] == 1
        rec(account.id, 1, at=NOW)
        rec(account.id, 1, at=NOW + timedelta(hours=1))
        # next hour: buckets 14:00 and 15:00 hold 2 calls (13:00 is out) → not < 2
        assert alerts.evaluate_all(NOW + timedelta(hours=1), dispatch=False)["fired"] == 0


def test_deleted_alert_not_evaluated_and_events_kept(app, account):
    with app.app_context():
        a = make_alert(account.id, threshold=0, op=">=")
        assert alerts.evaluate_all(NOW, dispatch=False)["fired"] == 1
        alerts.delete_alert(account.id, a.id)
        out = alerts.evaluate_all(NOW + timedelta(days=1), dispatch=False)
        assert out == {**out, "rules": 0, "fired": 0}
        assert [e["alert_id"] for e in _shown(alerts.list_events(account.id))] == [a.id]


def test_unique_period_blocks_concurrent_double_firing(app, account):
    """Two schedulers evaluating the same minute: the (alert_id, period_key) constraint
    lets exactly one firing (and one outbox message) through."""
    with app.app_context():
        make_alert(account.id, threshold=0, op=">=")

    def run():
        try:
            with app.app_context():
                fired = alerts.evaluate_all(NOW, dispatch=False)["fired"]
                db.session.remove()
                return fired
        except Exception as exc:  # noqa: BLE001 - asserted below: none
            return exc

    results = at_once(4, run)
    with app.app_context():
        assert db.session.execute(select(func.count()).select_from(AlertEvent)).scalar_one() == 1
        assert db.session.execute(select(func.count()).select_from(OutboxMessage)).scalar_one() == 1
    assert results.count(0) == 3 and results.count(1) == 1, results


def test_event_insert_skips_a_period_already_fired_and_keeps_every_value(app, account):
    """The events of a pass are one INSERT … SELECT FROM unnest(…) ON CONFLICT DO NOTHING:
    a rule that already fired in the period (another scheduler) is skipped and not among
    the ids returned; the others are stored exactly as given."""
    with app.app_context():
        a = make_alert(account.id, threshold=0, op=">=")
        b = make_alert(account.id, name='Spend "guard" \u201cq\u201d, 50%', metric="calls", op="<=",
                       threshold=12.345678, window="hour")
        assert alerts.evaluate_all(NOW, dispatch=False)["fired"] == 2  # b: 0 calls <= 12.345678
        later = NOW + timedelta(hours=1)
        rows = [{"id": "alev_again", "alert_id": a.id, "account_id": account.id, "name": a.name,
                 "metric": a.metric, "op": a.op, "threshold": a.threshold, "value": 1.0, "window": "day",
                 "channel": "email", "period_key": alerts.period_key("day", later), "fired_at": later},
                {"id": "alev_next_hour", "alert_id": b.id, "account_id": account.id, "name": b.name,
                 "metric": "calls", "op": "<=", "threshold": 12.345678, "value": 0.000001, "window": "hour",
                 "channel": "email", "period_key": alerts.period_key("hour", later), "fired_at": later}]
        assert alerts._insert_events(rows) == {"alev_next_hour"}
        assert alerts._insert_events([]) == set()
        db.session.commit()
        assert db.session.get(AlertEvent, "alev_again") is None
        ev = db.session.get(AlertEvent, "alev_next_hour")
        assert {c: getattr(ev, c) for c in alerts._EVENT_COLUMNS} == rows[1]
        assert db.session.execute(select(func.count()).select_from(AlertEvent)).scalar_one() == 3


def _count_queries(fn):
    counter = {"n": 0}

    def before(*args, **kwargs):
        counter["n"] += 1

    with listening(db.engine, ("before_cursor_execute", before)):
        result = fn()
    return counter["n"], result


def test_query_count_is_constant_in_number_of_rules(app, make_account):
    accts = [make_account() for _ in range(6)]
    with app.app_context():
        def add_rules(n_accounts, per_account):
            for acct in accts[:n_accounts]:
                rec(acct.id, 5, at=NOW)
                for i in range(per_account):
                    make_alert(acct.id, metric=alerts.METRICS[i % 4], window=("hour", "day", "week", "month")[i % 4],
                               threshold=1e9)  # never fires
        add_rules(1, 2)
        small, out_small = _count_queries(lambda: alerts.evaluate_all(NOW))
        add_rules(6, 8)
        large, out_large = _count_queries(lambda: alerts.evaluate_all(NOW))
        assert out_small["rules"] == 2 and out_large["rules"] == 2 + 48
        assert small == large == 2  # rules with their last firing + one grouped usage query

        # Firing 50 rules: still the 2 reads, one batched event insert, one batched
        # outbox insert.
        db.session.execute(db.update(alerts.Alert).values(threshold=0, op=">="))
        db.session.commit()
        n, out = _count_queries(lambda: alerts.evaluate_all(NOW, dispatch=False))
        assert out["fired"] == 50 and n == 2 + 1 + 1

"""Usage rollups: upserts accumulate per hour; period and by-product reads."""
from __future__ import annotations

from datetime import datetime, timezone

from app.extensions import db
from app.services.billing import usage
from tests import usage_seed


def test_record_accumulates_and_reads_back(app, account):
    t = datetime(2026, 3, 15, 10, 20, tzinfo=timezone.utc)
    with app.app_context():
        usage_seed.record(account.id, "echo", spend_micros=50_000, at=t)
        usage_seed.record(account.id, "echo", spend_micros=50_000, error=True, at=t.replace(minute=59))
        usage_seed.record(account.id, "chat:auto", spend_micros=1_234, at=t.replace(hour=11))
        usage_seed.record(account.id, "echo", spend_micros=0, mode="test", at=t)
        db.session.commit()
        start, end = usage.billing_period(t)
        assert (start, end) == (datetime(2026, 3, 1, tzinfo=timezone.utc),
                                datetime(2026, 4, 1, tzinfo=timezone.utc))
        assert usage.totals(account.id, start, end) == {"calls": 3, "errors": 1, "spend_micros": 101_234}
        rows = usage.by_product(account.id, start, end)
        assert rows[0] == {"product": "echo", "calls": 2, "errors": 1, "spend_micros": 100_000}
        assert usage.totals(account.id, start, end, mode="test")["calls"] == 1
        assert usage.totals(account.id, t.replace(hour=11), end)["calls"] == 1

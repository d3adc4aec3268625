"""Retention of analytics events; the newsletter CLI."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import insert, select

from app.tasks import job_paths as as_paths
from app.extensions import db
from app.models import Subscription, TrackEvent
from app.models.base import utcnow
from app.tasks import schedule
from app.tasks.public import prune


def test_prune_keeps_recent_events(app):
    """Analytics retention. (Stale sign-up links are single-use tokens now: their purge is
    tested in tests/services/test_tokens.py.)"""
    now = utcnow()
    with app.app_context():
        db.session.execute(insert(TrackEvent.__table__), [
            {"event": "old", "created_at": now - timedelta(days=91)},
            {"event": "new", "created_at": now - timedelta(days=89)}])
        db.session.commit()
        assert prune() == {"track_events": 1}
        assert db.session.execute(select(TrackEvent.event)).scalars().all() == ["new"]
        db.session.remove()
    assert ("public-prune", 3600, "app.tasks.public.prune") in as_paths(schedule.SCHEDULE)


def test_newsletter_cli(app, tmp_path):
    with app.app_context():
        db.session.add(Subscription(id="sub_c", email="c@example.com", mailbox="c@example.com",
                                    list="weekly", status="subscribed"))
        db.session.commit()
        db.session.remove()
    body = tmp_path / "issue.txt"
    body.write_text("Issue #1")
    runner = app.test_cli_runner()
    out = runner.invoke(args=["newsletter", "send", "--list", "weekly", "--subject", "Weekly #1",
                              "--text-file", str(body)])
    assert out.exit_code == 0 and '"queued": 1' in out.output
    out = runner.invoke(args=["newsletter", "status"])
    assert '"weekly:subscribed": 1' in out.output

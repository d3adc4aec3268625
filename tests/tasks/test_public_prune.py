"""Retention of analytics events and stale sign-up requests; the newsletter CLI."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import insert, select

from app.tasks import job_paths as as_paths
from app.extensions import db
from app.models import SignupRequest, Subscription, TrackEvent
from app.models.base import utcnow
from app.tasks import schedule
from app.tasks.public import prune


def test_prune_keeps_recent_and_redeemed(app):
    now = utcnow()
    with app.app_context():
        db.session.execute(insert(TrackEvent.__table__), [
            {"event": "old", "created_at": now - timedelta(days=91)},
            {"event": "new", "created_at": now - timedelta(days=89)}])
        for i, (expires, used) in enumerate(((now - timedelta(days=8), None),
                                             (now - timedelta(days=8), now - timedelta(days=9)),
                                             (now + timedelta(hours=1), None))):
            db.session.add(SignupRequest(id=f"signup_{i}", email="a@example.com", token_hash=f"{i:064d}",
                                         expires_at=expires, used_at=used))
        db.session.commit()
        assert prune() == {"track_events": 1, "signup_requests": 1}
        assert db.session.execute(select(TrackEvent.event)).scalars().all() == ["new"]
        assert sorted(db.session.execute(select(SignupRequest.id)).scalars()) == ["signup_1", "signup_2"]
        db.session.remove()
    assert ("public-prune", 3600, "app.tasks.public.prune") in as_paths(schedule.SCHEDULE)


def test_newsletter_cli(app, tmp_path):
    with app.app_context():
        db.session.add(Subscription(id="sub_c", email="c@example.com", list="weekly", status="subscribed"))
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

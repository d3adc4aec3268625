"""Alert delivery end to end: a real SMTP server, a webhook receiver verifying Standard
Webhooks signatures, a chat receiver, retries after receiver failures, the sweep after a
lost job, and (with REDIS_URL) a real RQ worker running evaluation and delivery."""
from __future__ import annotations

from app.tasks import job_paths as as_paths
import os
import subprocess
import sys
from datetime import timedelta

import orjson
import pytest
from standardwebhooks import Webhook

from app.extensions import db
from app.models import OutboxMessage
from app.models.base import utcnow
from app.services.billing import alerts
from app.services.platform import outbox
from tests import usage_seed
from tests.support.apps import ROOT, app_env, smtp_server
from tests.support.alerts import confirm, confirm_target
from tests.support.standin import recorder

RULE = {"name": "Spend guard", "metric": "spend_cents", "op": ">", "threshold": 100, "window": "day"}


def _create(client, account, channel, target):
    r = client.post("/api/alerts", json={**RULE, "channel": channel, "target": target},
                    headers=account.headers)
    assert r.status_code == 201, r.get_json()
    confirm_target(client.application, r.get_json()["id"])  # the target's owner allows it
    return r.get_json()


def _spend(app, account_id, cents, at=None):
    with app.app_context():
        usage_seed.record(account_id, "mod", spend_micros=cents * 10_000, at=at)
        db.session.commit()
        db.session.remove()


def _events(client, account):
    return client.get("/api/alerts/events", headers=account.headers).get_json()["events"]


def _evaluate(app, now=None):
    with app.app_context():
        out = alerts.evaluate_all(now)
        db.session.remove()
    return out


def _noon():
    """Today 12:00 UTC: evaluations a few seconds apart stay in the same day period."""
    return utcnow().replace(hour=12, minute=0, second=0, microsecond=0)


def _verify(secret, req):
    return Webhook(secret).verify(req.body, {k.lower(): v for k, v in req.headers.items()})


def test_email_delivered_once_over_smtp(app, client, account):
    alert = _create(client, account, "email", "ops@example.com")
    now = _noon()
    _spend(app, account.id, 150, at=now)
    with smtp_server() as (sink, url):
        app.config["SMTP_URL"] = url
        try:
            assert _evaluate(app, now)["fired"] == 1
            assert _evaluate(app, now + timedelta(hours=11))["fired"] == 0  # same day: no second firing
            with app.app_context():
                outbox.sweep()  # nothing left to deliver
        finally:
            app.config["SMTP_URL"] = None
    assert len(sink.messages) == 1
    msg = sink.messages[0]
    assert msg["To"] == "ops@example.com"
    assert msg["Subject"] == "Alert \u201cSpend guard\u201d: spend $1.50 > $1.00"  # dollars, as people read money
    text = msg.get_body(("plain",)).get_content()
    assert "spend is $1.50 over the last day (> $1.00)" in text and alert["id"] in text
    lines = text.splitlines()
    assert "Value:     $1.50" in lines and "Condition: spend > $1.00 (window: day)" in lines
    [ev] = _events(client, account)
    assert ev["delivery_status"] == "delivered" and ev["attempts"] == 1 and ev["delivered_at"]
    assert ev["id"] in text and ev["value"] == 150


def test_webhook_signed_verifiable_and_fires_again_next_period(app, client, account):
    rec = recorder([200])
    with rec as url:
        alert = _create(client, account, "webhook", url + "/alerts")
        now = _noon()
        _spend(app, account.id, 150, at=now)
        assert _evaluate(app, now)["fired"] == 1
        assert _evaluate(app, now + timedelta(seconds=59))["fired"] == 0
        next_day = (now + timedelta(days=1)).replace(hour=0, minute=10)
        _spend(app, account.id, 150, at=next_day)
        assert _evaluate(app, next_day)["fired"] == 1
    assert len(rec.requests) == 2
    first, second = (_verify(alert["secret"], r) for r in rec.requests)
    assert first["type"] == "alert.fired"
    data = first["data"]
    assert data["alert_id"] == alert["id"] and data["account_id"] == account.id
    assert (data["metric"], data["op"], data["threshold"], data["value"], data["window"]) == \
        ("spend_cents", ">", 100, 150, "day")
    assert data["period"] == now.strftime("%Y-%m-%d") and data["alert_name"] == "Spend guard"
    assert second["data"]["period"] == next_day.strftime("%Y-%m-%d")
    assert rec.requests[0].headers["webhook-id"] != rec.requests[1].headers["webhook-id"]
    with pytest.raises(Exception):
        _verify("whsec_" + "A" * 32, rec.requests[0])  # another secret does not verify
    events = _events(client, account)
    assert [e["id"] for e in events] == [second["data"]["event_id"],
                                                                      first["data"]["event_id"]]
    assert all(e["delivery_status"] == "delivered" and e["attempts"] == 1 for e in events)


def test_chat_payload_delivered_once(app, client, account):
    rec = recorder([200])
    with rec as url:
        _create(client, account, "chat", url)
        now = _noon()
        _spend(app, account.id, 101, at=now)
        assert _evaluate(app, now)["fired"] == 1
        assert _evaluate(app, now + timedelta(minutes=5))["fired"] == 0
    assert len(rec.requests) == 1
    body = orjson.loads(rec.requests[0].body)
    assert list(body) == ["text"]
    assert "Spend guard" in body["text"] and "spend is $1.01 over the last day (> $1.00)" in body["text"]


def test_retry_after_receiver_failures_then_exactly_one_success(app, client, account):
    rec = recorder([500, 502, 200])
    with rec as url:
        alert = _create(client, account, "webhook", url)
        _spend(app, account.id, 500)
        assert _evaluate(app)["fired"] == 1
        [ev] = _events(client, account)
        assert ev["delivery_status"] == "pending" and ev["attempts"] == 1
        assert "HTTP 500" in ev["last_error"]
        with app.app_context():
            # backoff: not due yet, the sweep sends nothing
            assert outbox.sweep() == 0 and len(rec.requests) == 1
            for _ in range(2):
                db.session.execute(db.update(OutboxMessage).values(next_attempt_at=utcnow()))
                db.session.commit()
                outbox.sweep()
            outbox.sweep()
            db.session.remove()
    assert len(rec.requests) == 3
    ids = {r.headers["webhook-id"] for r in rec.requests}
    assert len(ids) == 1  # the same message retried: receivers can de-duplicate
    assert all(_verify(alert["secret"], r)["data"]["value"] == 500 for r in rec.requests)
    [ev] = _events(client, account)
    assert ev["delivery_status"] == "delivered" and ev["attempts"] == 3 and ev["last_error"] is None


def test_lost_job_is_delivered_by_the_sweep(app, client, account):
    """Firing recorded but its job never ran (Redis down, worker crash): the sweep delivers."""
    rec = recorder([200])
    with rec as url:
        _create(client, account, "chat", url)
        _spend(app, account.id, 200)
        with app.app_context():
            assert alerts.evaluate_all(dispatch=False)["fired"] == 1
            assert rec.requests == []
            assert outbox.sweep() == 1
            db.session.remove()
    assert len(rec.requests) == 1
    assert _events(client, account)[0]["delivery_status"] == "delivered"


def test_cli_and_schedule_entry(app, account):
    from app.tasks.schedule import SCHEDULE

    assert ("alerts-evaluate", 60, "app.tasks.alerts.evaluate") in as_paths(SCHEDULE)
    with app.app_context():
        alert, _ = alerts.create_alert(account.id, **RULE, channel="email", target="a@example.com")
        confirm(alert.id)
    _spend(app, account.id, 150)
    out = app.test_cli_runner().invoke(args=["alerts", "evaluate", "--no-dispatch"])
    assert out.exit_code == 0 and orjson.loads(out.output)["fired"] == 1
    out = app.test_cli_runner().invoke(args=["alerts", "evaluate"])
    assert orjson.loads(out.output)["fired"] == 0
    out = app.test_cli_runner().invoke(args=["alerts", "evaluate", "--at", "yesterday"])
    assert out.exit_code != 0 and "ISO 8601" in out.output


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL")
def test_real_worker_evaluates_and_delivers_every_channel_once(app, client, make_account):
    """The scheduled job goes through Redis; a real `flask worker --burst` evaluates the
    rules and delivers e-mail (SMTP), a signed webhook and a chat message, once each."""
    from app.tasks import enqueue

    acct = make_account()
    hook, chat = recorder([200]), recorder([200])
    with smtp_server() as (sink, smtp_url), hook as hook_url, \
            chat as chat_url:
        secret = _create(client, acct, "webhook", hook_url)["secret"]
        _create(client, acct, "chat", chat_url)
        _create(client, acct, "email", "team@example.com")
        _spend(app, acct.id, 300)
        env = {**app_env(app.config), "SMTP_URL": smtp_url}
        for _ in range(2):  # two scheduler ticks in the same period: still one firing each
            with app.app_context():
                app.config["JOBS_INLINE"] = False
                try:
                    assert enqueue("app.tasks.alerts.evaluate") is not None
                finally:
                    app.config["JOBS_INLINE"] = True
            assert hook.requests == [] or len(hook.requests) == 1
            out = subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "worker", "--burst"],
                                 cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr[-2000:]
    assert len(hook.requests) == 1 and len(chat.requests) == 1 and len(sink.messages) == 1
    assert _verify(secret, hook.requests[0])["data"]["value"] == 300
    assert sink.messages[0]["To"] == "team@example.com"
    events = _events(client, acct)
    assert len(events) == 3
    assert {e["channel"] for e in events} == {"email", "webhook", "chat"}
    assert all(e["delivery_status"] == "delivered" and e["attempts"] == 1 for e in events)

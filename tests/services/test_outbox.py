"""Outbox: e-mail over real SMTP, signed webhooks verified with standardwebhooks,
retries with backoff, sweep after lost jobs, redelivery of failed messages."""
from __future__ import annotations

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
from app.services.platform import outbox
from tests.support.apps import ROOT, app_env, smtp_server
from tests.support.standin import Reply, StandIn, recorder

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_email_over_smtp(app):
    with smtp_server() as (sink, url), app.app_context():
        app.config["SMTP_URL"] = url
        try:
            msg = outbox.add_email("to@example.com", "Hello", "Body text", reply_to="r@example.com",
                                   headers={"List-Unsubscribe": "<https://x/u>"})
            db.session.commit()
            outbox.dispatch(msg.id)
        finally:
            app.config["SMTP_URL"] = None
        assert len(sink.messages) == 1
        got = sink.messages[0]
        assert got["Subject"] == "Hello" and got["Reply-To"] == "r@example.com"
        assert got["List-Unsubscribe"] == "<https://x/u>" and msg.id in got["Message-ID"]
        assert "Body text" in got.get_body(("plain",)).get_content()
        assert db.session.get(OutboxMessage, msg.id).status == "delivered"


def test_email_without_smtp_goes_to_eml_files(app):
    with app.app_context():
        msg = outbox.add_email("to@example.com", "Saved", "Kept on disk")
        db.session.commit()
        outbox.dispatch(msg.id)
        files = [f for f in os.listdir(app.config["MAIL_OUTBOX_DIR"]) if msg.id in f]
        assert len(files) == 1


def test_webhook_signed_and_verifiable(app):
    rec = recorder([200])
    with rec as url, app.app_context():
        msg = outbox.add_webhook(url + "/hook", "alert.fired", {"value": 3}, secret=SECRET)
        db.session.commit()
        outbox.dispatch(msg.id)
        assert len(rec.requests) == 1
        got = rec.requests[0]
        payload = Webhook(SECRET).verify(got.body, {k.lower(): v for k, v in got.headers.items()})
        assert payload["type"] == "alert.fired" and payload["data"] == {"value": 3}
        assert got.headers["webhook-id"] == msg.id


def test_chat_payload(app):
    rec = recorder([200])
    with rec as url, app.app_context():
        msg = outbox.add_chat(url, "Spend alert: 120 > 100")
        db.session.commit()
        outbox.dispatch(msg.id)
        assert orjson.loads(rec.requests[0].body) == {"text": "Spend alert: 120 > 100"}


def test_add_many_writes_every_message_and_enqueues_each_after_commit(app, monkeypatch):
    """One batched insert of ``message`` rows (no ORM object each): the same rows ``add``
    writes, delivery enqueued per message once the unit of work commits, none on rollback
    or with ``enqueue=False``."""
    from app.services.platform.uow import unit_of_work

    enqueued = []
    monkeypatch.setattr(outbox, "dispatch", lambda *ids: enqueued.extend(ids))
    msgs = [outbox.message("email", "ops@example.com", outbox.email_payload("S \u201cq\u201d", "Body"),
                           source="alert_event:a", account_id="acct_1"),
            outbox.message("webhook", "https://hooks.example/x", outbox.webhook_payload(
                "alert.fired", {"value": 1.5}, secret=SECRET), source="alert_event:b", max_attempts=3),
            outbox.message("chat", "https://chat.example/y", outbox.chat_payload("hi"))]
    with app.app_context():
        before = utcnow()
        with unit_of_work():
            ids = outbox.add_many(msgs)
            assert enqueued == []  # not before the commit
        assert enqueued == ids and len(set(ids)) == 3 and all(i.startswith("msg_") for i in ids)
        rows = {m.id: m for m in db.session.execute(db.select(OutboxMessage)).scalars()}
        for mid, m in zip(ids, msgs):
            row = rows[mid]
            assert (row.channel, row.destination, row.payload, row.source, row.account_id, row.max_attempts) == \
                (m["channel"], m["destination"], m["payload"], m["source"], m["account_id"], m["max_attempts"])
            assert (row.status, row.attempts, row.last_error, row.delivered_at) == ("pending", 0, None, None)
            assert before <= row.created_at == row.next_attempt_at <= utcnow()
        assert rows[ids[0]].payload == {"subject": "S \u201cq\u201d", "text": "Body", "html": None,
                                        "reply_to": None, "headers": {}}
        assert rows[ids[2]].max_attempts == 8 and rows[ids[2]].account_id is None
        assert outbox.due_ids() and set(ids) <= set(outbox.due_ids())

        enqueued.clear()
        with pytest.raises(RuntimeError), unit_of_work():
            outbox.add_many(msgs[:1])
            raise RuntimeError("rolled back")
        with unit_of_work():
            quiet = outbox.add_many(msgs[:1], enqueue=False)
        assert enqueued == [] and outbox.add_many([]) == []
        assert db.session.execute(db.select(db.func.count()).select_from(OutboxMessage)).scalar_one() == 4
        assert db.session.get(OutboxMessage, quiet[0]).status == "pending"  # left to the sweep


def test_retries_with_backoff_then_delivers_once(app):
    rec = recorder([500, 503, 200])
    with rec as url, app.app_context():
        msg = outbox.add_webhook(url, "x", {}, secret=SECRET)
        db.session.commit()
        outbox.dispatch(msg.id)
        row = db.session.get(OutboxMessage, msg.id)
        assert row.status == "pending" and row.attempts == 1 and "HTTP 500" in row.last_error
        assert row.next_attempt_at > utcnow() + timedelta(seconds=20)
        assert outbox.deliver(msg.id) == "skipped"  # not due yet: no extra attempt
        for _ in range(2):
            db.session.execute(db.update(OutboxMessage).values(next_attempt_at=utcnow()))
            db.session.commit()
            outbox.sweep()
        row = db.session.get(OutboxMessage, msg.id, populate_existing=True)
        assert row.status == "delivered" and row.attempts == 3
        assert len(rec.requests) == 3
        outbox.sweep()
        assert len(rec.requests) == 3  # delivered messages are never sent again


def test_a_failed_attempt_logs_the_webhook_host_not_its_secret_path(app, caplog):
    """The worker's warning of a failed delivery printed the whole URL (in the error), and a
    webhook's or chat's URL is often its credential: it is logged as ``flask outbox status``
    shows it, scheme and host only, the path cut from the error too."""
    import socket

    with socket.socket() as s:  # a port nothing listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with app.app_context():
        msg = outbox.add_webhook(f"http://127.0.0.1:{port}/services/T0/SECRETPATH?token=SECRETQ", "x", {},
                                 secret=SECRET, enqueue=False)
        db.session.commit()
        msg_id = msg.id
        with caplog.at_level("WARNING", logger=outbox.log.name):
            assert outbox.deliver(msg_id) == "pending"
        assert "SECRETPATH" in db.session.get(OutboxMessage, msg_id).last_error  # the owner's own record keeps it
        db.session.execute(db.update(OutboxMessage).where(OutboxMessage.id == msg_id).values(status="cancelled"))
        db.session.commit()
    [line] = [r.getMessage() for r in caplog.records if msg_id in r.getMessage()]
    assert f"http://127.0.0.1:{port}/..." in line and "attempt 1 failed" in line
    assert "SECRET" not in line.replace(msg_id, "")


def test_a_failed_e_mail_attempt_logs_the_address_masked(app, caplog):
    """The warning of a failed e-mail delivery printed the recipient's whole address, in the
    destination and again in the server's refusal: both are masked (``logs.mask_emails``)."""
    with smtp_server() as (sink, url), app.app_context():
        sink.refuse = True
        app.config["SMTP_URL"] = url
        try:
            msg_id = outbox.add_email("jane.doe@example.com", "Hello", "Body text", enqueue=False).id
            db.session.commit()
            with caplog.at_level("WARNING", logger=outbox.log.name):
                assert outbox.deliver(msg_id) == "pending"
        finally:
            app.config["SMTP_URL"] = None
        assert "jane.doe@example.com" in db.session.get(OutboxMessage, msg_id).last_error  # the record keeps it
        db.session.execute(db.update(OutboxMessage).where(OutboxMessage.id == msg_id).values(status="cancelled"))
        db.session.commit()
    [line] = [r.getMessage() for r in caplog.records if msg_id in r.getMessage()]
    assert f"outbox {msg_id} to j***@example.com attempt 1 failed" in line and "550" in line
    assert "jane" not in line and "doe" not in line


def test_gives_up_after_max_attempts_and_redeliver(app):
    rec = recorder([500])
    with rec as url, app.app_context():
        msg = outbox.add_webhook(url, "x", {}, max_attempts=2)
        db.session.commit()
        for _ in range(3):
            db.session.execute(db.update(OutboxMessage).values(next_attempt_at=utcnow()))
            db.session.commit()
            outbox.deliver(msg.id)
        row = db.session.get(OutboxMessage, msg.id, populate_existing=True)
        assert row.status == "failed" and row.attempts == 2 and len(rec.requests) == 2
        rec.statuses = [200]
        assert outbox.redeliver(msg.id) == 1
        outbox.sweep()
        assert db.session.get(OutboxMessage, msg.id, populate_existing=True).status == "delivered"


def test_crashed_attempt_is_retried_after_lease(app):
    rec = recorder([200])
    with rec as url, app.app_context():
        msg = outbox.add_webhook(url, "x", {})
        db.session.commit()
        # A worker claimed the message and died before recording the outcome.
        claimed = outbox._claim(msg.id, utcnow())
        assert claimed is not None and outbox.due_ids() == []
        later = utcnow() + outbox.LEASE + timedelta(seconds=1)
        assert outbox.due_ids(now=later) == [msg.id]


def test_private_destination_refused_in_production_mode(app):
    rec = recorder([200])
    with rec as url, app.app_context():
        app.config["ALLOW_PRIVATE_URLS"] = False
        try:
            msg = outbox.add_chat(url.replace("http://", "https://"), "x", max_attempts=1)
            db.session.commit()
            outbox.dispatch(msg.id)
        finally:
            app.config["ALLOW_PRIVATE_URLS"] = True
        row = db.session.get(OutboxMessage, msg.id)
        assert row.status == "failed" and "private" in row.last_error and rec.requests == []


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL")
def test_real_worker_delivers_after_redis_enqueue(app):
    rec = recorder([200])
    with rec as url, app.app_context():
        app.config["JOBS_INLINE"] = False
        try:
            msg = outbox.add_webhook(url, "x", {"n": 1}, secret=SECRET)
            db.session.commit()
            outbox.dispatch(msg.id)
        finally:
            app.config["JOBS_INLINE"] = True
        assert rec.requests == []  # queued, not yet delivered
        out = subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "worker", "--burst"],
                             cwd=ROOT, env=app_env(app.config), capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        assert len(rec.requests) == 1
        assert db.session.get(OutboxMessage, msg.id, populate_existing=True).status == "delivered"


def test_redirects_are_never_followed(app):
    """A receiver answering 302 to an internal address gets nothing followed."""
    internal = recorder([200])

    with internal as internal_url:
        redirector = StandIn({("POST", "*"): lambda req: Reply(302, b"", {"Location": internal_url + "/admin"})})
        with redirector as url, app.app_context():
            msg = outbox.add_webhook(url, "x", {}, max_attempts=1)
            db.session.commit()
            outbox.dispatch(msg.id)
            row = db.session.get(OutboxMessage, msg.id)
            assert row.status == "failed" and "HTTP 302" in row.last_error
            assert internal.requests == []

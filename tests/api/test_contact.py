"""Contact form: stored and forwarded to sales over real SMTP, honeypot, limits."""
from __future__ import annotations

import pytest
from sqlalchemy import func, select

from app.extensions import db
from app.models import ContactMessage, OutboxMessage
from tests.publichelpers import smtp, text_of


def _count(app, model):
    with app.app_context():
        n = db.session.execute(select(func.count()).select_from(model)).scalar_one()
        db.session.remove()
    return n


def test_contact_forwarded_to_sales_with_reply_to(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "SALES_EMAIL", "sales@corp.example")
    with smtp(app) as sink:
        r = client.post("/api/contact", json={"email": "Ann@Example.com", "name": "Ann <b>",
                                              "message": "We need 1M calls/month."})
    assert r.status_code == 202
    j = r.get_json()
    assert j["status"] == "queued" and j["id"].startswith("contact_")
    assert len(sink.messages) == 1
    m = sink.messages[0]
    assert m["To"] == "sales@corp.example" and m["Reply-To"] == "ann@example.com"
    assert "We need 1M calls/month." in text_of(m) and j["id"] in text_of(m)
    with app.app_context():
        row = db.session.get(ContactMessage, j["id"])
        assert row.email == "ann@example.com" and row.name == "Ann <b>"
        assert db.session.get(OutboxMessage, row.outbox_id).status == "delivered"
        db.session.remove()


def test_header_injection_in_name_refused(app, client):
    with smtp(app) as sink:
        r = client.post("/api/contact", json={"email": "a@example.com", "name": "X\r\nBcc: v@evil.example",
                                              "message": "hi"})
        ok = client.post("/api/contact", json={"email": "a@example.com", "name": "Zoë \u202e O'Brien",
                                               "message": "multi\nline\tok"})
    assert r.status_code == 400 and "name" in r.get_json()["message"]
    assert ok.status_code == 202 and len(sink.messages) == 1
    m = sink.messages[0]
    assert m["Bcc"] is None and "Zoë" in m["Subject"] and "line\tok" in text_of(m) and "\u202e" not in m["Subject"]


def test_honeypot_same_answer_nothing_stored_or_sent(app, client):
    with smtp(app) as sink:
        r = client.post("/api/contact", json={"email": "bot@example.com", "message": "buy",
                                              "website": "http://spam.example"})
    assert r.status_code == 202 and r.get_json()["status"] == "queued"
    assert sorted(r.get_json()) == ["id", "status"]
    assert sink.messages == [] and _count(app, ContactMessage) == 0 and _count(app, OutboxMessage) == 0


@pytest.mark.parametrize("body, field", [
    ({"message": "hi"}, "email"),
    ({"email": "not-an-address", "message": "hi"}, "email"),
    ({"email": "a@example.com"}, "message"),
    ({"email": "a@example.com", "message": ""}, "message"),
    ({"email": "a@example.com", "message": " \n\t "}, "message"),  # blank: was sent to sales
    ({"email": "a@example.com", "message": "x" * 5001}, "message"),
    ({"email": "a@example.com", "message": "hi", "name": "n" * 101}, "name"),
    ({"email": "a" * 250 + "@example.com", "message": "hi"}, "email"),
    ({"email": "a@example.com", "message": "hi\u0000"}, "message"),
    ({"email": "a@example.com", "message": "hi", "name": "a\u0000"}, "name"),
    ({"email": "a\u0000@example.com", "message": "hi"}, "email"),
])
def test_contact_validation(app, client, body, field):
    r = client.post("/api/contact", json=body)
    assert r.status_code == 400 and field in r.get_json()["message"]
    assert _count(app, ContactMessage) == 0


def test_contact_rate_limits_per_ip_and_per_email(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "CONTACT_RATE_LIMIT", "3/minute")
    monkeypatch.setitem(app.config, "CONTACT_EMAIL_RATE_LIMIT", "2/hour")

    def send(email, ip):
        return client.post("/api/contact", json={"email": email, "message": f"hi from {ip}"},  # not a repeat
                           environ_base={"REMOTE_ADDR": ip})

    # per e-mail, across client IPs (case-insensitive)
    assert [send(e, ip).status_code for e, ip in
            (("v@example.com", "10.0.0.1"), ("V@Example.com", "10.0.0.2"), ("v@example.com", "10.0.0.3"))] \
        == [202, 202, 429]
    # per IP, across addresses
    codes = [send(f"u{i}@example.com", "10.0.0.9").status_code for i in range(4)]
    assert codes == [202, 202, 202, 429]
    r = send("w@example.com", "10.0.0.9")
    assert r.get_json()["error"] == "rate_limited" and int(r.headers["Retry-After"]) >= 1
    assert _count(app, ContactMessage) == 5


def test_a_refused_form_uses_up_none_of_the_addresss_limit(app, client, monkeypatch):
    """Bad input changes nothing, the address's limit included: a sender whose message was
    refused (400: blank, too long) still has every per-address send (before: each 400
    counted, so two typos left a sender 429 on the message they then got right). Signing up
    and subscribing count the same way."""
    monkeypatch.setitem(app.config, "CONTACT_EMAIL_RATE_LIMIT", "2/hour")
    monkeypatch.setitem(app.config, "SUBSCRIBE_EMAIL_RATE_LIMIT", "2/hour")
    monkeypatch.setitem(app.config, "CONTACT_RATE_LIMIT", "100/minute")  # the per-IP limits: not these
    monkeypatch.setitem(app.config, "SUBSCRIBE_RATE_LIMIT", "100/minute")
    for bad in ({"message": "   "}, {"message": "x" * 5001}, {"message": "hi", "name": "a\nBcc: x"}):
        assert client.post("/api/contact", json={"email": "typo@example.com", **bad}).status_code == 400
    codes = [client.post("/api/contact", json={"email": "typo@example.com", "message": f"take {i}"}).status_code
             for i in range(3)]
    assert codes == [202, 202, 429] and _count(app, ContactMessage) == 2
    for bad in ({"list": "daily"}, {"list": "weekly", "extra": 1}):
        assert client.post("/api/email/subscribe", json={"email": "typo@example.com", **bad}).status_code == 400
    codes = [client.post("/api/email/subscribe", json={"email": "typo@example.com", "list": "weekly"}).status_code
             for i in range(3)]
    assert codes == [202, 202, 429] and "per e-mail address" in client.post(
        "/api/email/subscribe", json={"email": "typo@example.com"}).get_json()["message"]


def test_public_429_carries_the_rate_limit_headers_docs_public_md_names(app, client, monkeypatch):
    from pathlib import Path

    monkeypatch.setitem(app.config, "CONTACT_RATE_LIMIT", "1/minute")
    ok = client.post("/api/contact", json={"email": "h@example.com", "message": "hi"},
                     environ_base={"REMOTE_ADDR": "10.0.0.77"})
    refused = client.post("/api/contact", json={"email": "i@example.com", "message": "hi"},
                          environ_base={"REMOTE_ADDR": "10.0.0.77"})
    assert ok.status_code == 202 and refused.status_code == 429
    names = ("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset")
    assert all(n in refused.headers and n in ok.headers for n in names) and "Retry-After" in refused.headers
    doc = " ".join((Path(__file__).parents[2] / "docs" / "public.md").read_text().split())
    assert "with `Retry-After` (seconds) and `RateLimit-Limit/Remaining/Reset`" in doc
    assert "X-RateLimit" not in doc


def test_a_repeated_submission_is_stored_and_sent_once(app, client, monkeypatch):
    """A double click (two requests at once) or a retried request with the same message from
    the same address answers the first one's id; sales get one e-mail. Another message is
    its own."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setitem(app.config, "CONTACT_EMAIL_RATE_LIMIT", "10/hour")

    body = {"email": "Twice@Example.com", "name": "T", "message": "Please call me."}
    with smtp(app) as sink:
        with ThreadPoolExecutor(2) as pool:
            ids = list(pool.map(lambda _: app.test_client().post("/api/contact", json=body).get_json()["id"],
                                range(2)))
        retried = client.post("/api/contact", json={**body, "email": "twice@example.com"})
        other = client.post("/api/contact", json={**body, "message": "Another question."})
    assert ids[0] == ids[1] == retried.get_json()["id"] and retried.status_code == 202
    assert other.status_code == 202 and other.get_json()["id"] != ids[0]
    assert _count(app, ContactMessage) == 2 and len(sink.messages) == 2


def test_a_repeated_submission_uses_none_of_the_addresss_limit(app, client, monkeypatch):
    """A double click (two requests at once) and a retry of one message count once against
    the address's limit: before, each counted, so a sender with 2 an hour who double-clicked
    was refused (429) on their next, different message."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setitem(app.config, "CONTACT_EMAIL_RATE_LIMIT", "2/hour")
    body = {"email": "click@example.com", "message": "First question."}
    with ThreadPoolExecutor(2) as pool:
        codes = list(pool.map(lambda _: app.test_client().post("/api/contact", json=body).status_code, range(2)))
    assert codes == [202, 202]
    assert client.post("/api/contact", json=body).status_code == 202  # a retry
    assert client.post("/api/contact", json={**body, "message": "Second question."}).status_code == 202
    r = client.post("/api/contact", json={**body, "message": "Third question."})
    assert r.status_code == 429 and "per e-mail address" in r.get_json()["message"]
    assert _count(app, ContactMessage) == 2

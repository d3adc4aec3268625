"""E-mail header injection (finding 1): every user value that can reach a mail header is
refused at the schema (400) when it carries encoded-word syntax or control characters,
and the mailer neutralises any that slips through (defence in depth)."""
from __future__ import annotations

from email import policy
from email.parser import BytesParser

import pytest

from app.services.platform import mailer

VECTORS = [
    "=?utf-8?q?=0D=0ABcc:_v1@evil.example=0D=0AX-Inj:_1?=",
    "=?utf-8?b?DQpCY2M6IHYxQGV2aWwuZXhhbXBsZQ==?=",
    "Bob\r\nBcc: v1@evil.example",
    "Bob\nX-Inj: 1",
    "Bob\rX-Inj: 1",
    "Bob\x00",
    "Bob\x85X-Inj: 1",
    "a=?x?=b",
]

# (path, body builder, field named in the error, needs an account key)
PATHS = [
    ("/api/contact", lambda v: {"email": "a@example.com", "message": "hi", "name": v}, "name", False),
    ("/api/contact", lambda v: {"email": v + "@example.com", "message": "hi"}, "email", False),
    ("/api/email/subscribe", lambda v: {"email": v + "@example.com"}, "email", False),
    ("/api/signup", lambda v: {"email": v + "@example.com"}, "email", False),
    ("/api/alerts", lambda v: {"name": v, "metric": "calls", "op": ">", "threshold": 1, "window": "day",
                               "channel": "email", "target": "ops@example.com"}, "name", True),
    ("/api/alerts", lambda v: {"name": "n", "metric": "calls", "op": ">", "threshold": 1, "window": "day",
                               "channel": "email", "target": v + "@example.com"}, "target", True),
]


@pytest.mark.parametrize("vector", VECTORS)
@pytest.mark.parametrize("path,body,field,auth", PATHS)
def test_header_bound_fields_refuse_injection(client, make_account, path, body, field, auth, vector):
    headers = make_account().headers if auth else {}
    r = client.post(path, json=body(vector), headers=headers)
    assert r.status_code == 400, (r.status_code, r.get_json())
    assert r.get_json()["error"] == "invalid_request" and field in r.get_json()["message"]


@pytest.mark.parametrize("vector", VECTORS)
@pytest.mark.parametrize("header", ["Subject", "To", "Reply-To", "X-Custom"])
def test_mailer_neutralises_what_reaches_it(app, vector, header):
    with app.app_context():
        kw = {"to": "ops@example.com", "subject": "Contact form", "text": "body"}
        if header == "Subject":
            kw["subject"] = f"Contact form: {vector}"
        elif header == "To":
            kw["to"] = f"{vector} <ops@example.com>"
        elif header == "Reply-To":
            kw["reply_to"] = f"{vector} <a@example.com>"
        else:
            kw["headers"] = {"X-Custom": vector}
        try:
            msg = mailer.build(**kw)
        except (ValueError, mailer.UnsafeHeader):
            return  # refused outright: nothing sent
    parsed = BytesParser(policy=policy.default).parsebytes(bytes(msg))
    names = {k.lower() for k in parsed.keys()}
    assert "bcc" not in names and "x-inj" not in names, bytes(msg)
    assert all("\r" not in v and "\n" not in v for v in map(str, parsed.values()))

"""Helpers shared by the public-endpoint tests (analytics, contact, newsletter, sign-up)."""
from __future__ import annotations

import re
from contextlib import contextmanager

from tests.support.apps import smtp_server

LINK_RE = re.compile(r"(https?://\S+/(?:email|signup)/confirm\?token=[A-Za-z0-9_\-]+)")


@contextmanager
def smtp(app):
    """A real SMTP server wired into ``app`` (restored afterwards); yields the sink."""
    with smtp_server() as (sink, url):
        old = app.config.get("SMTP_URL")
        app.config["SMTP_URL"] = url
        try:
            yield sink
        finally:
            app.config["SMTP_URL"] = old


def text_of(msg) -> str:
    return msg.get_body(("plain",)).get_content()


def link_in(msg) -> str:
    m = LINK_RE.search(text_of(msg))
    assert m, text_of(msg)
    return m.group(1)


def token_in(msg) -> str:
    return link_in(msg).split("token=", 1)[1]


def mailed_tokens(app, client, path: str, email: str, times: int = 1) -> list[str]:
    """POST ``{"email": email}`` to ``path`` (sign-up, subscribe) ``times`` times with a
    real SMTP server wired in; the tokens of the confirmation links mailed, in order."""
    with smtp(app) as sink:
        for _ in range(times):
            client.post(path, json={"email": email})
        return [token_in(msg) for msg in sink.messages]


def path_of(url: str) -> str:
    return "/" + url.split("/", 3)[3]


def strip_volatile(resp) -> tuple:
    """Status, body and headers of a response minus the per-request ones (request id,
    rate-limit counters), for byte-for-byte enumeration checks."""
    skip = {"x-request-id", "ratelimit-remaining", "ratelimit-reset", "retry-after",
            "ratelimit-limit"}
    return resp.status_code, resp.data, sorted((k, v) for k, v in resp.headers.items()
                                               if k.lower() not in skip)

"""Mail: build RFC 5322 messages and send them through SMTP (``SMTP_URL``) or, in the
embedded default, write them as ``.eml`` files under ``MAIL_OUTBOX_DIR``.

``SMTP_URL``: ``smtp://[user:pass@]host[:port]`` (``?starttls=1`` to upgrade) or
``smtps://…`` for implicit TLS. Services do not call ``send`` directly for mail that
must not be lost: they add an ``email`` message to the outbox (``app.services.platform.outbox``).
"""
from __future__ import annotations

import os
import smtplib
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from urllib.parse import parse_qs, unquote, urlsplit

from flask import current_app


def build(to: str, subject: str, text: str, *, html: str | None = None,
          reply_to: str | None = None, headers: dict | None = None,
          message_id: str | None = None) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = current_app.config["MAIL_FROM"]
    msg["To"] = to
    msg["Subject"] = subject
    msg["Date"] = formatdate(usegmt=True)
    msg["Message-ID"] = f"<{message_id}@gateway>" if message_id else make_msgid(domain="gateway")
    if reply_to:
        msg["Reply-To"] = reply_to
    for k, v in (headers or {}).items():
        msg[k] = v
    msg.set_content(text)
    if html:
        msg.add_alternative(html, subtype="html")
    return msg


def send(msg: EmailMessage) -> str:
    """Deliver ``msg``; returns where it went. Raises on failure (the outbox retries)."""
    url = current_app.config.get("SMTP_URL")
    if not url:
        folder = current_app.config["MAIL_OUTBOX_DIR"]
        os.makedirs(folder, exist_ok=True)
        name = (msg["Message-ID"] or make_msgid()).strip("<>").replace("@", "_").replace("/", "_")
        path = os.path.join(folder, f"{name}.eml")
        tmp = path + ".tmp"
        with open(tmp, "wb") as fh:
            fh.write(bytes(msg))
        os.replace(tmp, path)
        return path
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    host, port = parts.hostname or "127.0.0.1", parts.port
    if parts.scheme == "smtps":
        client = smtplib.SMTP_SSL(host, port or 465, timeout=15)
    else:
        client = smtplib.SMTP(host, port or 25, timeout=15)
    try:
        if parts.scheme != "smtps" and query.get("starttls", ["0"])[0] in ("1", "true"):
            client.starttls()
        if parts.username:
            client.login(unquote(parts.username), unquote(parts.password or ""))
        client.send_message(msg)
    finally:
        try:
            client.quit()
        except Exception:
            pass
    return f"smtp://{host}:{port or 25}"

"""Mail: build RFC 5322 messages and send them through SMTP (``SMTP_URL``) or, in the
embedded default, write them as ``.eml`` files under ``MAIL_OUTBOX_DIR``.

``SMTP_URL``: ``smtp://[user:pass@]host[:port]`` (``?starttls=1`` to upgrade) or
``smtps://…`` for implicit TLS. Services do not call ``send`` directly for mail that
must not be lost: they add an ``email`` message to the outbox (``app.services.platform.outbox``).

Header safety (docs/security.md, defence in depth behind the schemas' ``header_safe``
rule): messages use the ``email`` package's strict policy (URL headers unfolded); every header value is
neutralised first (control characters become spaces, RFC 2047 encoded-word openers ``=?``
become ``= ?`` so no decoder turns them into line breaks); and the serialised message is
parsed back to check it carries exactly the headers set here, else ``build`` raises.
"""
from __future__ import annotations

import os
import re
import smtplib
from email import policy as email_policy
from email.message import EmailMessage
from email.parser import BytesParser
from email.utils import formatdate, make_msgid
from urllib.parse import parse_qs, unquote, urlsplit

from flask import current_app


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_HEADER_NAME = re.compile(r"^[!-9;-~]{1,76}$")


class _Policy(email_policy.EmailPolicy):
    """The strict policy, except that a URL header (RFC 2369 ``List-Unsubscribe``) is never
    folded: a URL has no white space to fold at, so the ``email`` package would rewrite it
    as RFC 2047 encoded words, which a structured header may not hold (mail clients then
    find no unsubscribe URL). Such a value is one line (``header_value``); one that is not
    ASCII or too long for a line is folded as before."""

    _UNFOLDED = frozenset({"list-unsubscribe"})

    def _unfolded(self, name, value) -> str | None:
        line = f"{name}: {value}"
        if name.lower() in self._UNFOLDED and line.isascii() and len(line) <= 998:
            return line + self.linesep
        return None

    def fold(self, name, value):
        return self._unfolded(name, value) or super().fold(name, value)

    def fold_binary(self, name, value):
        line = self._unfolded(name, value)
        return line.encode("ascii") if line else super().fold_binary(name, value)


_POLICY = _Policy(raise_on_defect=True)  # email.policy.strict, with URL headers unfolded


class UnsafeHeader(ValueError):
    """A message whose serialised headers are not the ones it was built with."""


def header_value(value: str) -> str:
    """``value`` made inert for a header: control characters become spaces and the
    encoded-word opener ``=?`` becomes ``= ?``."""
    return _CONTROL.sub(" ", str(value)).replace("=?", "= ?").strip()


def build(to: str, subject: str, text: str, *, html: str | None = None,
          reply_to: str | None = None, headers: dict | None = None,
          message_id: str | None = None) -> EmailMessage:
    msg = EmailMessage(policy=_POLICY)
    fields = {"From": current_app.config["MAIL_FROM"], "To": to, "Subject": subject,
              "Date": formatdate(usegmt=True),
              "Message-ID": f"<{message_id}@gateway>" if message_id else make_msgid(domain="gateway")}
    if reply_to:
        fields["Reply-To"] = reply_to
    for k, v in (headers or {}).items():
        if not _HEADER_NAME.match(k) or k.title() in (name.title() for name in fields):
            raise UnsafeHeader(f"header name {k!r} refused")
        fields[k] = v
    for name, value in fields.items():
        msg[name] = header_value(value)
    msg.set_content(text)
    if html:
        msg.add_alternative(html, subtype="html")
    _check_headers(msg, list(fields))
    return msg


def _check_headers(msg: EmailMessage, names: list[str]) -> None:
    """Parse the serialised message back: its top-level headers must be exactly ``names``
    plus the MIME ones ``set_content`` adds (no injected ``Bcc:``, ever)."""
    parsed = BytesParser(policy=email_policy.default).parsebytes(bytes(msg), headersonly=True)
    expected = {n.lower() for n in names} | {"content-type", "content-transfer-encoding", "mime-version"}
    got = [k.lower() for k in parsed.keys()]
    if set(got) - expected or len(got) != len(set(got)):
        raise UnsafeHeader(f"message headers {sorted(set(got) - expected)} were not set by build()")


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

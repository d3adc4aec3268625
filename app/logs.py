"""Logging: plain text locally, one JSON object per line in production, with the request
id, account id and call id of the request; one access line per request; secrets redacted.

* Context: ``request_id`` (``g.request_id``), ``account_id`` (set by auth) and ``call_id``
  (``g.call_id``, set by the gateway/chat code for a metered call) are added to every
  record logged while handling a request; ``job_id`` to every record logged by an RQ job. Pass ``extra={...}`` for anything else; the
  keys in ``EXTRA_FIELDS`` are emitted by the JSON formatter.
* Access log (logger ``gateway.access``, ``ACCESS_LOG=0`` to disable): method, route
  (URL rule), path (no query string), status, duration_ms, client_ip, request_id,
  account_id, call_id. Never headers, query strings or bodies.
* Redaction: anything that looks like a credential (``svc_live_…``, ``svc_test_…``,
  ``svc_sess_…``, ``Bearer …``, ``sk_live_…``/``whsec_…``-style secrets) is replaced by
  ``[redacted]`` in the final line, whatever logged it.
* E-mail addresses: code that logs one passes it (or a text that may hold one, e.g. an SMTP
  server's refusal) through ``mask_emails`` first: ``jane.doe@example.com`` →
  ``j***@example.com`` (the domain kept to tell a provider's outage from one mailbox's).
"""
from __future__ import annotations

import logging
import re
import sys
from datetime import datetime, timezone

import orjson
from flask import Flask, g, has_app_context, request

# (``module`` is a built-in LogRecord attribute, the Python module: use ``product``.)
EXTRA_FIELDS = ("call_id", "job_id", "product", "status", "method", "route", "path",
                "duration_ms", "client_ip", "job", "queue")

_SECRET_PATTERNS = re.compile(
    r"(?:svc_(?:live|test|sess)_[A-Za-z0-9]+"          # our keys and sessions
    r"|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]+"          # Stripe-style keys
    r"|whsec_[A-Za-z0-9+/=]+"                            # webhook signing secrets
    r"|(?<=[Bb]earer )[A-Za-z0-9._~+/=-]+)"              # any bearer token
)


# Every pattern above contains one of these: a line without any cannot match, and the
# substring tests cost ~1 µs where the regex scan of an access line costs ~14 µs.
_SECRET_MARKERS = ("svc_", "_live_", "_test_", "whsec_", "earer ")


def redact(text: str) -> str:
    """Replace anything that looks like a credential with ``[redacted]``."""
    if not any(marker in text for marker in _SECRET_MARKERS):
        return text
    return _SECRET_PATTERNS.sub("[redacted]", text)


# (no quote in the local part: an address quoted in a message, ``'a@b.c'``, keeps its quotes)
_EMAIL = re.compile(r"([A-Za-z0-9!#$%&*+/=?^_`{|}~-])[A-Za-z0-9.!#$%&*+/=?^_`{|}~-]*@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)")


def mask_emails(text: str | None) -> str | None:
    """``text`` with every e-mail address in it masked: its local part's first character,
    ``***``, then ``@`` and the domain."""
    if not text or "@" not in text:
        return text
    return _EMAIL.sub(r"\1***@\2", text)


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        # A request's records (Flask's request context, or the metered call's thin entry,
        # which runs in an app context): their ids are in ``g``.
        if has_app_context() and "request_id" in g:
            for name, value in context_ids().items():  # a call id the record names stays
                if name != "call_id" or not hasattr(record, "call_id"):
                    setattr(record, name, value)
        elif hasattr(record, "request_id"):  # a request's line logged after its context ended
            record.account_id = getattr(record, "account_id", "-")
        else:
            record.request_id = "-"
            record.account_id = getattr(record, "account_id", "-")
            job = _current_job()
            if job is not None and not hasattr(record, "job_id"):
                record.job_id = job.id
        return True


def _current_job():
    """The RQ job this thread is running (in ``flask worker``), else None."""
    try:
        from rq import get_current_job

        return get_current_job()
    except Exception:  # noqa: BLE001 - logging must never fail
        return None


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ms), level, logger, msg, request_id, account_id,
    the ``EXTRA_FIELDS`` present on the record, exc; secrets redacted."""

    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),  # redacted with the whole line below
            "request_id": getattr(record, "request_id", "-"),
            "account_id": getattr(record, "account_id", "-"),
        }
        for key in EXTRA_FIELDS:
            if hasattr(record, key):
                data[key] = getattr(record, key)
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        # One pass over the final line covers msg, exc and every field: JSON escaping
        # leaves the credential patterns' characters as they are.
        return redact(orjson.dumps(data, default=str).decode())


class TextFormatter(logging.Formatter):
    """Human-readable lines for local use; secrets redacted."""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        if not hasattr(record, "request_id"):
            record.request_id = "-"
        return redact(super().format(record))


def make_handler(json: bool, stream=None) -> logging.Handler:
    """A handler with the context filter and the JSON or text formatter."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(_ContextFilter())
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    return handler


def init_logging(app: Flask) -> None:
    root = logging.getLogger()
    if not getattr(root, "_gateway_configured", False):
        root.addHandler(make_handler(bool(app.config.get("LOG_JSON"))))
        root.setLevel(app.config.get("LOG_LEVEL", "INFO"))
        logging.getLogger("alembic").setLevel(logging.WARNING)
        # No formatter here prints a record's source line or thread, so the records do not
        # collect them (the logging HOWTO's "Optimization": finding the caller walks the
        # stack on every record; ~28 µs of the access line's ~66). Process ids stay on
        # (gunicorn's own text format prints them).
        logging._srcfile = None
        logging.logThreads = False
        logging.logMultiprocessing = False
        root._gateway_configured = True
    if app.config.get("ACCESS_LOG", True):
        init_access_log(app)


access_log = logging.getLogger("gateway.access")


def init_access_log(app: Flask) -> None:
    """One INFO line per request on ``gateway.access`` (no headers, query or body).
    The duration comes from the request timer of ``app.metrics``."""
    from app.metrics import request_elapsed, route_label

    @app.after_request
    def _access_line(response):
        access(request.method, route_label(), request.path, response.status_code,
               request_elapsed(), request.remote_addr)
        return response


def access(method: str, route: str, path: str, status: int, elapsed: float | None,
           client_ip: str | None, ids: dict | None = None) -> None:
    """Log one access line (both entries: the Flask hook above and the hot routes' thin
    entry); ``elapsed`` in seconds. ``ids``: the request's ids (``context_ids``) for a line
    logged after its app context ended (the thin entry logs once the answer is written)."""
    duration_ms = round(elapsed * 1000, 2) if elapsed is not None else None
    extra = {"method": method, "route": route, "path": path, "status": status,
             "duration_ms": duration_ms, "client_ip": client_ip}
    if ids:
        extra.update(ids)
    access_log.info("%s %s %s %sms", method, route, status, duration_ms, extra=extra)


def context_ids() -> dict:
    """The current request's ids as the records of its context carry them (request_id,
    account_id, call_id when set), to log a line for it after the context ended."""
    ids = {"request_id": g.get("request_id", "-"), "account_id": g.get("account_id", "-")}
    if g.get("call_id"):
        ids["call_id"] = g.get("call_id")
    return ids

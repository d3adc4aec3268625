"""Logging: plain text locally, one JSON object per line in production (request id included)."""
from __future__ import annotations

import logging
import sys

import orjson
from flask import Flask, g, has_request_context


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if has_request_context():
            record.request_id = g.get("request_id", "-")
            record.account_id = g.get("account_id", "-")
        else:
            record.request_id = getattr(record, "request_id", "-")
            record.account_id = getattr(record, "account_id", "-")
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
            "account_id": getattr(record, "account_id", "-"),
        }
        for key in ("call_id", "module", "status"):
            if hasattr(record, key):
                data[key] = getattr(record, key)
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(data).decode()


def init_logging(app: Flask) -> None:
    root = logging.getLogger()
    if getattr(root, "_gateway_configured", False):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter())
    if app.config.get("LOG_JSON"):
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"))
    root.addHandler(handler)
    root.setLevel(app.config.get("LOG_LEVEL", "INFO"))
    logging.getLogger("alembic").setLevel(logging.WARNING)
    root._gateway_configured = True

"""Fast JSON for Flask responses and requests (orjson), with datetimes as RFC 3339 UTC."""
from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

import orjson
from flask.json.provider import JSONProvider


def _default(obj):
    if isinstance(obj, Decimal):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps_bytes(obj) -> bytes:
    return orjson.dumps(obj, default=_default, option=orjson.OPT_NON_STR_KEYS)


def isoformat(dt: datetime | None) -> str | None:
    """RFC 3339 with a Z suffix, e.g. ``2026-11-21T12:00:00Z``."""
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class OrjsonProvider(JSONProvider):
    def dumps(self, obj, **kwargs) -> str:
        return dumps_bytes(obj).decode()

    def loads(self, s, **kwargs):
        return orjson.loads(s)

    def response(self, *args, **kwargs):
        obj = self._prepare_response_obj(args, kwargs)
        return self._app.response_class(dumps_bytes(obj), mimetype="application/json")

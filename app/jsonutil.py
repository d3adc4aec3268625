"""Fast JSON for Flask responses and requests (orjson), with datetimes as RFC 3339 UTC."""
from __future__ import annotations

import json
import re
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


# orjson reads an integer outside [-2**63, 2**64 - 1] as a float, silently rounded: a body
# forwarded or fingerprinted after that would not be the caller's. ``loads`` refuses it.
_INT_MIN, _INT_MAX = -(2 ** 63), 2 ** 64 - 1
_LONG_DIGITS = re.compile(rb"[0-9]{19}")  # every integer out of that range has 19+ digits


# The 422 of every operation whose body takes free-form JSON values (the document cannot state it)
INTEGER_RANGE_DOC = ("`unprocessable`: the JSON body holds an integer outside the 64-bit range (-2^63 to "
                     "2^64-1), which would not reach its destination exactly; send such numbers as strings.")


class IntegerOutOfRange(orjson.JSONDecodeError):
    """A JSON integer outside the 64-bit range (a ``JSONDecodeError``, so a reader that only
    knows that one refuses it too; the request parser answers it 422 ``unprocessable``)."""


def _checked_int(text: str) -> int:
    value = int(text)
    if not _INT_MIN <= value <= _INT_MAX:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise IntegerOutOfRange(f"The JSON body holds the integer {shown}, outside the 64-bit range "
                                f"(-2^63 to 2^64-1) the service passes on exactly; send larger numbers "
                                f"as strings.", text, 0)
    return value


def loads(data: bytes | str):
    """Parse a request's JSON (orjson) and refuse (``IntegerOutOfRange``) an integer that
    would not survive it. Only a document with a run of 19 digits is read a second time,
    by the standard library, whose integers are exact (digits inside strings are not
    integers and pass)."""
    value = orjson.loads(data)
    raw = data if isinstance(data, (bytes, bytearray, memoryview)) else data.encode()
    if _LONG_DIGITS.search(raw):
        try:
            json.loads(raw, parse_int=_checked_int)
        except RecursionError:  # deeper than the standard parser goes: not checkable, refused
            raise orjson.JSONDecodeError("Invalid JSON body: nested too deeply.", "", 0) from None
    return value


def isoformat(dt: datetime | None) -> str | None:
    """RFC 3339 with a Z suffix, e.g. ``2026-11-21T12:00:00Z``."""
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


class OrjsonProvider(JSONProvider):
    def dumps(self, obj, **kwargs) -> str:
        """``indent`` (any: orjson indents by 2) is honoured, as Jinja's ``tojson(indent=2)``
        asks it (the console's receipt was one long line); other options are the standard
        library's and are not."""
        if kwargs.get("indent"):
            return orjson.dumps(obj, default=_default, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_INDENT_2).decode()
        return dumps_bytes(obj).decode()

    def loads(self, s, **kwargs):
        return loads(s)

    def response(self, *args, **kwargs):
        obj = self._prepare_response_obj(args, kwargs)
        return self._app.response_class(dumps_bytes(obj), mimetype="application/json")

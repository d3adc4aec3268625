"""URL converters: the input policy of path parameters.

* ``<name>`` / ``<string:name>`` (``TextConverter``, installed as werkzeug's default): one
  path segment of 1–``PATH_MAX`` characters without control characters — the rule of every
  text field of bodies, query strings and headers (``app.blueprints.fields``). Any other
  segment matches no route, so a NUL in a path parameter is a 404 before any code (or
  PostgreSQL, which cannot store NUL) sees it, never a 500.
* ``<id:name>`` matches public object ids (``prefix_base62``), so a literal sibling route
  such as ``/api/alerts/events`` can never be taken for an id.

Both are published in the OpenAPI document (``schema(converter)``): ``maxLength`` and the
forbidden characters as ``not: {pattern}``, as on body fields."""
from werkzeug.routing import BaseConverter, UnicodeConverter

from app.blueprints.fields import CONTROL_CHARS

PATH_MAX = 256  # a route that takes longer segments says so: <string(maxlength=N):name>


class TextConverter(UnicodeConverter):
    """A path segment without control characters (``/`` excluded as always)."""

    def __init__(self, map, minlength: int = 1, maxlength: int | None = PATH_MAX, length: int | None = None):
        super().__init__(map, minlength, maxlength, length)
        if length is not None:
            minlength = maxlength = length
        self.bounds = (minlength, maxlength)
        self.regex = f"[^/{CONTROL_CHARS}]{{{minlength},{'' if maxlength is None else maxlength}}}"

    @staticmethod
    def schema(conv: "TextConverter") -> dict:
        lo, hi = conv.bounds
        out = {"type": "string", "minLength": lo, "not": {"type": "string", "pattern": f"[{CONTROL_CHARS}]"}}
        return out if hi is None else {**out, "maxLength": hi}


class IdConverter(BaseConverter):
    regex = r"[a-z][a-z0-9]{0,15}_[A-Za-z0-9]{1,47}"

    @staticmethod
    def schema(_conv) -> dict:
        return {"type": "string", "pattern": f"^{IdConverter.regex}$", "maxLength": 64}

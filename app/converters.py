"""URL converters. ``<id:name>`` matches public object ids (``prefix_base62``), so a
literal sibling route such as ``/api/alerts/events`` can never be taken for an id."""
from werkzeug.routing import BaseConverter


class IdConverter(BaseConverter):
    regex = r"[a-z][a-z0-9]{0,15}_[A-Za-z0-9]{1,47}"

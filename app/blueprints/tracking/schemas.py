"""Schemas of product analytics (SPEC part 2: TrackEvent; funnel, recent, sessions)."""
import marshmallow as ma

from app.blueprints.fields import InputSchema, Pattern
import orjson

PROPS_MAX_DEPTH = 3


def _depth(value, level: int = 1) -> int:
    """Nesting depth of objects/arrays (``{}`` is 1); stops counting past the limit."""
    if level > PROPS_MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max([level] + [_depth(v, level + 1) for v in value.values()
                              if isinstance(v, (dict, list))])
    if isinstance(value, list):
        return max([level] + [_depth(v, level + 1) for v in value if isinstance(v, (dict, list))])
    return level


_SCALAR = {"type": ["string", "number", "integer", "boolean", "null"]}
_LEVEL3 = {"anyOf": [_SCALAR, {"type": "object", "additionalProperties": _SCALAR},
                     {"type": "array", "items": _SCALAR}]}
_LEVEL2 = {"anyOf": [_SCALAR, {"type": "object", "additionalProperties": _LEVEL3},
                     {"type": "array", "items": _LEVEL3}]}


class PropsField(ma.fields.Dict):
    """``props``: a JSON object nested at most 3 levels (the document states it: 400). NUL
    characters (which PostgreSQL cannot store) are replaced by U+FFFD. Its serialised size
    (at most ``PROPS_MAX_BYTES``) is a rule the document cannot state: ``tracking.record``
    answers it 422."""

    def _deserialize(self, value, attr, data, **kwargs):
        props = super()._deserialize(value, attr, data, **kwargs)
        raw = orjson.dumps(props)
        if _depth(props) > PROPS_MAX_DEPTH:
            raise ma.ValidationError(f"may nest objects/arrays at most {PROPS_MAX_DEPTH} levels deep.")
        if b"\\u0000" in raw:  # cheap pre-check; rare
            props = _without_nul(props)
        return props


def _without_nul(value):
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    return value


class TrackEventSchema(InputSchema):
    # one rule per validator, so a broken rule is said once: the length, then the alphabet
    event = ma.fields.String(required=True, validate=[ma.validate.Length(min=1, max=64), Pattern(
        r"^[A-Za-z0-9_.:\-]*$", error="may contain only A-Z a-z 0-9 _ . : -")],
        metadata={"description": "Event name: 1–64 characters of `A-Za-z0-9_.:-`.",
                  "example": "signup_started"})
    # no control characters: the input policy's rule (InputSchema), published as its `not`
    session_id = ma.fields.String(validate=ma.validate.Length(min=1, max=128), allow_none=True,
                                  metadata={"description": "Client session id (1–128 characters). "
                                            "Events without one count in no funnel."})
    props = PropsField(keys=ma.fields.String(), allow_none=True, metadata={
        "description": "Free-form JSON object: objects/arrays nested at most 3 levels (`props` "
                       "itself is level 1) and at most 4,096 bytes serialised as compact JSON "
                       "(above: 422 `unprocessable`). NUL characters are stored as U+FFFD.",
        "additionalProperties": _LEVEL2})


class FunnelQuerySchema(InputSchema):
    scope = ma.fields.String(validate=ma.validate.OneOf(("account", "global")), metadata={
        "description": "`account`: events attributed to the caller's account; `global`: all "
                       "events (admins only). Default: `global` for admins, else `account`."})


class FunnelStepSchema(ma.Schema):
    step = ma.fields.Integer(required=True, metadata={"description": "1-based position"})
    event = ma.fields.String(required=True)
    sessions = ma.fields.Integer(required=True, metadata={
        "description": "Sessions that reached steps 1..N in this order within the window"})
    conversion_from_previous = ma.fields.Float(required=True, metadata={
        "description": "sessions / sessions of the previous step (step 1: 1.0, or 0 if none)"})
    conversion_from_first = ma.fields.Float(required=True)


class FunnelSchema(ma.Schema):
    scope = ma.fields.String(required=True, metadata={"description": "`account` or `global`"})
    window_start = ma.fields.DateTime(required=True, metadata={"description": "now − 7 days"})
    window_end = ma.fields.DateTime(required=True)
    steps = ma.fields.List(ma.fields.Nested(FunnelStepSchema), required=True)


class EventSchema(ma.Schema):
    id = ma.fields.Integer(required=True)
    event = ma.fields.String(required=True)
    session_id = ma.fields.String(allow_none=True, required=True)
    account_id = ma.fields.String(allow_none=True, required=True,
                                  metadata={"description": "Set when posted with a valid credential"})
    props = ma.fields.Dict(allow_none=True, required=True)
    created_at = ma.fields.DateTime(required=True)


class RecentSchema(ma.Schema):
    events = ma.fields.List(ma.fields.Nested(EventSchema), required=True,
                            metadata={"description": "The last 200 events, newest first"})


class SessionSchema(ma.Schema):
    session_id = ma.fields.String(required=True)
    first_seen = ma.fields.DateTime(required=True)
    last_seen = ma.fields.DateTime(required=True)
    events = ma.fields.Integer(required=True, metadata={"description": "Events of the session (last 7 days)"})


class SessionsSchema(ma.Schema):
    sessions = ma.fields.List(ma.fields.Nested(SessionSchema), required=True, metadata={
        "description": "Sessions with an event in the last hour, most recently active first (at most 500)"})

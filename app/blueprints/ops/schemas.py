"""Schemas of the operations endpoints (health, readiness)."""
import marshmallow as ma


class LivenessSchema(ma.Schema):
    status = ma.fields.String(required=True, metadata={"description": "Always `ok`."})


class CheckSchema(ma.Schema):
    status = ma.fields.String(required=True, validate=ma.validate.OneOf(["ok", "unavailable"]))
    latency_ms = ma.fields.Float(required=True, metadata={"description": "Time the probe took."})


class ReadinessSchema(ma.Schema):
    status = ma.fields.String(required=True, metadata={"description": "`ok` when every check passed."})
    checks = ma.fields.Dict(
        keys=ma.fields.String(), values=ma.fields.Nested(CheckSchema), required=True,
        metadata={"description": "`database` always; `redis` when REDIS_URL is configured."})


class NotReadySchema(ma.Schema):
    """The 503 body: the standard error plus the individual checks."""

    error = ma.fields.String(required=True, metadata={"description": "`service_unavailable`"})
    message = ma.fields.String(metadata={"description": "Names the unreachable dependencies."})
    request_id = ma.fields.String()
    checks = ma.fields.Dict(keys=ma.fields.String(), values=ma.fields.Nested(CheckSchema))

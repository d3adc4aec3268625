"""Schemas of the benchmark-only passthrough route (registered only with BENCH_PASSTHROUGH=1)."""
from marshmallow import Schema, fields


class PassthroughResultSchema(Schema):
    """Whatever JSON the configured upstream answered, returned unchanged."""

    class Meta:
        unknown = "include"

    ok = fields.Boolean(metadata={"description": "As answered by the upstream (free-form object)."})

"""Schemas of the admin review of agent-built modules."""
import marshmallow as ma

from app.blueprints.fields import InputSchema

from app.blueprints.agents.schemas import BuildSchema


class ReviewBuildSchema(BuildSchema):
    class Meta:
        exclude = ("webhook_secret",)


class PendingListSchema(ma.Schema):
    pending = ma.fields.List(ma.fields.Nested(ReviewBuildSchema), required=True)


class ApproveSchema(InputSchema):
    notes = ma.fields.String(load_default=None, allow_none=True, validate=ma.validate.Length(max=2000),
                             metadata={"multiline": True})


class RejectSchema(InputSchema):
    reason = ma.fields.String(required=True, validate=ma.validate.Length(min=1, max=2000),
                              metadata={"multiline": True})

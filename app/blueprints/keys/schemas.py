"""Schemas of API keys (SPEC part 2: Key, KeyCreated)."""
import marshmallow as ma

from app.blueprints.fields import InputSchema, derived

from app.scopes import ALL_SCOPES


class KeySchema(ma.Schema):
    id = ma.fields.String(required=True)
    name = ma.fields.String(required=True)
    prefix = ma.fields.String(required=True, metadata={"description": "Leading characters of the key, for display."})
    scopes = derived(ma.fields.List(ma.fields.String(), required=True), lambda k: list(k.scopes or []))
    last_used_at = ma.fields.DateTime(required=True, allow_none=True,
                                      metadata={"description": "Updated in batches (within ~15 s)."})


class KeyCreatedSchema(KeySchema):
    key = ma.fields.String(required=True, metadata={"description": "The full key. Shown in this response only."})


class KeyListSchema(ma.Schema):
    keys = ma.fields.List(ma.fields.Nested(KeySchema), required=True)


class KeyCreateSchema(InputSchema):
    name = ma.fields.String(required=True, validate=ma.validate.Length(min=1, max=100))
    scopes = ma.fields.List(
        ma.fields.String(validate=ma.validate.OneOf(ALL_SCOPES)),
        validate=ma.validate.Length(max=len(ALL_SCOPES)),
        metadata={"description": "Defaults to the creating credential's scopes; may not exceed them."},
    )


class KeyRevokedSchema(ma.Schema):
    revoked = ma.fields.Boolean(required=True)
    id = ma.fields.String(required=True)

"""Schemas of provider keys (bring your own key)."""
import marshmallow as ma

from app.blueprints.fields import InputSchema, JsonBoolean
from app.services.chat.byok import KEY_PATTERN


class ProviderKeySchema(ma.Schema):
    id = ma.fields.String(required=True)
    provider = ma.fields.String(required=True, metadata={"description": "The catalog provider the key is for."})
    prefix = ma.fields.String(required=True, metadata={
        "description": "The key's first characters, for display; the key itself is never shown again."})
    created_at = ma.fields.DateTime(required=True)
    checked_at = ma.fields.DateTime(required=True, allow_none=True, metadata={
        "description": "When the provider last accepted the key (its check call at creation)."})


class ByokSettingsSchema(ma.Schema):
    byok_only = ma.fields.Boolean(required=True, metadata={
        "description": "Route only to offers served with the account's own keys (a request none of them "
                       "serves is 400 `no_matching_model`)."})
    byok_fallback = ma.fields.Boolean(required=True, metadata={
        "description": "When the account's own keys fail, fail over to the platform's keys (charged the "
                       "model price). Default false: only own keys when one serves the request."})


class ProviderKeyListSchema(ByokSettingsSchema):
    provider_keys = ma.fields.List(ma.fields.Nested(ProviderKeySchema), required=True)


class ProviderKeyCreateSchema(InputSchema):
    provider = ma.fields.String(required=True, validate=ma.validate.Length(min=1, max=64), metadata={
        "description": "A provider id of the chat catalog (`openai`, `anthropic`, …)."})
    api_key = ma.fields.String(required=True, validate=ma.validate.Regexp(KEY_PATTERN), metadata={
        "description": "The provider API key. Checked with one call to the provider (its model list), "
                       "then stored encrypted; never shown again."})


class ByokSettingsUpdateSchema(InputSchema):
    class Meta:
        json_schema = {"anyOf": [{"required": ["byok_only"]}, {"required": ["byok_fallback"]}]}

    byok_only = JsonBoolean(metadata={"description": "Route only to the account's own keys."})
    byok_fallback = JsonBoolean(metadata={"description": "Own keys failing, fail over to the platform's keys."})


class ProviderKeyDeletedSchema(ma.Schema):
    deleted = ma.fields.Boolean(required=True)
    id = ma.fields.String(required=True)

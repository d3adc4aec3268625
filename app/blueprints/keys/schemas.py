"""Schemas of API keys (SPEC part 2: Key, KeyCreated)."""
from datetime import timezone

import marshmallow as ma

from app.blueprints.fields import NOT_BLANK, InputSchema, JsonInteger, Pattern, derived
from app.services.accounts.key_controls import MAX_LIST, MAX_RPM, MAX_TPM
from app.services.accounts.keys import DEFAULT_OVERLAP_SECONDS, MAX_OVERLAP_SECONDS
from app.services.money.spend import PERIODS
from app.services.money.ledger import micros_to_cents

from app.blueprints.orgs.schemas import org_id_field
from app.scopes import KNOWN_SCOPES


def _limit_shown(k) -> tuple:
    """(micros, period) of the limit a key's charges count under (``keys.with_spent``)."""
    return getattr(k, "limit_shown", None) or (k.spend_limit_micros, k.spend_limit_period)


def _rates_shown(k) -> tuple:
    """(rpm, tpm) its requests count under (``keys.with_spent``: a retiring key's successor's)."""
    return getattr(k, "rates_shown", None) or (k.rpm_limit, k.tpm_limit)


class KeySchema(ma.Schema):
    id = ma.fields.String(required=True)
    name = ma.fields.String(required=True)
    prefix = ma.fields.String(required=True, metadata={"description": "Leading characters of the key, for display."})
    scopes = derived(ma.fields.List(ma.fields.String(), required=True), lambda k: list(k.scopes or []))
    last_used_at = ma.fields.DateTime(required=True, allow_none=True,
                                      metadata={"description": "Updated in batches (within ~15 s)."})
    spend_limit_cents = derived(ma.fields.Integer(required=True, allow_none=True, metadata={
        "description": "Most the key may spend per `spend_limit_period` (module calls and chat, "
                       "live mode); null: no limit. A rotated key in its overlap shows its successor's: "
                       "its charges count there."}),
        lambda k: None if _limit_shown(k)[0] is None else micros_to_cents(_limit_shown(k)[0]))
    spend_limit_period = derived(ma.fields.String(required=True, allow_none=True, metadata={
        "description": "`day` (from 00:00 UTC), `week` (ISO week, from Monday 00:00 UTC), `month` "
                       "(from the 1st, 00:00 UTC) or `total` (never resets); null without a limit."}),
        lambda k: _limit_shown(k)[1])
    spent_cents = derived(ma.fields.Integer(required=True, allow_none=True, metadata={
        "description": "Spent in the current period (refunds give it back); null without a limit."}),
        lambda k: None if getattr(k, "spent_micros", None) is None else micros_to_cents(k.spent_micros))
    expires_at = ma.fields.DateTime(required=True, allow_none=True, metadata={
        "description": "When the key stops working (401 like a revoked key); null: never. A rotated "
                       "key gets now + `overlap_seconds`."})


    org_id = derived(ma.fields.String(required=True, allow_none=True, metadata={
        "description": "The organisation whose balance the key spends (an organisation key); null: a "
                       "personal key."}), lambda k: k.account_id if k.member_account_id else None)
    member_id = ma.fields.String(required=True, allow_none=True, attribute="member_account_id", metadata={
        "description": "The member who owns an organisation key (its calls are recorded as theirs); null "
                       "for a personal key."})
    allowed_models = ma.fields.List(ma.fields.String(), required=True, allow_none=True, metadata={
        "description": "Chat models this key may use (`model: auto` routes among them only; another named "
                       "model is 403 `model_not_allowed`); null: any."})
    allowed_modules = ma.fields.List(ma.fields.String(), required=True, allow_none=True, metadata={
        "description": "Modules this key may call (another is 403 `module_not_allowed`); null: any."})
    rpm_limit = derived(ma.fields.Integer(required=True, allow_none=True, metadata={
        "description": "Requests per minute (module calls and chat completions of this key, one-minute "
                       "windows; 429 with `Retry-After` beyond); null: only the plan's limit. A rotated key "
                       "in its overlap shows its successor's: its requests count there."}),
        lambda k: _rates_shown(k)[0])
    tpm_limit = derived(ma.fields.Integer(required=True, allow_none=True, metadata={
        "description": "Chat tokens (prompt + completion) per minute; null: no limit. A rotated key in "
                       "its overlap shows its successor's."}), lambda k: _rates_shown(k)[1])


class KeyCreatedSchema(KeySchema):
    key = ma.fields.String(required=True, metadata={"description": "The full key. Shown in this response only."})


class KeyListSchema(ma.Schema):
    keys = ma.fields.List(ma.fields.Nested(KeySchema), required=True)


def _names(what: str) -> ma.fields.List:
    item = ma.fields.String(validate=ma.validate.Length(min=1, max=96))
    return ma.fields.List(item, allow_none=True, validate=ma.validate.Length(max=MAX_LIST), metadata={
        "description": f"Allow-list of {what} (at most {MAX_LIST}; `[]` allows none); null removes it (any)."})


_ORG_KEY = ("the organisation's keys: owners and admins see and change every one, the other members their "
            "own (a key of another member is 404)")


class KeyControlsSchema(InputSchema):
    """The per-key controls, accepted by POST /api/keys and PATCH /api/keys/{id}."""

    allowed_models = _names("chat model ids (`GET /v1/models`)")
    allowed_modules = _names("module slugs (`GET /api/modules`)")
    rpm_limit = JsonInteger(allow_none=True, validate=ma.validate.Range(min=1, max=MAX_RPM), metadata={
        "description": "Requests per minute (module calls and chat completions); null removes it."})
    tpm_limit = JsonInteger(allow_none=True, validate=ma.validate.Range(min=1, max=MAX_TPM), metadata={
        "description": "Chat tokens per minute (prompt + completion); null removes it."})


class KeyCreateSchema(KeyControlsSchema):
    class Meta:
        json_schema = {"dependentRequired": {"spend_limit_period": ["spend_limit_cents"]}}

    name = ma.fields.String(required=True, validate=[ma.validate.Length(min=1, max=100),
                                                     Pattern(NOT_BLANK, error="must not be blank.")],
                            metadata={"description": "The key's name (trimmed; not blank)."})
    scopes = ma.fields.List(
        ma.fields.String(validate=ma.validate.OneOf(KNOWN_SCOPES)),
        validate=ma.validate.Length(max=len(KNOWN_SCOPES)),
        metadata={"description": "Defaults to the creating credential's scopes; may not exceed them. "
                                 "`admin` only for admin accounts."},
    )
    spend_limit_cents = JsonInteger(validate=ma.validate.Range(min=1, max=100_000_000), metadata={
        "description": "Optional spend limit (integer cents ≥ 1). When a charge would exceed it the call "
                       "is refused with 402 `key_spend_limit_reached` before anything is charged."})
    spend_limit_period = ma.fields.String(validate=ma.validate.OneOf(PERIODS), metadata={
        "description": "Period of the limit, boundaries in UTC: `day`, `week` (ISO, Monday), `month`, "
                       "`total`. Default `month`; only with `spend_limit_cents`."})
    expires_at = ma.fields.AwareDateTime(default_timezone=timezone.utc, metadata={
        "description": "Optional expiry (RFC 3339; no offset means UTC): in the future, at most one year "
                       "ahead. An expired key is 401 like a revoked one."})
    org_id = org_id_field("the key spends the organisation's balance and is owned by the caller as a member "
                          "(roles owner, admin, developer)")


class KeyUpdateSchema(KeyControlsSchema):
    class Meta:
        # something to change: a limit (null removes it), a period (not null) or a control;
        # a period cannot come with the limit's removal
        json_schema = {
            "anyOf": [{"required": ["spend_limit_cents"]},
                      {"required": ["spend_limit_period"],
                       "properties": {"spend_limit_period": {"type": "string"}}},
                      {"required": ["allowed_models"]}, {"required": ["allowed_modules"]},
                      {"required": ["rpm_limit"]}, {"required": ["tpm_limit"]}],
            "if": {"required": ["spend_limit_cents"], "properties": {"spend_limit_cents": {"type": "null"}}},
            "then": {"properties": {"spend_limit_period": {"type": "null"}}}}

    spend_limit_cents = JsonInteger(allow_none=True, validate=ma.validate.Range(min=1, max=100_000_000),
                                    metadata={"description": "New limit in cents; null removes the limit."})
    spend_limit_period = ma.fields.String(allow_none=True, validate=ma.validate.OneOf(PERIODS), metadata={
        "description": "New period (`day|week|month|total`); absent or null keeps the current one "
                       "(`month` for a key that had no limit). The new period starts from what the key "
                       "spent in the current one: a change frees no room."})
    org_id = org_id_field(_ORG_KEY)


class KeyRotateSchema(InputSchema):
    overlap_seconds = JsonInteger(load_default=None, validate=ma.validate.Range(min=0, max=MAX_OVERLAP_SECONDS),
                                  metadata={"description": f"How long the old key keeps working (default "
                                                           f"{DEFAULT_OVERLAP_SECONDS}, max {MAX_OVERLAP_SECONDS})."})
    org_id = org_id_field(_ORG_KEY)


class KeysQuerySchema(InputSchema):
    org_id = org_id_field(_ORG_KEY)


class KeyRevokedSchema(ma.Schema):
    revoked = ma.fields.Boolean(required=True)
    id = ma.fields.String(required=True)

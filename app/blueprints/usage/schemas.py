"""Schemas of usage (SPEC part 2: UsageCurrent, UsageByModule; issue 16: daily series, export)."""
from datetime import timezone

import marshmallow as ma

from app.blueprints.fields import InputSchema, QueryInteger
from app.blueprints.orgs.schemas import ID, org_id_field

from app.services.billing.export import FORMATS
from app.services.billing.usage import MAX_DAILY_DAYS


class UsageCurrentSchema(ma.Schema):
    period_start = ma.fields.DateTime(required=True, metadata={"description": "First instant of the calendar month (UTC)."})
    period_end = ma.fields.DateTime(required=True, metadata={"description": "First instant of the next month (exclusive)."})
    calls = ma.fields.Integer(required=True, metadata={"description": "Live calls this period, failed calls included."})
    spend_cents = ma.fields.Integer(required=True, metadata={"description": "Live spend this period; refunded calls excluded."})
    plan_cents = ma.fields.Integer(required=True, metadata={"description": "Monthly included spend of the account's plan."})


class ModuleUsageSchema(ma.Schema):
    slug = ma.fields.String(required=True)
    calls = ma.fields.Integer(required=True)
    spend_cents = ma.fields.Integer(required=True)


class ModelUsageSchema(ma.Schema):
    model = ma.fields.String(required=True, metadata={"description": "The chat model that answered."})
    calls = ma.fields.Integer(required=True, metadata={"description": "Chat completions, failed ones included."})
    spend_cents = ma.fields.Integer(required=True, metadata={"description": "Spend in cents (floor)."})
    spend_micros = ma.fields.Integer(required=True, metadata={
        "description": "Spend in micro-dollars (exact: a completion often costs less than a cent)."})


class UsageByModuleSchema(ma.Schema):
    by_module = ma.fields.List(ma.fields.Nested(ModuleUsageSchema), required=True,
                               metadata={"description": "Module calls per module slug, highest spend first."})
    by_model = ma.fields.List(ma.fields.Nested(ModelUsageSchema), required=True,
                              metadata={"description": "Chat completions per model, highest spend first."})


class UsageFilterSchema(InputSchema):
    """The usage filters (issue 40): each narrows the figures to the calls it names; together
    they all apply (a module and a model: none)."""
    key_id = ma.fields.String(validate=ma.validate.Length(min=1, max=32), metadata={
        "description": "Only the calls made with this API key (its `id`)."})
    module = ma.fields.String(validate=ma.validate.Length(min=1, max=64), metadata={
        "description": "Only the calls of this module (its slug); no chat completion."})
    model = ma.fields.String(validate=ma.validate.Length(min=1, max=96), metadata={
        "description": "Only the chat completions answered by this model; no module call."})


class UsageQuerySchema(UsageFilterSchema):
    org_id = org_id_field("the organisation's usage (every role sees the totals; the per-call export: owner, "
                          "admin, billing, or a member's own calls with `member_id`)")
    member_id = ma.fields.String(validate=ID, metadata={"description": (
        "Only the calls of this member's organisation keys (their account id, `member_id` of "
        "`GET /api/orgs/{id}/members`; a former member's too), in the organisation of `org_id` or of "
        "the organisation key. One's own id: any member; another member's: owner, admin or billing "
        "(403 `org_role_required`). Without an organisation only the account's own id; another id, or one that "
        "never was a member: 404. Read from the "
        "call log by key, not the hourly rollups (docs/teams.md, \"Usage\").")})


class UsageDailyQuerySchema(UsageQuerySchema):
    days = QueryInteger(load_default=30, validate=ma.validate.Range(min=1, max=MAX_DAILY_DAYS),
                       metadata={"description": f"How many UTC dates, today last (1–{MAX_DAILY_DAYS}, default 30)."})


class DayUsageSchema(ma.Schema):
    date = ma.fields.String(required=True, metadata={"format": "date", "description": "UTC date (YYYY-MM-DD)."})
    calls = ma.fields.Integer(required=True, metadata={"description": "Module calls and chat completions of the "
                                                                      "caller's mode (a `svc_test_` key: test mode), "
                                                                      "failed ones included."})
    spend_cents = ma.fields.Integer(required=True, metadata={"description": "Spend of the caller's mode (test mode: "
                                                                            "the calls' prices, though no money "
                                                                            "moves); refunds excluded."})
    errors = ma.fields.Integer(required=True, metadata={"description": "Failed (refunded/released) calls."})


class UsageDailySchema(ma.Schema):
    days = ma.fields.List(ma.fields.Nested(DayUsageSchema), required=True,
                          metadata={"description": "One entry per date, oldest first (dates without calls: zeros)."})


class UsageExportQuerySchema(UsageQuerySchema):
    from_ = ma.fields.AwareDateTime(data_key="from", required=True, default_timezone=timezone.utc,
                                    metadata={"description": "Window start (inclusive), RFC 3339; no offset = UTC."})
    to = ma.fields.AwareDateTime(required=True, default_timezone=timezone.utc,
                                 metadata={"description": "Window end (exclusive); at most 31 days after `from`."})
    format = ma.fields.String(load_default="csv", validate=ma.validate.OneOf(FORMATS), metadata={
        "description": "`csv` (text/csv, header row) or `json` (NDJSON: application/x-ndjson, one object per line)."})

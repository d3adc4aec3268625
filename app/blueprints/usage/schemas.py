"""Schemas of usage (SPEC part 2: UsageCurrent, UsageByModule)."""
import marshmallow as ma


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


class UsageByModuleSchema(ma.Schema):
    by_module = ma.fields.List(ma.fields.Nested(ModuleUsageSchema), required=True)

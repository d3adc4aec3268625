"""Schemas of alerts and alert events (SPEC part 2 Alert; response shapes documented here)."""
import marshmallow as ma

from app.blueprints.orgs.schemas import org_id_field
from app.blueprints.fields import (SPACE, URL_CORE, InputSchema, JsonNumber, Pattern, header_safe_name,
                                  idempotency_headers)
from app.services.accounts.accounts import EMAIL_CORE
from app.services.billing.alerts import CHANNELS, METRICS, OPS, WINDOWS

_DT = {"format": "date-time"}


# The shape of an alert's target by channel, white space around it trimmed (the service
# trims it, then checks the address — "=?" refused, at most 254 characters — or the URL's
# host, port and addresses: alerts._validate). Checked here and published as if/then.
_EMAIL_TARGET = rf"^[{SPACE}]*{EMAIL_CORE}[{SPACE}]*$"
_URL_TARGET = rf"^[{SPACE}]*{URL_CORE}[{SPACE}]*$"
_TARGET_SHAPES = {channel: _EMAIL_TARGET if channel == "email" else _URL_TARGET for channel in CHANNELS}
_TARGET_CHECKS = {channel: Pattern(shape, error=f"not a valid {'e-mail address' if channel == 'email' else 'URL'} "
                                                f"(channel {channel}).")
                  for channel, shape in _TARGET_SHAPES.items()}


AlertCreateHeadersSchema = idempotency_headers(
    "AlertCreateHeadersSchema", "Optional, 1–128 characters: a retry with the same key and "
    "body creates no second alert and answers the first response, webhook secret included (Stripe's "
    "semantics; another body is 409).")


class AlertCreateSchema(InputSchema):
    class Meta:
        json_schema = {"allOf": [
            {"if": {"required": ["channel"], "properties": {"channel": {"const": channel}}},
             "then": {"properties": {"target": {"pattern": shape, **(
                 {"not": {"pattern": "=\\?"}} if channel == "email" else {})}}}}
            for channel, shape in _TARGET_SHAPES.items()]}

    @ma.validates_schema
    def _target_shape(self, data, **kwargs):
        check = _TARGET_CHECKS.get(data.get("channel"))
        if check is not None and isinstance(data.get("target"), str):
            try:
                check(data["target"])
            except ma.ValidationError as err:
                raise ma.ValidationError(err.messages, field_name="target") from None

    name = ma.fields.String(required=True, validate=[ma.validate.Length(min=1, max=100), header_safe_name],
                             metadata={"description": "1–100 characters, one line, not blank (trimmed); no "
                                                      "`=?` (it is used in e-mail subjects)."})
    metric = ma.fields.String(required=True, validate=ma.validate.OneOf(METRICS), metadata={
        "description": "`spend_cents` (spend over the window, cents), `calls` (calls over the "
                       "window), `error_rate` (failed calls / calls × 100 over the window; 0 "
                       "without calls), `plan_pct` (spend in the current billing period, calendar "
                       "month UTC, as % of the plan's `plan_cents`). The usage of the creating key's mode: a "
                       "test key's rule watches test-mode usage."})
    op = ma.fields.String(required=True, validate=ma.validate.OneOf(tuple(OPS)))
    threshold = JsonNumber(required=True, allow_nan=False,
                           validate=ma.validate.Range(min=0, max=1e15), metadata={
                               "description": "A finite number ≥ 0 in the metric's unit."})
    window = ma.fields.String(required=True, validate=ma.validate.OneOf(tuple(WINDOWS)), metadata={
        "description": "Rolling window ending now, at hour granularity: every hourly bucket "
                       "overlapping the last hour / 24 h / 7 days / 30 days. Also the firing "
                       "period: the rule fires at most once per calendar hour / day / ISO week / "
                       "month (UTC) while its condition holds, and again in the next one."})
    channel = ma.fields.String(required=True, validate=ma.validate.OneOf(CHANNELS))
    target = ma.fields.String(required=True, validate=ma.validate.Length(min=1, max=2000), metadata={
        "description": "An e-mail address for `email` (at most 254 characters); an https URL for "
                       "`webhook` and `chat` without user info (hosts resolving to private, "
                       "loopback or link-local addresses are refused; http only outside production "
                       "where private hosts are allowed)."})
    org_id = org_id_field("the alert watches the organisation's usage (roles owner, admin, billing)")


class AlertQuerySchema(InputSchema):
    org_id = org_id_field("the organisation's alerts (any member reads; owner, admin, billing delete)")


class AlertSchema(ma.Schema):
    id = ma.fields.String(required=True)
    name = ma.fields.String(required=True)
    metric = ma.fields.String(required=True)
    op = ma.fields.String(required=True)
    threshold = ma.fields.Float(required=True)
    window = ma.fields.String(required=True)
    channel = ma.fields.String(required=True)
    target = ma.fields.String(required=True)
    status = ma.fields.String(required=True, metadata={
        "description": "`active`, or `pending_verification`: an e-mail target other than the "
                       "account's own address was sent a confirmation link (valid 7 days); the "
                       "alert sends nothing until its owner confirms."})
    created_at = ma.fields.DateTime(required=True)


class AlertCreatedSchema(AlertSchema):
    secret = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "Webhook alerts only (null otherwise): the Standard Webhooks signing "
                       "secret `whsec_…` used for the `webhook-signature` header of every "
                       "delivery. Shown in this response only; store it."})


class AlertListSchema(ma.Schema):
    alerts = ma.fields.List(ma.fields.Nested(AlertSchema), required=True)


class AlertDeletedSchema(ma.Schema):
    deleted = ma.fields.Boolean(required=True)
    id = ma.fields.String(required=True)


class AlertEventSchema(ma.Schema):
    id = ma.fields.String(required=True, metadata={"description": "Event id (`webhook-id` of webhook deliveries is the outbox message id)."})
    alert_id = ma.fields.String(required=True)
    name = ma.fields.String(required=True, metadata={"description": "Alert name at firing time."})
    metric = ma.fields.String(required=True)
    op = ma.fields.String(required=True)
    threshold = ma.fields.Float(required=True)
    value = ma.fields.Float(required=True, metadata={"description": "Metric value that met the condition."})
    window = ma.fields.String(required=True)
    period = ma.fields.String(required=True, attribute="period_key", metadata={
        "description": "The UTC calendar period of this firing: `YYYY-MM-DDTHH` (hour), "
                       "`YYYY-MM-DD` (day), `YYYY-Www` (ISO week), `YYYY-MM` (month)."})
    channel = ma.fields.String(required=True)
    fired_at = ma.fields.DateTime(required=True)
    delivery_status = ma.fields.String(required=True, metadata={
        "description": "`pending` (not delivered yet; retried with exponential backoff), "
                       "`delivered`, or `failed` (gave up after the maximum attempts)."})
    attempts = ma.fields.Integer(required=True)
    delivered_at = ma.fields.DateTime(required=True, allow_none=True)
    next_attempt_at = ma.fields.DateTime(required=True, allow_none=True,
                                         metadata={"description": "When pending: the next attempt."})
    last_error = ma.fields.String(required=True, allow_none=True,
                                  metadata={"description": "Error of the last failed attempt."})


class AlertEventListSchema(ma.Schema):
    events = ma.fields.List(ma.fields.Nested(AlertEventSchema), required=True, metadata={
        "description": "The 100 most recent firings of the account, newest first "
                       "(including those of deleted alerts)."})

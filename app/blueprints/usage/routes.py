"""Usage endpoints (SPEC endpoints 25–26, from the hourly rollups; issue 16: the daily
series from the rollups and the streamed per-call export)."""
from flask import Response, stream_with_context

from app.auth import principal
from app.blueprints.routing import endpoint
from app.blueprints.usage.schemas import (UsageByModuleSchema, UsageCurrentSchema, UsageDailyQuerySchema,
                                          UsageDailySchema, UsageExportQuerySchema, UsageQuerySchema)
from app.extensions import Blueprint
from app.services.billing import export, usage
from app.services.orgs import orgs


def _scope(query, per_call: bool = False) -> tuple[str, str | None]:
    """(account, member): the caller's account, or the organisation named by ``org_id`` (or
    the organisation key's), narrowed to one member by ``member_id`` (docs/teams.md, "Usage")."""
    return orgs.usage_scope(principal(), query.get("org_id"), query.get("member_id"), per_call=per_call,
                            key_id=query.get("key_id") or None)


_ORG_ERRORS = {404: "`org_id`: not an organisation of the caller; `member_id`: never a member of it (without "
                    "an organisation: not the caller's own account)."}


def _filters(query) -> dict:
    """The usage filters of the query (``key_id``, ``module``, ``model``)."""
    return {k: query[k] for k in usage.FILTERS if query.get(k)}


blp = Blueprint("usage", __name__, url_prefix="/api/usage",
                description="Usage of the current billing period (calendar month, UTC; live mode only).")


@endpoint(blp, "/current", "get", "call:read", query=UsageQuerySchema, ok=UsageCurrentSchema, errors=_ORG_ERRORS)
def usage_current(query):
    """Calls and spend of the current calendar month (UTC) against the plan's included spend.
    Live-mode usage only (sandbox calls are not spend). `key_id`, `module`, `model`: only those calls."""
    account_id, member = _scope(query)
    return usage.current_usage(account_id, member=member, filters=_filters(query))


@endpoint(blp, "/by-module", "get", "call:read", query=UsageQuerySchema, ok=UsageByModuleSchema, errors=_ORG_ERRORS)
def usage_by_module(query):
    """This month's live usage, highest spend first: module calls per module (`by_module`) and
    chat completions per model (`by_model`, with the exact spend in micro-dollars too).
    `key_id`, `module`, `model`: only those calls."""
    account_id, member = _scope(query)
    return usage.usage_by_module(account_id, member=member, filters=_filters(query))


@endpoint(blp, "/daily", "get", "call:read", query=UsageDailyQuerySchema, ok=UsageDailySchema, errors=_ORG_ERRORS)
def usage_daily(query):
    """Calls, spend and errors of the caller's mode per UTC date for the last `days` dates (today last),
    from the hourly rollups; module calls and chat completions both count. `key_id`, `module`,
    `model`: only those calls."""
    account_id, member = _scope(query)
    return usage.daily(account_id, query["days"], mode=principal().mode, member=member, filters=_filters(query))


@endpoint(blp, "/export", "get", "call:read", query=UsageExportQuerySchema, name="UsageExportView",
          errors={**_ORG_ERRORS,
                  422: "`unprocessable`: `from` is not before `to`, or the window spans more than 31 days "
                       "(rules relating the two parameters, which the schema cannot state)."})
@blp.doc(responses={"200": {"description": "The rows, streamed.", "content": {
    "text/csv": {"schema": {"type": "string"}, "example": "call_id,created_at,module,action,mode,status,"
                 "cost_cents,cost_micros,idempotency_key,receipt_hash,byok_key_id,provider_cost_micros,actor,"
                 "actor_account_id,ok\r\n"},
    "application/x-ndjson": {"schema": {"type": "string"}}}}})
def usage_export(query):
    """Every call of the account in [`from`, `to`) (at most 31 days), one row per call,
    oldest first, streamed (constant memory): module calls and chat completions
    (`module: chat`, `action`: the model), live and test. Columns: `call_id`, `created_at`,
    `module`, `action`, `mode`, `status`, `cost_cents` (floor), `cost_micros`,
    `idempotency_key`, `receipt_hash`, `byok_key_id` and `provider_cost_micros` (a chat
    completion served with the caller's own provider key: the key, and the list cost its
    provider bills; `cost_micros` is then the fee), `actor` (the key or agent session that made
    the call) and `actor_account_id` (the person behind it: an organisation key's member, else
    the account), as the receipt names them, and last `ok`: a succeeded module call's provider
    verdict, `false` when the provider refused it (its 4xx, charged by the documented rule; its
    `status` is `succeeded`), `true` otherwise; empty (null) for a call not answered or refunded
    and for chat completions, whose `status` says how they ended. `format=csv` (default): `text/csv` with a header
    row; `format=json`: NDJSON (`application/x-ndjson`, one JSON object per line). `key_id`,
    `module`, `model`: only those calls (`module: chat` is not a module: use `model`).
    In an organisation the export lists who called what: owners, admins and billing export
    every member's calls (or one member's with `member_id`); developers and viewers export
    their own (`member_id` = their own id; without it 403 `org_role_required`)."""
    account_id, member = _scope(query, per_call=True)
    start, end = export.window(query["from_"], query["to"])
    fmt = query["format"]
    body = stream_with_context(export.rows(account_id, start, end, fmt, _filters(query), member))
    name = f"usage-{start:%Y%m%d}-{end:%Y%m%d}.{'csv' if fmt == 'csv' else 'ndjson'}"
    return Response(body, mimetype="text/csv" if fmt == "csv" else "application/x-ndjson",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})

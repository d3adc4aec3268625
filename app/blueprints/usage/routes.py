"""Usage endpoints (SPEC endpoints 25–26), read from the hourly rollups."""
from app.auth import principal
from app.blueprints.routing import endpoint
from app.blueprints.usage.schemas import UsageByModuleSchema, UsageCurrentSchema
from app.extensions import Blueprint
from app.services.accounts import accounts
from app.services.billing import usage

blp = Blueprint("usage", __name__, url_prefix="/api/usage",
                description="Usage of the current billing period (calendar month, UTC; live mode only).")


@endpoint(blp, "/current", "get", "call:read", ok=UsageCurrentSchema)
def usage_current():
    """Calls and spend of the current calendar month (UTC) against the plan's included spend.
    Live-mode usage only (sandbox calls are not spend)."""
    p = principal()
    return usage.current_usage(p.account_id, accounts.plan_cents(accounts.get_account(p.account_id).plan))


@endpoint(blp, "/by-module", "get", "call:read", ok=UsageByModuleSchema)
def usage_by_module():
    """This month's live calls and spend per module, highest spend first."""
    return usage.usage_by_module(principal().account_id)

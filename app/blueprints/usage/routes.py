"""Usage endpoints (SPEC endpoints 25–26), read from the hourly rollups."""
from flask.views import MethodView

from app.auth import authenticated, principal
from app.blueprints.usage.schemas import UsageByModuleSchema, UsageCurrentSchema
from app.extensions import Blueprint
from app.services.accounts import accounts
from app.services.billing import usage

blp = Blueprint("usage", __name__, url_prefix="/api/usage",
                description="Usage of the current billing period (calendar month, UTC; live mode only).")


@blp.route("/current")
class UsageCurrentView(MethodView):
    @authenticated("call:read")
    @blp.response(200, UsageCurrentSchema)
    def get(self):
        """Calls and spend of the current calendar month (UTC) against the plan's included spend.
        Live-mode usage only (sandbox calls are not spend)."""
        p = principal()
        return usage.current_usage(p.account_id, accounts.plan_cents(accounts.get_account(p.account_id).plan))


@blp.route("/by-module")
class UsageByModuleView(MethodView):
    @authenticated("call:read")
    @blp.response(200, UsageByModuleSchema)
    def get(self):
        """This month's live calls and spend per module, highest spend first."""
        return usage.usage_by_module(principal().account_id)

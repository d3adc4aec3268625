"""Account endpoint (SPEC endpoint 2)."""
from flask.views import MethodView

from app.auth import authenticated, principal
from app.blueprints.accounts.schemas import AccountSchema
from app.extensions import Blueprint
from app.services.accounts import accounts

blp = Blueprint("accounts", __name__, url_prefix="/api", description="The caller's account.")


@blp.route("/account")
class AccountView(MethodView):
    @authenticated("account:read")
    @blp.response(200, AccountSchema)
    def get(self):
        """The authenticated account: id, e-mail, plan, balance in cents, agent id."""
        return accounts.get_account(principal().account_id)

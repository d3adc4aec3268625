"""Account endpoint (SPEC endpoint 2)."""
from app.auth import principal
from app.blueprints.accounts.schemas import AccountSchema
from app.blueprints.routing import endpoint
from app.extensions import Blueprint
from app.services.accounts import accounts

blp = Blueprint("accounts", __name__, url_prefix="/api", description="The caller's account.")


@endpoint(blp, "/account", "get", "account:read", ok=AccountSchema)
def account():
    """The authenticated account: id, e-mail, plan, balance in cents (of the key's mode: a
    `svc_test_` key sees the test balance), agent id."""
    return accounts.account_view(principal().account_id, principal().mode)

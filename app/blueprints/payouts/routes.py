"""Payouts and owner earnings: a module owner's earnings (any account or organisation),
its payout destination, and its payouts (docs/payments.md#payouts)."""
from app.auth import principal
from app.blueprints.payouts.schemas import (DestinationRemovedSchema, DestinationSchema, StripeDestinationInSchema,
                                            OwnerEarningsSchema, PayoutHeadersSchema, PayoutListSchema,
                                            PayoutSchema, PayoutsReadQuerySchema, PayoutsWriteQuerySchema,
                                            UsdcDestinationInSchema)
from app.blueprints.routing import NOT_MEMBER, acting_account, endpoint
from app.errors import Forbidden
from app.extensions import Blueprint
from app.services.agents import earnings
from app.services.billing import payouts

blp = Blueprint("payouts", __name__, url_prefix="/api",
                description="Module owners: earnings of the modules an account owns (30% revenue share, "
                            "settled monthly), the payout destination, and payouts as money.")


def _live_account(org_id: str | None = None, scope: str = "billing:read") -> str:
    """The caller's account, or the organisation ``org_id`` when the member's role allows
    ``scope`` (``orgs.payer``: 403 ``org_role_required`` / 404; a billing member holds no
    organisation key); live keys only."""
    p = principal()
    if p.mode != "live":
        raise Forbidden("Earnings and payouts are live money: use a live key.")
    return acting_account(org_id, scope)


_ORG = {404: NOT_MEMBER}
_SETS = {**_ORG, 403: "A test key; or `beyond_own_limits`: the key has a spend limit (its own, or its rotation's) "
                      "or is an organisation key whose member has a monthly budget, and where earnings are "
                      "paid needs a key without one (or the console)."}


@endpoint(blp, "/earnings", "get", "billing:read", query=PayoutsReadQuerySchema, ok=OwnerEarningsSchema,
          errors={**_ORG, 403: "A test key."})
def owner_earnings(query):
    """Earnings of the catalog modules this account owns: accrued (not yet settled),
    settled, owed to the payout destination, and the recent monthly statements. Agents see
    theirs at `GET /api/agent/{id}/earnings`."""
    return earnings.owner_earnings(_live_account(query.get("org_id")))


@endpoint(blp, "/payouts", "get", "billing:read", query=PayoutsReadQuerySchema, ok=PayoutListSchema,
          errors={**_ORG, 403: "A test key."})
def list_payouts(query):
    """The account's payouts (newest first, max 100), its destination, what it is owed and
    the payout minimum."""
    return payouts.list_payouts(_live_account(query.get("org_id")))


@endpoint(blp, "/payouts", "post", "billing:write", query=PayoutsWriteQuerySchema, ok=PayoutSchema,
          headers=PayoutHeadersSchema, idempotent=True, name="PayoutRequestView", errors={**_ORG,
              403: "A test key.",
              409: "`no_payout_destination`, `below_payout_minimum` (it carries over), `payout_in_flight`."})
def request_payout(query, idempotency_key=None):
    """Pay out now what the account is owed (at least `minimum_cents`), or retry its failed
    payout at once. The monthly settlement does this by itself; this is for not waiting."""
    return payouts.request_payout(_live_account(query.get("org_id"), "billing:write"))


@endpoint(blp, "/payouts/destination", "get", "billing:read", query=PayoutsReadQuerySchema, ok=DestinationSchema,
          errors={403: "A test key.", 404: "None: earnings are kept as balance; or `org_id` is not an "
                                           "organisation of the caller."})
def get_destination(query):
    """The payout destination (404: none; settled earnings go to the balance)."""
    return payouts.get_destination(_live_account(query.get("org_id")))


@endpoint(blp, "/payouts/destination/stripe_connect", "put", "billing:write", body=StripeDestinationInSchema,
          ok=DestinationSchema, name="StripeDestinationView", errors=_SETS)
def put_stripe_destination(body):
    """Connect a Stripe Connect account as the payout destination: settled earnings are
    then paid out by transfer instead of credited to the balance (replaces any other). A key
    with a spend limit, or an organisation key whose member has a monthly budget, cannot set
    it (403 `beyond_own_limits`)."""
    return payouts.set_destination(_live_account(body.get("org_id"), "billing:write"), "stripe_connect",
                                   body["account"], None, acting_key_id=principal().credential_id)


@endpoint(blp, "/payouts/destination/usdc", "put", "billing:write", body=UsdcDestinationInSchema,
          ok=DestinationSchema, name="UsdcDestinationView", errors={
              **_SETS,
              409: "`payout_rail_unavailable`: USDC payouts are not available here (no payout wallet configured).",
              422: "`unprocessable`: a mixed-case address whose EIP-55 checksum does not match; nothing "
                   "changed."})
def put_usdc_destination(body):
    """Connect a USDC address on a chain as the payout destination (replaces any other). A key
    with a spend limit, or an organisation key whose member has a monthly budget, cannot set
    it (403 `beyond_own_limits`)."""
    return payouts.set_destination(_live_account(body.get("org_id"), "billing:write"), "usdc", body["address"],
                                   body["chain"], acting_key_id=principal().credential_id)


@endpoint(blp, "/payouts/destination", "delete", "billing:write", query=PayoutsWriteQuerySchema,
          ok=DestinationRemovedSchema, errors={403: "A test key.", 404: "There never was a destination, or "
                                                                      "`org_id` is not an organisation of the "
                                                                      "caller.",
                                               409: "`payout_in_flight`."})
def delete_destination(query):
    """Keep earnings as balance again: what is owed moves to the balance. Removing it again
    answers the first removal's answer and moves nothing (a retry whose first answer was
    lost), as deleting an alert does."""
    return payouts.remove_destination(_live_account(query.get("org_id"), "billing:write"))

"""Account endpoint (SPEC endpoint 2)."""
from app.auth import principal
from app.blueprints.accounts.schemas import AccountSchema
from app.blueprints.payments.invoice_schemas import (BillingDetailsRequestSchema, BillingDetailsSchema,
                                                     InvoiceQuerySchema)
from app.blueprints.routing import acting_account, endpoint
from app.extensions import Blueprint
from app.services.accounts import accounts
from app.services.billing import invoices
from app.services.orgs import orgs

blp = Blueprint("accounts", __name__, url_prefix="/api", description="The caller's account.")


@endpoint(blp, "/account", "get", "account:read", ok=AccountSchema)
def account():
    """The authenticated account: id, e-mail, plan, balance in cents (of the key's mode: a
    `svc_test_` key sees the test balance), agent id. With an organisation key the account
    is the organisation (it pays) and `actor` names the member who owns the key."""
    p = principal()
    return {**accounts.account_view(p.account_id, p.mode),
            "actor": {"account_id": orgs.person_of(p), "credential_id": p.credential_id,
                      "org_role": orgs.org_role_of(p)}}


@endpoint(blp, "/account/billing-details", "get", "billing:read", query=InvoiceQuerySchema, ok=BillingDetailsSchema,
          name="BillingDetailsView")
def get_billing_details(query):
    """The billing name, address, country and tax id printed on the account's next invoices."""
    return invoices.billing_details(acting_account(query.get("org_id"), "billing:read"))


@endpoint(blp, "/account/billing-details", "put", "billing:write", body=BillingDetailsRequestSchema,
          ok=BillingDetailsSchema, name="BillingDetailsSetView", body_optional=True)
def set_billing_details(body):
    """Set the billing details printed on invoices issued from now on (absent or empty fields are
    cleared; no body clears them all, as `{}` does); invoices already issued keep theirs."""
    account_id = acting_account(body.pop("org_id", None), "billing:write")
    return invoices.set_billing_details(account_id, body)

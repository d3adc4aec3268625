"""Every API operation of the client as an ``Op`` (request + parser), built once and run
by either the sync or the async client. Paths and shapes follow the gateway's OpenAPI
document (``GET /openapi.json``)."""
from __future__ import annotations

from datetime import date, datetime, timezone
from typing import Any, Callable, Literal, Mapping, TypedDict
from urllib.parse import quote

import httpx

from gateway_client._core import Op, json_body
from gateway_client._x402 import settlement
from gateway_client.models import (Account, Agent, AgentDisabled, AgentUsage, Alert, AlertEvent, AuditPage, AutoTopup, BillingDetails,
                                   ByokSettings, CheckoutState, ConnectMessage, ConnectedWallet, Invite, Member, MemberRemoved, Org, ProviderKey, ProviderKeys,
                                   Build, CallResult, Checkout, DailyUsage, DestinationRemoved, Earnings,
                                   Funding, Invoice, InvoicePage, Key, KeyCreated, Leaderboard, Module,
                                   ModuleUsage, Payment, PaymentMethod, Payout, PayoutDestination,
                                   PayoutList, ReceiptKey, Transaction, TransactionPage, UsageCurrent,
                                   WalletBalance, WalletFunding, parse)

Period = Literal["day", "week", "month", "total"]
Chain = Literal["base", "ethereum", "polygon"]
WalletChain = Literal["base", "ethereum", "polygon", "solana"]


class KeyOptions(TypedDict, total=False):
    """Optional fields of ``keys.create``: ``scopes`` (default: the creating credential's),
    ``spend_limit_cents`` (≥ 1) and ``spend_limit_period`` (day|week|month|total),
    ``expires_at`` (a future datetime, at most a year ahead; naive means UTC), ``org_id``
    (an organisation key: it spends the organisation's balance, owned by you as a member)."""

    scopes: list[str] | None
    spend_limit_cents: int | None
    spend_limit_period: Period | None
    expires_at: datetime | str | None
    org_id: str | None
    allowed_models: list[str] | None
    allowed_modules: list[str] | None
    rpm_limit: int | None
    tpm_limit: int | None


class KeyChanges(TypedDict, total=False):
    """Fields of ``keys.update``; only those given are sent. ``spend_limit_cents`` (None
    removes the limit), ``spend_limit_period`` (alone: the key's limit over a new period),
    the controls ``allowed_models``, ``allowed_modules``, ``rpm_limit``, ``tpm_limit`` (None
    removes one), and ``org_id`` for a key of an organisation."""

    spend_limit_cents: int | None
    spend_limit_period: Period | None
    allowed_models: list[str] | None
    allowed_modules: list[str] | None
    rpm_limit: int | None
    tpm_limit: int | None
    org_id: str | None


class UsageFilter(TypedDict, total=False):
    """Filters of the usage reads: ``org_id`` (an organisation's usage), ``key_id`` (one API
    key's calls), ``member_id`` (one member's organisation keys), ``module`` (one module's
    calls, no chat completion), ``model`` (one chat model's completions, no module call)."""

    org_id: str
    key_id: str
    member_id: str
    module: str
    model: str


class BillingDetailsSpec(TypedDict, total=False):
    """Fields of ``invoices.set_billing_details``; those not given are cleared."""

    name: str
    address: str
    country: str
    tax_id: str


class AlertSpec(TypedDict):
    """Fields of ``alerts.create`` (all required): see the Alert resource of the SPEC."""

    name: str
    metric: Literal["spend_cents", "plan_pct", "calls", "error_rate"]
    op: Literal[">", ">=", "<", "<="]
    threshold: float
    window: Literal["hour", "day", "week", "month"]
    channel: Literal["email", "webhook", "chat"]
    target: str


def when(value: datetime | date | str) -> str:
    """RFC 3339 text of a datetime (naive = UTC), a date, or text passed through."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return value


def _seg(value: str) -> str:
    """An id or slug as ONE path segment: ``/``, ``..``, ``?`` or ``#`` in it are data (a
    value from a user cannot reach another route)."""
    return quote(str(value), safe="")


def _drop_none(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


def _org(org_id: str | None) -> dict[str, str]:
    """The ``org_id`` query parameter of a route acting on an organisation, when given."""
    return _drop_none({"org_id": org_id})


def _one(cls: Any) -> Any:
    return lambda r: parse(cls, r.json())


def _many(cls: Any, key: str) -> Any:
    return lambda r: [parse(cls, x) for x in r.json()[key]]


def account() -> Op[Account]:
    return Op("GET", "/api/account", _one(Account))


def modules_list() -> Op[list[Module]]:
    return Op("GET", "/api/modules", lambda r: [Module.from_json(m) for m in r.json()["modules"]],
              auth=False)


def module_get(slug: str) -> Op[Module]:
    return Op("GET", f"/api/modules/{_seg(slug)}", lambda r: Module.from_json(r.json()), auth=False)


def call(slug: str, action: str, params: Mapping[str, Any], idempotency_key: str,
         verifier: Callable[[Mapping[str, Any]], bool],
         payment_headers: Mapping[str, str] | None = None) -> Op[CallResult]:
    def read(r: httpx.Response) -> CallResult:
        return CallResult.from_json(r.json(), idempotency_key=idempotency_key,
                                    replayed=r.headers.get("Idempotent-Replayed") == "true",
                                    payment=settlement(r.headers), _verifier=verifier)
    return Op("POST", f"/v1/module/{_seg(slug)}/call", read, json={"action": action, **params},
              headers={"Idempotency-Key": idempotency_key, **(payment_headers or {})},
              waits_for_provider=True)


def receipt_keys() -> Op[list[ReceiptKey]]:
    return Op("GET", "/api/receipts/keys", _many(ReceiptKey, "keys"), auth=False)


def keys_create(name: str, options: KeyOptions) -> Op[KeyCreated]:
    body = _drop_none({"name": name, **options})
    if "expires_at" in body:
        body["expires_at"] = when(body["expires_at"])
    return Op("POST", "/api/keys", _one(KeyCreated), json=body)


def keys_list(org_id: str | None = None) -> Op[list[Key]]:
    return Op("GET", "/api/keys", _many(Key, "keys"), params=_org(org_id))


def keys_revoke(key_id: str, org_id: str | None = None) -> Op[bool]:
    return Op("DELETE", f"/api/keys/{_seg(key_id)}", lambda r: bool(r.json()["revoked"]), params=_org(org_id))


def keys_rotate(key_id: str, overlap_seconds: int | None, org_id: str | None = None) -> Op[KeyCreated]:
    return Op("POST", f"/api/keys/{_seg(key_id)}/rotate", _one(KeyCreated),
              json=_drop_none({"overlap_seconds": overlap_seconds, "org_id": org_id}))


def keys_update(key_id: str, changes: KeyChanges) -> Op[Key]:
    return Op("PATCH", f"/api/keys/{_seg(key_id)}", _one(Key), json=dict(changes))


def usage_current(filters: UsageFilter) -> Op[UsageCurrent]:
    return Op("GET", "/api/usage/current", _one(UsageCurrent), params=_drop_none(filters))


def usage_by_module(filters: UsageFilter) -> Op[list[ModuleUsage]]:
    return Op("GET", "/api/usage/by-module", _many(ModuleUsage, "by_module"), params=_drop_none(filters))


def usage_daily(days: int, filters: UsageFilter) -> Op[list[DailyUsage]]:
    return Op("GET", "/api/usage/daily", _many(DailyUsage, "days"), params=_drop_none({"days": days, **filters}))


def usage_export(path: str, start: datetime | date | str, end: datetime | date | str,
                 fmt: Literal["csv", "json"], filters: UsageFilter) -> Op[str]:
    return Op("GET", "/api/usage/export", lambda r: path, stream_to=path,
              params=_drop_none({"from": when(start), "to": when(end), "format": fmt, **filters}))


def alerts_create(spec: AlertSpec, idempotency_key: str, org_id: str | None = None) -> Op[Alert]:
    return Op("POST", "/api/alerts", _one(Alert), json=_drop_none({**spec, "org_id": org_id}),
              headers={"Idempotency-Key": idempotency_key})


def alerts_list(org_id: str | None = None) -> Op[list[Alert]]:
    return Op("GET", "/api/alerts", _many(Alert, "alerts"), params=_org(org_id))


def alerts_delete(alert_id: str, org_id: str | None = None) -> Op[bool]:
    return Op("DELETE", f"/api/alerts/{_seg(alert_id)}", lambda r: bool(r.json()["deleted"]), params=_org(org_id))


def alert_events(org_id: str | None = None) -> Op[list[AlertEvent]]:
    return Op("GET", "/api/alerts/events", _many(AlertEvent, "events"), params=_org(org_id))


def wallet_balance(org_id: str | None = None) -> Op[WalletBalance]:
    return Op("GET", "/api/wallet/balance", _one(WalletBalance), params=_org(org_id))


def wallet_transactions(limit: int, cursor: str | None, org_id: str | None = None) -> Op[TransactionPage]:
    def read(r: httpx.Response) -> TransactionPage:
        data = r.json()
        return TransactionPage([parse(Transaction, t) for t in data["transactions"]],
                               data.get("next_cursor"))
    return Op("GET", "/api/wallet/transactions", read,
              params=_drop_none({"limit": limit, "cursor": cursor, "org_id": org_id}))


def wallet_fund(amount_cents: int, method: Literal["card", "ach", "usdc"], idempotency_key: str,
                org_id: str | None = None) -> Op[WalletFunding]:
    return Op("POST", "/api/wallet/fund", _one(WalletFunding),
              json=_drop_none({"amount_cents": amount_cents, "method": method, "org_id": org_id}),
              headers={"Idempotency-Key": idempotency_key})


def wallet_connect_message(chain: WalletChain, address: str, org_id: str | None) -> Op[ConnectMessage]:
    return Op("GET", "/api/wallet/connect/message", _one(ConnectMessage),
              params=_drop_none({"chain": chain, "address": address, "org_id": org_id}))


def wallet_connect(chain: WalletChain, address: str, signature: str, nonce: str | None,
                   org_id: str | None) -> Op[ConnectedWallet]:
    return Op("POST", "/api/wallet/connect", _one(ConnectedWallet),
              json=_drop_none({"chain": chain, "address": address, "signature": signature, "nonce": nonce,
                               "org_id": org_id}))


def pay_checkout(amount_cents: int, product: str | None, return_url: str | None,
                 idempotency_key: str, save_method: bool = False, org_id: str | None = None) -> Op[Checkout]:
    return Op("POST", "/api/pay/checkout", _one(Checkout),
              json=_drop_none({"amount_cents": amount_cents, "product": product, "return_url": return_url,
                               "save_method": save_method or None, "org_id": org_id}),
              headers={"Idempotency-Key": idempotency_key})


def pay_history(org_id: str | None = None) -> Op[list[Payment]]:
    return Op("GET", "/api/pay/history", _many(Payment, "payments"), params=_org(org_id))


def checkout_get(payment_id: str, org_id: str | None) -> Op[CheckoutState]:
    return Op("GET", f"/api/pay/checkout/{_seg(payment_id)}", _one(CheckoutState), params=_org(org_id))


def checkout_cancel(payment_id: str, org_id: str | None) -> Op[Payment]:
    return Op("POST", f"/api/pay/checkout/{_seg(payment_id)}/cancel", _one(Payment), params=_org(org_id))


def agent_register(name: str, pubkey: str, webhook: str | None, org_id: str | None = None) -> Op[Agent]:
    return Op("POST", "/api/agent/register", _one(Agent),
              json=_drop_none({"name": name, "pubkey": pubkey, "webhook": webhook, "org_id": org_id}))


def agent_fund(agent_id: str, amount_cents: int, idempotency_key: str, org_id: str | None = None) -> Op[Funding]:
    return Op("POST", f"/api/agent/{_seg(agent_id)}/fund", _one(Funding),
              json=_drop_none({"amount_cents": amount_cents, "org_id": org_id}),
              headers={"Idempotency-Key": idempotency_key})


def agent_disable(agent_id: str, org_id: str | None = None) -> Op[AgentDisabled]:
    return Op("DELETE", f"/api/agent/{_seg(agent_id)}", _one(AgentDisabled), params=_org(org_id))


def agent_usage(agent_id: str) -> Op[AgentUsage]:
    return Op("GET", f"/api/agent/{_seg(agent_id)}/usage", lambda r: AgentUsage.from_json(r.json()))


def agent_nonce() -> Op[str]:
    return Op("GET", "/api/agent/nonce", lambda r: str(r.json()["nonce"]), auth=False)


def agent_signin(pubkey: str, nonce: str, signature: str) -> Op[dict[str, Any]]:
    return Op("POST", "/api/agent/signin", json_body, auth=False,
              json={"pubkey": pubkey, "nonce": nonce, "signature": signature})


SIWX_PATH = "/api/agent/siwx"


def agent_siwx_challenge() -> Op[dict[str, Any]]:
    """The Sign-In-With-X challenge: x402's ``{info, supportedChains, schema}``."""
    return Op("GET", SIWX_PATH, json_body, auth=False)


def agent_siwx_signin(header: str) -> Op[dict[str, Any]]:
    """Sign in with the ``SIGN-IN-WITH-X`` header (x402's ``encode_siwx_header``)."""
    return Op("POST", SIWX_PATH, json_body, auth=False, headers={"SIGN-IN-WITH-X": header})


def invoices_list(limit: int, cursor: str | None, org_id: str | None) -> Op[InvoicePage]:
    def read(r: httpx.Response) -> InvoicePage:
        data = r.json()
        return InvoicePage([Invoice.from_json(i) for i in data["invoices"]], data.get("next_cursor"))
    return Op("GET", "/api/pay/invoices", read,
              params=_drop_none({"limit": limit, "cursor": cursor, "org_id": org_id}))


def invoice_get(invoice_id: str, org_id: str | None) -> Op[Invoice]:
    return Op("GET", f"/api/pay/invoices/{_seg(invoice_id)}", lambda r: Invoice.from_json(r.json()),
              params=_org(org_id))


def invoice_pdf(invoice_id: str, path: str, org_id: str | None) -> Op[str]:
    return Op("GET", f"/api/pay/invoices/{_seg(invoice_id)}.pdf", lambda r: path, params=_org(org_id),
              headers={"Accept": "application/pdf"}, stream_to=path)


def billing_details(org_id: str | None) -> Op[BillingDetails]:
    return Op("GET", "/api/account/billing-details", _one(BillingDetails), params=_org(org_id))


def billing_details_set(details: BillingDetailsSpec, org_id: str | None) -> Op[BillingDetails]:
    return Op("PUT", "/api/account/billing-details", _one(BillingDetails),
              json=_drop_none({**details, "org_id": org_id}))


def methods_list(org_id: str | None) -> Op[list[PaymentMethod]]:
    return Op("GET", "/api/pay/methods", _many(PaymentMethod, "methods"), params=_org(org_id))


def method_save(payment_method_id: str, org_id: str | None) -> Op[PaymentMethod]:
    return Op("POST", "/api/pay/method", _one(PaymentMethod),
              json=_drop_none({"payment_method_id": payment_method_id, "org_id": org_id}))


def method_set_default(payment_method_id: str, org_id: str | None) -> Op[PaymentMethod]:
    return Op("POST", f"/api/pay/methods/{_seg(payment_method_id)}/default", _one(PaymentMethod),
              params=_org(org_id))


def method_delete(payment_method_id: str, org_id: str | None) -> Op[bool]:
    return Op("DELETE", f"/api/pay/methods/{_seg(payment_method_id)}", lambda r: bool(r.json()["deleted"]),
              params=_org(org_id))


def auto_topup_get(org_id: str | None) -> Op[AutoTopup]:
    return Op("GET", "/api/pay/auto-topup", lambda r: AutoTopup.from_json(r.json()), params=_org(org_id))


def auto_topup_set(threshold_cents: int, amount_cents: int, monthly_cap_cents: int,
                   org_id: str | None) -> Op[AutoTopup]:
    return Op("PUT", "/api/pay/auto-topup", lambda r: AutoTopup.from_json(r.json()),
              json=_drop_none({"threshold_cents": threshold_cents, "amount_cents": amount_cents,
                               "monthly_cap_cents": monthly_cap_cents, "org_id": org_id}))


def auto_topup_delete(org_id: str | None) -> Op[bool]:
    return Op("DELETE", "/api/pay/auto-topup", lambda r: bool(r.json()["deleted"]), params=_org(org_id))


def payouts_list(org_id: str | None) -> Op[PayoutList]:
    return Op("GET", "/api/payouts", lambda r: PayoutList.from_json(r.json()), params=_org(org_id))


def payout_create(org_id: str | None, idempotency_key: str) -> Op[Payout]:
    return Op("POST", "/api/payouts", _one(Payout), params=_org(org_id),
              headers={"Idempotency-Key": idempotency_key})


def payout_destination(org_id: str | None) -> Op[PayoutDestination]:
    return Op("GET", "/api/payouts/destination", _one(PayoutDestination), params=_org(org_id))


def payout_destination_stripe(account: str, org_id: str | None) -> Op[PayoutDestination]:
    return Op("PUT", "/api/payouts/destination/stripe_connect", _one(PayoutDestination),
              json=_drop_none({"account": account, "org_id": org_id}))


def payout_destination_usdc(chain: Chain, address: str, org_id: str | None) -> Op[PayoutDestination]:
    return Op("PUT", "/api/payouts/destination/usdc", _one(PayoutDestination),
              json=_drop_none({"chain": chain, "address": address, "org_id": org_id}))


def payout_destination_delete(org_id: str | None) -> Op[DestinationRemoved]:
    return Op("DELETE", "/api/payouts/destination", _one(DestinationRemoved), params=_org(org_id))


def owner_earnings(org_id: str | None) -> Op[Earnings]:
    return Op("GET", "/api/earnings", lambda r: Earnings.from_json(r.json()), params=_org(org_id))


def build_submit(slug: str, price_cents: int, actions: list[str], webhook: str | None,
                 description: str | None) -> Op[Build]:
    return Op("POST", "/api/agent/build", _one(Build),
              json=_drop_none({"slug": slug, "price_cents": price_cents, "actions": list(actions),
                               "webhook": webhook, "description": description}))


def builds_list() -> Op[list[Build]]:
    return Op("GET", "/api/agent/builds", _many(Build, "builds"))


def agent_earnings(agent_id: str) -> Op[Earnings]:
    return Op("GET", f"/api/agent/{_seg(agent_id)}/earnings", lambda r: Earnings.from_json(r.json()))


def agent_leaderboard(limit: int) -> Op[Leaderboard]:
    return Op("GET", "/api/agent/leaderboard", lambda r: Leaderboard.from_json(r.json()), params={"limit": limit})


Role = Literal["owner", "admin", "developer", "billing", "viewer"]


class MemberChanges(TypedDict, total=False):
    """Fields of ``orgs.update_member``; only those given are sent (at least one):
    ``role``, ``monthly_budget_cents`` (None removes the budget)."""

    role: Role
    monthly_budget_cents: int | None


def orgs_create(name: str) -> Op[Org]:
    return Op("POST", "/api/orgs", _one(Org), json={"name": name})


def orgs_list() -> Op[list[Org]]:
    return Op("GET", "/api/orgs", _many(Org, "orgs"))


def org_get(org_id: str) -> Op[Org]:
    return Op("GET", f"/api/orgs/{_seg(org_id)}", _one(Org))


def org_members(org_id: str) -> Op[list[Member]]:
    return Op("GET", f"/api/orgs/{_seg(org_id)}/members", _many(Member, "members"))


def org_member_update(org_id: str, member_id: str, changes: MemberChanges) -> Op[Member]:
    return Op("PATCH", f"/api/orgs/{_seg(org_id)}/members/{_seg(member_id)}", _one(Member), json=dict(changes))


def org_member_remove(org_id: str, member_id: str) -> Op[MemberRemoved]:
    return Op("DELETE", f"/api/orgs/{_seg(org_id)}/members/{_seg(member_id)}", _one(MemberRemoved))


def org_invite(org_id: str, email: str, role: Role) -> Op[Invite]:
    return Op("POST", f"/api/orgs/{_seg(org_id)}/invites", _one(Invite), json={"email": email, "role": role})


def org_invites(org_id: str) -> Op[list[Invite]]:
    return Op("GET", f"/api/orgs/{_seg(org_id)}/invites", _many(Invite, "invites"))


def org_invite_revoke(org_id: str, invite_id: str) -> Op[Invite]:
    return Op("DELETE", f"/api/orgs/{_seg(org_id)}/invites/{_seg(invite_id)}", _one(Invite))


def org_invite_accept(token: str) -> Op[Org]:
    return Op("POST", f"/api/orgs/invites/{_seg(token)}/accept", _one(Org))


def _audit_page(log: str, limit: int, cursor: str | None) -> Op[AuditPage]:
    return Op("GET", log, lambda r: AuditPage.from_json(r.json()),
              params=_drop_none({"limit": limit, "cursor": cursor, "format": "json"}))


def _audit_csv(log: str, path: str) -> Op[str]:
    return Op("GET", log, lambda r: path, params={"format": "csv"}, headers={"Accept": "text/csv"}, stream_to=path)


def audit(limit: int, cursor: str | None) -> Op[AuditPage]:
    return _audit_page("/api/audit", limit, cursor)


def audit_export(path: str) -> Op[str]:
    return _audit_csv("/api/audit", path)


def org_audit(org_id: str, limit: int, cursor: str | None) -> Op[AuditPage]:
    return _audit_page(f"/api/orgs/{_seg(org_id)}/audit", limit, cursor)


def org_audit_export(org_id: str, path: str) -> Op[str]:
    return _audit_csv(f"/api/orgs/{_seg(org_id)}/audit", path)


def provider_keys_list() -> Op[ProviderKeys]:
    return Op("GET", "/api/provider-keys", lambda r: ProviderKeys.from_json(r.json()))


def provider_key_add(provider: str, api_key: str) -> Op[ProviderKey]:
    return Op("POST", "/api/provider-keys", _one(ProviderKey), json={"provider": provider, "api_key": api_key})


def provider_key_delete(key_id: str) -> Op[bool]:
    return Op("DELETE", f"/api/provider-keys/{_seg(key_id)}", lambda r: bool(r.json()["deleted"]))


def byok_settings_update(byok_only: bool | None, byok_fallback: bool | None) -> Op[ByokSettings]:
    return Op("PATCH", "/api/provider-keys/settings", _one(ByokSettings),
              json=_drop_none({"byok_only": byok_only, "byok_fallback": byok_fallback}))

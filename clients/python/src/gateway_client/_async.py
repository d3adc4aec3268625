"""The asynchronous client: ``AsyncGateway`` (``httpx.AsyncClient``), the same surface
as ``Gateway`` with awaitable methods. Operations come from gateway_client.ops; retry,
error and credential rules are those of gateway_client._core."""
from __future__ import annotations

import asyncio
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, Literal, Mapping, TypeVar

import httpx

from gateway_client import ops, receipts
from gateway_client._core import (Op, RetryPolicy, default_timeouts, new_idempotency_key,
                                  raise_for_status, request_headers, request_timeout,
                                  resolve_api_key, resolve_base_url)
from gateway_client._x402 import AsyncPayer
from gateway_client.errors import PaymentRequired
from gateway_client.models import (Account, Agent, AgentDisabled, AgentUsage, Alert, AlertEvent, AuditPage, AutoTopup, BillingDetails,
                                   ByokSettings, CheckoutState, ConnectMessage, ConnectedWallet, Invite, Member, MemberRemoved, Org, ProviderKey, ProviderKeys,
                                   Build, CallResult, Checkout, DailyUsage, DestinationRemoved, Earnings,
                                   Funding, Invoice, InvoicePage, Key, KeyCreated, Leaderboard, Module,
                                   ModuleUsage, Payment, PaymentMethod, Payout, PayoutDestination,
                                   PayoutList, ReceiptKey, TransactionPage, UsageCurrent, WalletBalance,
                                   WalletFunding)

if TYPE_CHECKING:  # pragma: no cover
    import openai
    from typing_extensions import Unpack

T = TypeVar("T")


class _AsyncResource:
    def __init__(self, gw: AsyncGateway) -> None:
        self._gw = gw


class AsyncModules(_AsyncResource):
    async def list(self) -> list[Module]:
        return await self._gw.request(ops.modules_list())

    async def get(self, slug: str) -> Module:
        return await self._gw.request(ops.module_get(slug))


class AsyncKeys(_AsyncResource):
    async def create(self, name: str, **options: Unpack[ops.KeyOptions]) -> KeyCreated:
        return await self._gw.request(ops.keys_create(name, options))

    async def list(self, org_id: str | None = None) -> list[Key]:
        return await self._gw.request(ops.keys_list(org_id))

    async def revoke(self, key_id: str, org_id: str | None = None) -> bool:
        return await self._gw.request(ops.keys_revoke(key_id, org_id))

    async def rotate(self, key_id: str, overlap_seconds: int | None = None,
                     org_id: str | None = None) -> KeyCreated:
        return await self._gw.request(ops.keys_rotate(key_id, overlap_seconds, org_id))

    async def update(self, key_id: str, **changes: Unpack[ops.KeyChanges]) -> Key:
        return await self._gw.request(ops.keys_update(key_id, changes))


class AsyncUsage(_AsyncResource):
    async def current(self, **filters: Unpack[ops.UsageFilter]) -> UsageCurrent:
        return await self._gw.request(ops.usage_current(filters))

    async def by_module(self, **filters: Unpack[ops.UsageFilter]) -> list[ModuleUsage]:
        return await self._gw.request(ops.usage_by_module(filters))

    async def daily(self, days: int = 30, **filters: Unpack[ops.UsageFilter]) -> list[DailyUsage]:
        return await self._gw.request(ops.usage_daily(days, filters))

    async def export(self, path: str, start: datetime | date | str, end: datetime | date | str,
                     format: Literal["csv", "json"] = "csv", **filters: Unpack[ops.UsageFilter]) -> str:
        return await self._gw.request(ops.usage_export(path, start, end, format, filters))


class AsyncAlerts(_AsyncResource):
    async def create(self, *, idempotency_key: str | None = None, org_id: str | None = None,
                     **spec: Unpack[ops.AlertSpec]) -> Alert:
        """Create an alert. Sent with an ``Idempotency-Key`` (``idempotency_key``, or a new
        one), so the client's retries of a lost answer make no second alert."""
        return await self._gw.request(ops.alerts_create(spec, idempotency_key or new_idempotency_key(), org_id))

    async def events(self, org_id: str | None = None) -> list[AlertEvent]:
        return await self._gw.request(ops.alert_events(org_id))

    async def list(self, org_id: str | None = None) -> list[Alert]:
        return await self._gw.request(ops.alerts_list(org_id))

    async def delete(self, alert_id: str, org_id: str | None = None) -> bool:
        return await self._gw.request(ops.alerts_delete(alert_id, org_id))


class AsyncWallet(_AsyncResource):
    async def balance(self, org_id: str | None = None) -> WalletBalance:
        return await self._gw.request(ops.wallet_balance(org_id))

    async def transactions(self, limit: int = 50, cursor: str | None = None,
                           org_id: str | None = None) -> TransactionPage:
        return await self._gw.request(ops.wallet_transactions(limit, cursor, org_id))

    async def fund(self, amount_cents: int, method: Literal["card", "ach", "usdc"] = "card", *,
                   idempotency_key: str | None = None, org_id: str | None = None) -> WalletFunding:
        return await self._gw.request(ops.wallet_fund(amount_cents, method,
                                                      idempotency_key or new_idempotency_key(), org_id))

    async def connect_message(self, chain: ops.WalletChain, address: str,
                              org_id: str | None = None) -> ConnectMessage:
        return await self._gw.request(ops.wallet_connect_message(chain, address, org_id))

    async def connect(self, chain: ops.WalletChain, address: str, signature: str, nonce: str | None = None,
                      org_id: str | None = None) -> ConnectedWallet:
        return await self._gw.request(ops.wallet_connect(chain, address, signature, nonce, org_id))


class AsyncPay(_AsyncResource):
    async def checkout(self, amount_cents: int, product: str | None = None,
                       return_url: str | None = None, save_method: bool = False, *,
                       idempotency_key: str | None = None, org_id: str | None = None) -> Checkout:
        return await self._gw.request(ops.pay_checkout(amount_cents, product, return_url,
                                                       idempotency_key or new_idempotency_key(), save_method, org_id))

    async def history(self, org_id: str | None = None) -> list[Payment]:
        return await self._gw.request(ops.pay_history(org_id))

    async def get_checkout(self, payment_id: str, org_id: str | None = None) -> CheckoutState:
        return await self._gw.request(ops.checkout_get(payment_id, org_id))

    async def cancel_checkout(self, payment_id: str, org_id: str | None = None) -> Payment:
        return await self._gw.request(ops.checkout_cancel(payment_id, org_id))


class AsyncReceipts(_AsyncResource):
    async def keys(self) -> list[ReceiptKey]:
        return await self._gw.request(ops.receipt_keys())

    async def verify(self, response: CallResult | Mapping[str, Any]) -> bool:
        """Verify a call result (or a saved call response dict); raises ReceiptInvalid.
        Fetches the published keys when the receipt's key is not known yet."""
        data = response.as_response() if isinstance(response, CallResult) else response
        await self._gw.learn_receipt_key((data.get("receipt") or {}).get("kid"))
        return self._gw._verify(data)


class AsyncAgents(_AsyncResource):
    async def register(self, name: str, pubkey: str, webhook: str | None = None,
                       org_id: str | None = None) -> Agent:
        return await self._gw.request(ops.agent_register(name, pubkey, webhook, org_id))

    async def fund(self, agent_id: str, amount_cents: int, idempotency_key: str | None = None,
                   org_id: str | None = None) -> Funding:
        return await self._gw.request(ops.agent_fund(agent_id, amount_cents,
                                                     idempotency_key or new_idempotency_key(), org_id))

    async def disable(self, agent_id: str, org_id: str | None = None) -> AgentDisabled:
        return await self._gw.request(ops.agent_disable(agent_id, org_id))

    async def usage(self, agent_id: str) -> AgentUsage:
        return await self._gw.request(ops.agent_usage(agent_id))

    async def earnings(self, agent_id: str) -> Earnings:
        return await self._gw.request(ops.agent_earnings(agent_id))

    async def leaderboard(self, limit: int = 10) -> Leaderboard:
        return await self._gw.request(ops.agent_leaderboard(limit))


class AsyncBuilds(_AsyncResource):
    async def submit(self, slug: str, price_cents: int, actions: list[str], webhook: str | None = None,
                     description: str | None = None) -> Build:
        return await self._gw.request(ops.build_submit(slug, price_cents, actions, webhook, description))

    async def list(self) -> list[Build]:
        return await self._gw.request(ops.builds_list())


class AsyncInvoices(_AsyncResource):
    async def list(self, limit: int = 50, cursor: str | None = None, org_id: str | None = None) -> InvoicePage:
        return await self._gw.request(ops.invoices_list(limit, cursor, org_id))

    async def get(self, invoice_id: str, org_id: str | None = None) -> Invoice:
        return await self._gw.request(ops.invoice_get(invoice_id, org_id))

    async def pdf(self, invoice_id: str, path: str, org_id: str | None = None) -> str:
        return await self._gw.request(ops.invoice_pdf(invoice_id, path, org_id))

    async def billing_details(self, org_id: str | None = None) -> BillingDetails:
        return await self._gw.request(ops.billing_details(org_id))

    async def set_billing_details(self, *, org_id: str | None = None,
                                  **details: Unpack[ops.BillingDetailsSpec]) -> BillingDetails:
        return await self._gw.request(ops.billing_details_set(details, org_id))


class AsyncPaymentMethods(_AsyncResource):
    async def list(self, org_id: str | None = None) -> list[PaymentMethod]:
        return await self._gw.request(ops.methods_list(org_id))

    async def save(self, payment_method_id: str, org_id: str | None = None) -> PaymentMethod:
        return await self._gw.request(ops.method_save(payment_method_id, org_id))

    async def set_default(self, payment_method_id: str, org_id: str | None = None) -> PaymentMethod:
        return await self._gw.request(ops.method_set_default(payment_method_id, org_id))

    async def delete(self, payment_method_id: str, org_id: str | None = None) -> bool:
        return await self._gw.request(ops.method_delete(payment_method_id, org_id))


class AsyncAutoTopupRule(_AsyncResource):
    async def get(self, org_id: str | None = None) -> AutoTopup:
        return await self._gw.request(ops.auto_topup_get(org_id))

    async def set(self, threshold_cents: int, amount_cents: int, monthly_cap_cents: int,
                  org_id: str | None = None) -> AutoTopup:
        return await self._gw.request(ops.auto_topup_set(threshold_cents, amount_cents, monthly_cap_cents, org_id))

    async def disable(self, org_id: str | None = None) -> bool:
        return await self._gw.request(ops.auto_topup_delete(org_id))


class AsyncPayouts(_AsyncResource):
    async def list(self, org_id: str | None = None) -> PayoutList:
        return await self._gw.request(ops.payouts_list(org_id))

    async def create(self, org_id: str | None = None, *, idempotency_key: str | None = None) -> Payout:
        """As ``Payouts.create``: sent with an ``Idempotency-Key`` (given, or a new one)."""
        return await self._gw.request(ops.payout_create(org_id, idempotency_key or new_idempotency_key()))

    async def destination(self, org_id: str | None = None) -> PayoutDestination:
        return await self._gw.request(ops.payout_destination(org_id))

    async def set_stripe_destination(self, account: str, org_id: str | None = None) -> PayoutDestination:
        return await self._gw.request(ops.payout_destination_stripe(account, org_id))

    async def set_usdc_destination(self, chain: ops.Chain, address: str,
                                   org_id: str | None = None) -> PayoutDestination:
        return await self._gw.request(ops.payout_destination_usdc(chain, address, org_id))

    async def remove_destination(self, org_id: str | None = None) -> DestinationRemoved:
        return await self._gw.request(ops.payout_destination_delete(org_id))

    async def earnings(self, org_id: str | None = None) -> Earnings:
        return await self._gw.request(ops.owner_earnings(org_id))


class AsyncOrgs(_AsyncResource):
    async def create(self, name: str) -> Org:
        return await self._gw.request(ops.orgs_create(name))

    async def get(self, org_id: str) -> Org:
        return await self._gw.request(ops.org_get(org_id))

    async def members(self, org_id: str) -> list[Member]:
        return await self._gw.request(ops.org_members(org_id))

    async def update_member(self, org_id: str, member_id: str, **changes: Unpack[ops.MemberChanges]) -> Member:
        return await self._gw.request(ops.org_member_update(org_id, member_id, changes))

    async def remove_member(self, org_id: str, member_id: str) -> MemberRemoved:
        return await self._gw.request(ops.org_member_remove(org_id, member_id))

    async def invite(self, org_id: str, email: str, role: ops.Role) -> Invite:
        return await self._gw.request(ops.org_invite(org_id, email, role))

    async def invites(self, org_id: str) -> list[Invite]:
        return await self._gw.request(ops.org_invites(org_id))

    async def revoke_invite(self, org_id: str, invite_id: str) -> Invite:
        return await self._gw.request(ops.org_invite_revoke(org_id, invite_id))

    async def accept_invite(self, token: str) -> Org:
        return await self._gw.request(ops.org_invite_accept(token))

    async def audit(self, org_id: str, limit: int = 50, cursor: str | None = None) -> AuditPage:
        return await self._gw.request(ops.org_audit(org_id, limit, cursor))

    async def audit_export(self, org_id: str, path: str) -> str:
        return await self._gw.request(ops.org_audit_export(org_id, path))

    async def list(self) -> list[Org]:
        return await self._gw.request(ops.orgs_list())


class AsyncProviderKeys(_AsyncResource):
    async def list(self) -> ProviderKeys:
        return await self._gw.request(ops.provider_keys_list())

    async def add(self, provider: str, api_key: str) -> ProviderKey:
        return await self._gw.request(ops.provider_key_add(provider, api_key))

    async def delete(self, key_id: str) -> bool:
        return await self._gw.request(ops.provider_key_delete(key_id))

    async def update_settings(self, byok_only: bool | None = None,
                              byok_fallback: bool | None = None) -> ByokSettings:
        return await self._gw.request(ops.byok_settings_update(byok_only, byok_fallback))


class AsyncGateway:
    """Asynchronous client; see ``Gateway`` for the arguments. Use ``async with``."""

    def __init__(self, api_key: str | None = None, base_url: str | None = None, *,
                 timeout: float | None = None, max_retries: int = 2,
                 retry: RetryPolicy | None = None, x402_account: Any = None,
                 chat_base_url: str | None = None,
                 http_client: httpx.AsyncClient | None = None) -> None:
        self.base_url = resolve_base_url(base_url)
        self.api_key = resolve_api_key(api_key)
        self.chat_base_url = chat_base_url
        self.retry = retry or RetryPolicy(max_retries=max_retries)
        own_timeout, self._call_timeout = default_timeouts(timeout, http_client is None)
        self._http = http_client or httpx.AsyncClient(timeout=own_timeout)
        self._payer = AsyncPayer(x402_account) if x402_account is not None else None
        self._public_keys: dict[str, str] = {}
        self.modules, self.keys, self.usage = AsyncModules(self), AsyncKeys(self), AsyncUsage(self)
        self.alerts, self.wallet, self.pay = AsyncAlerts(self), AsyncWallet(self), AsyncPay(self)
        self.receipts, self.agents, self.builds = AsyncReceipts(self), AsyncAgents(self), AsyncBuilds(self)
        self.invoices, self.payment_methods = AsyncInvoices(self), AsyncPaymentMethods(self)
        self.auto_topup, self.payouts = AsyncAutoTopupRule(self), AsyncPayouts(self)
        self.orgs, self.provider_keys = AsyncOrgs(self), AsyncProviderKeys(self)

    async def __aenter__(self) -> AsyncGateway:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def account(self) -> Account:
        return await self.request(ops.account())

    async def audit(self, limit: int = 50, cursor: str | None = None) -> AuditPage:
        return await self.request(ops.audit(limit, cursor))

    async def audit_export(self, path: str) -> str:
        return await self.request(ops.audit_export(path))

    async def call(self, slug: str, /, action: str, *, idempotency_key: str | None = None,
                   **params: Any) -> CallResult:
        """As ``Gateway.call``. The gateway's receipt keys are fetched when a result is
        signed by a key the client does not know yet (the first call, or after the gateway
        rotated its key), so ``result.verify()`` needs no network."""
        key = idempotency_key or new_idempotency_key()
        try:
            result = await self.request(ops.call(slug, action, params, key, self._verify))
        except PaymentRequired as exc:
            if self._payer is None or exc.code != "payment_required":
                raise
            paid = await self._payer.headers_for(exc)
            result = await self.request(ops.call(slug, action, params, key, self._verify, paid))
        await self.learn_receipt_key(result.receipt.kid)
        return result

    async def refresh_receipt_keys(self) -> None:
        self._public_keys = {k.kid: k.public_key for k in await self.receipts.keys()}

    async def learn_receipt_key(self, kid: str | None) -> None:
        """Fetch the published receipt keys unless ``kid`` is among those already known."""
        if kid not in self._public_keys:
            await self.refresh_receipt_keys()

    def chat_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` client for the chat host."""
        from gateway_client._chat import chat_settings
        import openai

        return openai.AsyncOpenAI(**chat_settings(self.base_url, self.chat_base_url, self.api_key, kwargs))

    def _verify(self, response: Mapping[str, Any]) -> bool:
        return receipts.verify(response, self._public_keys)

    async def _token(self) -> str | None:
        return self.api_key

    async def _reauthenticate(self) -> bool:
        """Called on a 401; True when a fresh credential was obtained (retry once)."""
        return False

    async def _send(self, op: Op[Any]) -> httpx.Response:
        headers = request_headers(op, await self._token() if op.auth else None)
        req = self._http.build_request(op.method, self.base_url + op.path, json=op.json,
                                       params=op.params, headers=headers,
                                       timeout=request_timeout(op, self._call_timeout))
        response = await self._http.send(req, stream=op.stream_to is not None)
        if op.stream_to is None:
            return response
        try:
            if response.is_success:
                with open(op.stream_to, "wb") as fh:
                    async for chunk in response.aiter_bytes():
                        fh.write(chunk)
            else:
                await response.aread()
        finally:
            await response.aclose()
        return response

    async def request(self, op: Op[T]) -> T:
        """Run one operation with retries; returns its parsed 2xx answer."""
        attempt, reauthed = 0, False
        while True:
            try:
                response = await self._send(op)
            except httpx.TransportError as exc:
                delay = self.retry.delay(op, attempt, None, exc)
                if delay is None:
                    raise
            else:
                if response.status_code == 401 and op.auth and not reauthed and await self._reauthenticate():
                    reauthed = True
                    continue
                delay = None if response.is_success else self.retry.delay(op, attempt, response)
                if delay is None:
                    raise_for_status(response)
                    return op.parse(response)
            await asyncio.sleep(delay)
            attempt += 1

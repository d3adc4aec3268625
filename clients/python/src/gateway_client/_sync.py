"""The synchronous client: ``Gateway`` and its resources (``gw.keys``, ``gw.usage``, …).

Every method builds an ``Op`` (gateway_client.ops) and runs it through
``Gateway.request``, which adds the credential and User-Agent, retries per the
``RetryPolicy`` and turns error answers into ``ApiError`` subclasses.
"""
from __future__ import annotations

import time
from datetime import date, datetime
from typing import TYPE_CHECKING, Any, Literal, Mapping, TypeVar

import httpx

from gateway_client import ops, receipts
from gateway_client._core import (Op, RetryPolicy, default_timeouts, new_idempotency_key,
                                  raise_for_status, request_headers, request_timeout,
                                  resolve_api_key, resolve_base_url)
from gateway_client._x402 import SyncPayer
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


class _Resource:
    def __init__(self, gw: Gateway) -> None:
        self._gw = gw


class Modules(_Resource):
    def list(self) -> list[Module]:
        """Approved modules with their actions and prices (public)."""
        return self._gw.request(ops.modules_list())

    def get(self, slug: str) -> Module:
        return self._gw.request(ops.module_get(slug))


class Keys(_Resource):
    def create(self, name: str, **options: Unpack[ops.KeyOptions]) -> KeyCreated:
        """Create a key; ``.key`` holds the secret (shown once)."""
        return self._gw.request(ops.keys_create(name, options))

    def list(self, org_id: str | None = None) -> list[Key]:
        """This account's keys, or with ``org_id`` the organisation's (owners and admins:
        every key; other members their own)."""
        return self._gw.request(ops.keys_list(org_id))

    def revoke(self, key_id: str, org_id: str | None = None) -> bool:
        return self._gw.request(ops.keys_revoke(key_id, org_id))

    def rotate(self, key_id: str, overlap_seconds: int | None = None, org_id: str | None = None) -> KeyCreated:
        """A new key with the same name, scopes and limits; the old one keeps working for
        ``overlap_seconds`` (server default 86,400)."""
        return self._gw.request(ops.keys_rotate(key_id, overlap_seconds, org_id))

    def update(self, key_id: str, **changes: Unpack[ops.KeyChanges]) -> Key:
        """Change a key's spend limit and controls: only the fields given are sent
        (``spend_limit_cents=None`` removes the limit; ``spend_limit_period`` alone moves the
        key's limit to another period; ``rpm_limit=None`` removes that control)."""
        return self._gw.request(ops.keys_update(key_id, changes))


class Usage(_Resource):
    """Usage of the current period, by module, by day, and the per-call export. Each takes
    the filters ``org_id``, ``key_id``, ``member_id``, ``module``, ``model`` (``ops.UsageFilter``)."""

    def current(self, **filters: Unpack[ops.UsageFilter]) -> UsageCurrent:
        return self._gw.request(ops.usage_current(filters))

    def by_module(self, **filters: Unpack[ops.UsageFilter]) -> list[ModuleUsage]:
        return self._gw.request(ops.usage_by_module(filters))

    def daily(self, days: int = 30, **filters: Unpack[ops.UsageFilter]) -> list[DailyUsage]:
        return self._gw.request(ops.usage_daily(days, filters))

    def export(self, path: str, start: datetime | date | str, end: datetime | date | str,
               format: Literal["csv", "json"] = "csv", **filters: Unpack[ops.UsageFilter]) -> str:
        """Stream the calls between ``start`` and ``end`` (≤ 31 days) into ``path``."""
        return self._gw.request(ops.usage_export(path, start, end, format, filters))


class Alerts(_Resource):
    def create(self, *, idempotency_key: str | None = None, org_id: str | None = None,
               **spec: Unpack[ops.AlertSpec]) -> Alert:
        """Create an alert. Sent with an ``Idempotency-Key`` (``idempotency_key``, or a new
        one), so the client's retries of a lost answer make no second alert."""
        return self._gw.request(ops.alerts_create(spec, idempotency_key or new_idempotency_key(), org_id))

    def events(self, org_id: str | None = None) -> list[AlertEvent]:
        """The 100 most recent firings (deleted alerts' too), newest first, with their delivery."""
        return self._gw.request(ops.alert_events(org_id))

    def list(self, org_id: str | None = None) -> list[Alert]:
        return self._gw.request(ops.alerts_list(org_id))

    def delete(self, alert_id: str, org_id: str | None = None) -> bool:
        return self._gw.request(ops.alerts_delete(alert_id, org_id))


class Wallet(_Resource):
    def balance(self, org_id: str | None = None) -> WalletBalance:
        return self._gw.request(ops.wallet_balance(org_id))

    def transactions(self, limit: int = 50, cursor: str | None = None,
                     org_id: str | None = None) -> TransactionPage:
        return self._gw.request(ops.wallet_transactions(limit, cursor, org_id))

    def fund(self, amount_cents: int, method: Literal["card", "ach", "usdc"] = "card", *,
             idempotency_key: str | None = None, org_id: str | None = None) -> WalletFunding:
        """Add credits: ``card`` charges the saved default card (credited at once; 409
        ``no_payment_method``, 402 ``card_declined``), ``ach`` the saved bank account
        (``pending``), ``usdc`` answers deposit instructions. Sent with an ``Idempotency-Key``
        (``idempotency_key``, or a new one), so the client's retries never charge twice."""
        return self._gw.request(ops.wallet_fund(amount_cents, method,
                                                idempotency_key or new_idempotency_key(), org_id))

    def connect_message(self, chain: ops.WalletChain, address: str, org_id: str | None = None) -> ConnectMessage:
        """The single-use message the wallet at ``address`` signs to be connected (``connect``)."""
        return self._gw.request(ops.wallet_connect_message(chain, address, org_id))

    def connect(self, chain: ops.WalletChain, address: str, signature: str, nonce: str | None = None,
                org_id: str | None = None) -> ConnectedWallet:
        """Connect the wallet that signed ``connect_message``'s message (EVM: 0x-hex
        ``personal_sign``; Solana: base58 ed25519); it replaces the connected one, and its
        USDC deposits fund the balance. A live key only; not retried after a lost answer
        (the message is single use: ``wallet.balance()`` shows whether it was connected)."""
        return self._gw.request(ops.wallet_connect(chain, address, signature, nonce, org_id))


class Pay(_Resource):
    def checkout(self, amount_cents: int, product: str | None = None,
                 return_url: str | None = None, save_method: bool = False, *,
                 idempotency_key: str | None = None, org_id: str | None = None) -> Checkout:
        """Start a hosted checkout; send the user to ``.url``. ``save_method``: the card paid
        with is saved and made the default once the payment is credited (auto top-up and
        funding charge it). Sent with an ``Idempotency-Key`` (``idempotency_key``, or a new
        one), so the client's retries of a lost answer start no second checkout."""
        return self._gw.request(ops.pay_checkout(amount_cents, product, return_url,
                                                 idempotency_key or new_idempotency_key(), save_method, org_id))

    def history(self, org_id: str | None = None) -> list[Payment]:
        """The last 50 payments, newest first."""
        return self._gw.request(ops.pay_history(org_id))

    def get_checkout(self, payment_id: str, org_id: str | None = None) -> CheckoutState:
        """Resume a checkout: its status, and its ``url`` while it can still be paid."""
        return self._gw.request(ops.checkout_get(payment_id, org_id))

    def cancel_checkout(self, payment_id: str, org_id: str | None = None) -> Payment:
        """Cancel a pending checkout (nothing was charged); ``Conflict``
        ``checkout_not_cancelable`` once paid or no longer pending. Not retried after a lost
        answer (``get_checkout`` shows whether it was canceled)."""
        return self._gw.request(ops.checkout_cancel(payment_id, org_id))


class Receipts(_Resource):
    def keys(self) -> list[ReceiptKey]:
        return self._gw.request(ops.receipt_keys())

    def verify(self, response: CallResult | Mapping[str, Any]) -> bool:
        """Verify a call result (or a saved call response dict); raises ReceiptInvalid."""
        data = response.as_response() if isinstance(response, CallResult) else response
        return self._gw._verify(data)


class Agents(_Resource):
    def register(self, name: str, pubkey: str, webhook: str | None = None,
                 org_id: str | None = None) -> Agent:
        """Register an agent (``pubkey`` = ``ed25519:<base58>``, see ``agent_pubkey``)."""
        return self._gw.request(ops.agent_register(name, pubkey, webhook, org_id))

    def fund(self, agent_id: str, amount_cents: int, idempotency_key: str | None = None,
             org_id: str | None = None) -> Funding:
        """Move ``amount_cents`` from this account's balance (with ``org_id``, the
        organisation's) to the agent's, once per Idempotency-Key."""
        return self._gw.request(ops.agent_fund(agent_id, amount_cents,
                                               idempotency_key or new_idempotency_key(), org_id))

    def disable(self, agent_id: str, org_id: str | None = None) -> AgentDisabled:
        """Disable an agent: its sessions stop, it can no longer sign in, and its balance
        comes back to this account (``returned_micros``). Cannot be undone."""
        return self._gw.request(ops.agent_disable(agent_id, org_id))

    def usage(self, agent_id: str) -> AgentUsage:
        """The agent's calls and spend this calendar month (UTC): totals, by module and model
        (its owner's key, or its own session)."""
        return self._gw.request(ops.agent_usage(agent_id))

    def earnings(self, agent_id: str) -> Earnings:
        """The earnings of the modules the agent owns (its owner's key, or its own session)."""
        return self._gw.request(ops.agent_earnings(agent_id))

    def leaderboard(self, limit: int = 10) -> Leaderboard:
        """Top ``limit`` agents (1–100) by earnings this ISO week (UTC)."""
        return self._gw.request(ops.agent_leaderboard(limit))


class Builds(_Resource):
    def submit(self, slug: str, price_cents: int, actions: list[str], webhook: str | None = None,
               description: str | None = None) -> Build:
        """Submit a module the agent built for review (an ``AgentSession`` only). ``webhook``
        (default: the agent's) receives the approved module's calls, signed with the
        answer's ``webhook_secret`` (shown once). Not retried after a lost answer: a
        second submission of the slug is 409 while the first is pending review."""
        return self._gw.request(ops.build_submit(slug, price_cents, actions, webhook, description))

    def list(self) -> list[Build]:
        """Submissions, newest first: an agent's own, or an owner key's of all its agents."""
        return self._gw.request(ops.builds_list())


class Invoices(_Resource):
    def list(self, limit: int = 50, cursor: str | None = None, org_id: str | None = None) -> InvoicePage:
        """Invoices of the key's mode, newest first (credit notes ride on the invoice they
        credit); pass ``cursor=page.next_cursor`` for the next page."""
        return self._gw.request(ops.invoices_list(limit, cursor, org_id))

    def get(self, invoice_id: str, org_id: str | None = None) -> Invoice:
        """One invoice or credit note, with its issued ``document``."""
        return self._gw.request(ops.invoice_get(invoice_id, org_id))

    def pdf(self, invoice_id: str, path: str, org_id: str | None = None) -> str:
        """Stream the PDF of an invoice or credit note into ``path``; returns ``path``."""
        return self._gw.request(ops.invoice_pdf(invoice_id, path, org_id))

    def billing_details(self, org_id: str | None = None) -> BillingDetails:
        """The billing name, address, country and tax id printed on the next invoices."""
        return self._gw.request(ops.billing_details(org_id))

    def set_billing_details(self, *, org_id: str | None = None,
                            **details: Unpack[ops.BillingDetailsSpec]) -> BillingDetails:
        """Set the details printed on invoices issued from now on (those issued keep theirs);
        a field not given is cleared, none given clears them all."""
        return self._gw.request(ops.billing_details_set(details, org_id))


class PaymentMethods(_Resource):
    def list(self, org_id: str | None = None) -> list[PaymentMethod]:
        """The saved methods, oldest first; ``.default`` marks the one that is charged."""
        return self._gw.request(ops.methods_list(org_id))

    def save(self, payment_method_id: str, org_id: str | None = None) -> PaymentMethod:
        """Save a processor method (``pm_…``) as the default (404 unknown id, 409 unusable)."""
        return self._gw.request(ops.method_save(payment_method_id, org_id))

    def set_default(self, payment_method_id: str, org_id: str | None = None) -> PaymentMethod:
        """Make a saved method the default again (wallet funding and auto top-up charge it)."""
        return self._gw.request(ops.method_set_default(payment_method_id, org_id))

    def delete(self, payment_method_id: str, org_id: str | None = None) -> bool:
        """Remove a saved method; removing the default leaves none until another is made it."""
        return self._gw.request(ops.method_delete(payment_method_id, org_id))


class AutoTopupRule(_Resource):
    def get(self, org_id: str | None = None) -> AutoTopup:
        """The rule, its card, this month's total and the last runs (``NotFound``: none set)."""
        return self._gw.request(ops.auto_topup_get(org_id))

    def set(self, threshold_cents: int, amount_cents: int, monthly_cap_cents: int,
            org_id: str | None = None) -> AutoTopup:
        """Replace the rule and turn it on: under ``threshold_cents`` one top-up of
        ``amount_cents`` is charged to the default card, at most ``monthly_cap_cents`` a
        month (``Conflict`` ``no_payment_method`` without a saved card)."""
        return self._gw.request(ops.auto_topup_set(threshold_cents, amount_cents, monthly_cap_cents, org_id))

    def disable(self, org_id: str | None = None) -> bool:
        """Turn auto top-up off and delete the rule (``NotFound``: none set)."""
        return self._gw.request(ops.auto_topup_delete(org_id))


class Payouts(_Resource):
    def list(self, org_id: str | None = None) -> PayoutList:
        """The payouts (newest first), the destination, what is owed and the minimum."""
        return self._gw.request(ops.payouts_list(org_id))

    def create(self, org_id: str | None = None, *, idempotency_key: str | None = None) -> Payout:
        """Pay out now what is owed (or retry a failed payout at once). Sent with an
        ``Idempotency-Key`` (``idempotency_key``, or a new one), so the client's retries of
        a lost answer start no second payout."""
        return self._gw.request(ops.payout_create(org_id, idempotency_key or new_idempotency_key()))

    def destination(self, org_id: str | None = None) -> PayoutDestination:
        """The payout destination (``NotFound``: none; earnings are kept as balance)."""
        return self._gw.request(ops.payout_destination(org_id))

    def set_stripe_destination(self, account: str, org_id: str | None = None) -> PayoutDestination:
        """Pay settled earnings out to a Stripe Connect account (``acct_…``)."""
        return self._gw.request(ops.payout_destination_stripe(account, org_id))

    def set_usdc_destination(self, chain: ops.Chain, address: str, org_id: str | None = None) -> PayoutDestination:
        """Pay settled earnings out in USDC to ``address`` on ``chain``."""
        return self._gw.request(ops.payout_destination_usdc(chain, address, org_id))

    def remove_destination(self, org_id: str | None = None) -> DestinationRemoved:
        """Keep earnings as balance again: what was owed moves to the balance."""
        return self._gw.request(ops.payout_destination_delete(org_id))

    def earnings(self, org_id: str | None = None) -> Earnings:
        """Earnings of this account's own catalog modules, with what is ``owed`` to the
        destination (an agent's: ``agents.earnings``)."""
        return self._gw.request(ops.owner_earnings(org_id))


class Orgs(_Resource):
    """Organisations: one balance shared by members with roles. Act on an organisation's
    keys, usage, wallet, … by passing its ``id`` as ``org_id`` to those methods."""

    def create(self, name: str) -> Org:
        """Create an organisation (balance 0); you are its owner. Not retried after a lost
        answer (``list`` shows whether it was made)."""
        return self._gw.request(ops.orgs_create(name))

    def get(self, org_id: str) -> Org:
        return self._gw.request(ops.org_get(org_id))

    def members(self, org_id: str) -> list[Member]:
        """The members with their roles and budgets (any member may read)."""
        return self._gw.request(ops.org_members(org_id))

    def update_member(self, org_id: str, member_id: str, **changes: Unpack[ops.MemberChanges]) -> Member:
        """Change a member's ``role`` and/or ``monthly_budget_cents`` (None removes it);
        ``.disabled_agents`` / ``.revoked_invites``: what a lesser role took away."""
        return self._gw.request(ops.org_member_update(org_id, member_id, changes))

    def remove_member(self, org_id: str, member_id: str) -> MemberRemoved:
        """Remove a member, or leave (your own account id); their organisation keys are revoked."""
        return self._gw.request(ops.org_member_remove(org_id, member_id))

    def invite(self, org_id: str, email: str, role: ops.Role) -> Invite:
        """E-mail a single-use link (7 days) giving ``role``; a new invitation to the same
        address replaces the pending one. Not retried after a lost answer."""
        return self._gw.request(ops.org_invite(org_id, email, role))

    def invites(self, org_id: str) -> list[Invite]:
        """The pending invitations, oldest first (owners and admins)."""
        return self._gw.request(ops.org_invites(org_id))

    def revoke_invite(self, org_id: str, invite_id: str) -> Invite:
        """Revoke an invitation: its link stops working (idempotent)."""
        return self._gw.request(ops.org_invite_revoke(org_id, invite_id))

    def accept_invite(self, token: str) -> Org:
        """Accept an invitation (the token of its link) with this client's credential: the
        invitation's address must be this account's. Answers the organisation."""
        return self._gw.request(ops.org_invite_accept(token))

    def audit(self, org_id: str, limit: int = 50, cursor: str | None = None) -> AuditPage:
        """The audit log, newest first (owners and admins); pass ``cursor=page.next_cursor``."""
        return self._gw.request(ops.org_audit(org_id, limit, cursor))

    def audit_export(self, org_id: str, path: str) -> str:
        """Stream every audit entry, newest first, as CSV (with a header row) into ``path``."""
        return self._gw.request(ops.org_audit_export(org_id, path))

    def list(self) -> list[Org]:
        """Your organisations with your role in each (an organisation key: its own)."""
        return self._gw.request(ops.orgs_list())


class ProviderKeysResource(_Resource):
    """Bring your own key: the account's own chat-provider keys (a live key only)."""

    def list(self) -> ProviderKeys:
        """The keys (``.provider_keys``, prefix only) and ``.byok_only`` ``.byok_fallback``."""
        return self._gw.request(ops.provider_keys_list())

    def add(self, provider: str, api_key: str) -> ProviderKey:
        """Add a key for a chat-catalog ``provider``: checked with the provider first
        (``InvalidRequest`` ``provider_key_invalid`` if refused), then stored encrypted."""
        return self._gw.request(ops.provider_key_add(provider, api_key))

    def delete(self, key_id: str) -> bool:
        return self._gw.request(ops.provider_key_delete(key_id))

    def update_settings(self, byok_only: bool | None = None, byok_fallback: bool | None = None) -> ByokSettings:
        """Change the settings given (at least one)."""
        return self._gw.request(ops.byok_settings_update(byok_only, byok_fallback))


class Gateway:
    """Synchronous client. ``api_key`` / ``base_url`` default to ``GATEWAY_API_KEY`` /
    ``GATEWAY_BASE_URL``. With ``x402_account`` (an ``eth_account`` account) a 402 on a
    module call is paid with x402 and the call retried once; otherwise ``PaymentRequired``
    is raised. ``timeout``: seconds for every request; by default 30, and a module call's
    answer is waited for up to 130 (an action may run 120 s before the gateway answers)."""

    def __init__(self, api_key: str | None = None, base_url: str | None = None, *,
                 timeout: float | None = None, max_retries: int = 2,
                 retry: RetryPolicy | None = None, x402_account: Any = None,
                 chat_base_url: str | None = None, http_client: httpx.Client | None = None) -> None:
        self.base_url = resolve_base_url(base_url)
        self.api_key = resolve_api_key(api_key)
        self.chat_base_url = chat_base_url
        self.retry = retry or RetryPolicy(max_retries=max_retries)
        own_timeout, self._call_timeout = default_timeouts(timeout, http_client is None)
        self._http = http_client or httpx.Client(timeout=own_timeout)
        self._payer = SyncPayer(x402_account) if x402_account is not None else None
        self._public_keys: dict[str, str] = {}
        self.modules, self.keys, self.usage = Modules(self), Keys(self), Usage(self)
        self.alerts, self.wallet, self.pay = Alerts(self), Wallet(self), Pay(self)
        self.receipts, self.agents, self.builds = Receipts(self), Agents(self), Builds(self)
        self.invoices, self.payment_methods = Invoices(self), PaymentMethods(self)
        self.auto_topup, self.payouts = AutoTopupRule(self), Payouts(self)
        self.orgs, self.provider_keys = Orgs(self), ProviderKeysResource(self)

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- the surface ---------------------------------------------------------------
    def account(self) -> Account:
        return self.request(ops.account())

    def audit(self, limit: int = 50, cursor: str | None = None) -> AuditPage:
        """Your account's audit log, newest first (changes to its keys, payments, saved methods,
        auto top-up, payout destination, wallet and alerts); with an organisation key the
        organisation's (owners and admins). Pass ``cursor=page.next_cursor``. Needs
        ``account:read``."""
        return self.request(ops.audit(limit, cursor))

    def audit_export(self, path: str) -> str:
        """Stream every entry of your account's audit log, newest first, as CSV (with a header
        row) into ``path``; returns ``path``."""
        return self.request(ops.audit_export(path))

    def call(self, slug: str, /, action: str, *, idempotency_key: str | None = None,
             **params: Any) -> CallResult:
        """Call ``action`` of module ``slug`` (positional) with ``params`` as the body's other
        fields (a field named ``slug`` too; only ``idempotency_key`` is the client's).
        Retried only with the same Idempotency-Key (generated when not given)."""
        key = idempotency_key or new_idempotency_key()
        try:
            return self.request(ops.call(slug, action, params, key, self._verify))
        except PaymentRequired as exc:
            if self._payer is None or exc.code != "payment_required":
                raise
            paid = self._payer.headers_for(exc)
            return self.request(ops.call(slug, action, params, key, self._verify, paid))

    def chat_client(self, **kwargs: Any) -> openai.OpenAI:
        """An ``openai.OpenAI`` client for the chat host (``pip install 'gateway-client[openai]'``)."""
        from gateway_client._chat import chat_settings
        import openai

        return openai.OpenAI(**chat_settings(self.base_url, self.chat_base_url, self._token(), kwargs))

    # --- plumbing ------------------------------------------------------------------
    def _token(self) -> str | None:
        return self.api_key

    def _reauthenticate(self) -> bool:
        """Called on a 401; True when a fresh credential was obtained (retry once)."""
        return False

    def _send(self, op: Op[Any]) -> httpx.Response:
        headers = request_headers(op, self._token() if op.auth else None)
        req = self._http.build_request(op.method, self.base_url + op.path, json=op.json,
                                       params=op.params, headers=headers,
                                       timeout=request_timeout(op, self._call_timeout))
        response = self._http.send(req, stream=op.stream_to is not None)
        if op.stream_to is None:
            return response
        try:
            if response.is_success:
                with open(op.stream_to, "wb") as fh:
                    for chunk in response.iter_bytes():
                        fh.write(chunk)
            else:
                response.read()
        finally:
            response.close()
        return response

    def request(self, op: Op[T]) -> T:
        """Run one operation with retries; returns its parsed 2xx answer."""
        attempt, reauthed = 0, False
        while True:
            try:
                response = self._send(op)
            except httpx.TransportError as exc:
                delay = self.retry.delay(op, attempt, None, exc)
                if delay is None:
                    raise
            else:
                if response.status_code == 401 and op.auth and not reauthed and self._reauthenticate():
                    reauthed = True
                    continue
                delay = None if response.is_success else self.retry.delay(op, attempt, response)
                if delay is None:
                    raise_for_status(response)
                    return op.parse(response)
            time.sleep(delay)
            attempt += 1

    def _verify(self, response: Mapping[str, Any]) -> bool:
        kid = (response.get("receipt") or {}).get("kid")
        if kid not in self._public_keys:  # first use, or the gateway rotated its key
            self._public_keys = {k.kid: k.public_key for k in self.receipts.keys()}
        return receipts.verify(response, self._public_keys)

"""Typed results: one frozen dataclass per resource the gateway returns.

Every dataclass is built by ``parse`` from the answer's JSON: known fields become
attributes, fields a newer server adds (and this version does not know) stay readable
in ``raw``. Money is in integer cents as on the wire.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

T = TypeVar("T")


def parse(cls: type[T], data: Mapping[str, Any], **overrides: Any) -> T:
    """Build dataclass ``cls`` from ``data``: fields it names are taken (missing optional
    ones default), ``raw`` keeps the whole object; ``overrides`` replace parsed values."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {k: v for k, v in data.items() if k in names}
    if "raw" in names:
        kwargs["raw"] = dict(data)
    kwargs.update(overrides)
    return cls(**kwargs)


@dataclass(frozen=True)
class Account:
    id: str
    email: str | None
    plan: str
    balance_cents: int
    agent_id: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Action:
    name: str
    price_cents: int
    description: str = ""


@dataclass(frozen=True)
class Module:
    slug: str
    name: str
    actions: list[Action]
    description: str = ""
    owner: str = ""
    owner_agent_id: str | None = None
    source: str = "catalog"
    sandbox: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Module:
        return parse(cls, data, actions=[parse(Action, a) for a in data.get("actions") or []])


@dataclass(frozen=True)
class Key:
    """An API key as listed (never the secret). The spend-limit and expiry fields are
    ``None`` on servers that do not offer them."""

    id: str
    name: str
    prefix: str
    scopes: list[str]
    last_used_at: str | None = None
    spend_limit_cents: int | None = None
    spend_limit_period: str | None = None
    spent_cents: int | None = None
    expires_at: str | None = None
    org_id: str | None = None      # an organisation key: the organisation it spends
    member_id: str | None = None   # ... and the member who owns it
    allowed_models: list[str] | None = None   # controls: None = any / no limit
    allowed_modules: list[str] | None = None
    rpm_limit: int | None = None
    tpm_limit: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class KeyCreated(Key):
    """A new key; ``key`` is the full secret, returned at creation (or rotation) only."""

    key: str = ""


@dataclass(frozen=True)
class Receipt:
    """The signed receipt of a call (see ``CallResult.verify``)."""

    hash: str
    sig: str
    v: int = 1
    kid: str | None = None
    alg: str = "ed25519"
    ts: str | None = None
    account_id: str | None = None  # the account that paid (an organisation for an organisation key)
    action: str | None = None
    mode: str | None = None
    actor: str | None = None  # version 2: the credential that acted (API key or agent session id)
    actor_account_id: str | None = None  # version 2: the person behind it (an organisation key's member)


@dataclass(frozen=True)
class CallResult:
    """The answer of a module call. ``replayed`` is true when the gateway answered from its
    Idempotency-Key store (no second charge); ``payment`` is the x402 settlement when the
    call was paid with x402. ``verify()`` checks the receipt offline."""

    ok: bool
    module: str
    call_id: str
    cost_cents: int
    result: dict[str, Any]
    receipt: Receipt
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    idempotency_key: str | None = None
    replayed: bool = False
    payment: dict[str, Any] | None = None
    _verifier: Callable[[Mapping[str, Any]], bool] | None = field(
        default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], **extra: Any) -> CallResult:
        return parse(cls, data, receipt=parse(Receipt, data["receipt"]), **extra)

    def as_response(self) -> dict[str, Any]:
        """The call response as the gateway sent it (the fields the receipt signs are
        taken from the attributes, so a changed attribute fails verification)."""
        out = dict(self.raw)
        out.update(ok=self.ok, module=self.module, call_id=self.call_id,
                   cost_cents=self.cost_cents, result=self.result,
                   receipt=dataclasses.asdict(self.receipt))
        return out

    def verify(self) -> bool:
        """True when the receipt verifies against the gateway's published keys (fetched
        once per client, then cached); raises ``ReceiptInvalid`` otherwise."""
        if self._verifier is None:
            raise RuntimeError("this result is not bound to a client; use client.receipts.verify()")
        return self._verifier(self.as_response())


@dataclass(frozen=True)
class ReceiptKey:
    kid: str
    public_key: str
    active: bool
    alg: str = "ed25519"
    created_at: str | None = None


@dataclass(frozen=True)
class UsageCurrent:
    period_start: str
    period_end: str
    calls: int
    spend_cents: int
    plan_cents: int


@dataclass(frozen=True)
class ModuleUsage:
    slug: str
    calls: int
    spend_cents: int


@dataclass(frozen=True)
class DailyUsage:
    date: str
    calls: int
    spend_cents: int
    errors: int = 0


@dataclass(frozen=True)
class Alert:
    id: str
    name: str
    metric: str
    op: str
    threshold: float
    window: str
    channel: str
    target: str
    created_at: str
    secret: str | None = None
    status: str | None = None  # "active", or "pending_verification" until the target confirms
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class WalletBalance:
    credits_cents: int
    usdc: str
    chain: str | None = None
    address: str | None = None
    connected: bool = False


@dataclass(frozen=True)
class Transaction:
    id: str
    type: str
    kind: str
    amount_cents: int
    amount_micros: int
    created_at: str
    payment_id: str | None = None
    call_id: str | None = None


@dataclass(frozen=True)
class TransactionPage:
    transactions: list[Transaction]
    next_cursor: str | None = None


@dataclass(frozen=True)
class Checkout:
    url: str
    payment_id: str
    status: str
    expires_at: str


@dataclass(frozen=True)
class Payment:
    """One payment of ``pay.history()`` (card, ACH, USDC, x402). ``amount_cents`` is what
    was paid; ``refunded_cents`` and ``disputed_cents`` (withdrawn by a chargeback, not
    reinstated) were taken back since, so the credit it still gives is the amount less both."""

    id: str
    method: str
    status: str
    amount_cents: int
    created_at: str
    kind: str | None = None
    mode: str | None = None
    refunded_cents: int = 0
    disputed_cents: int = 0
    dispute_status: str | None = None
    product: str | None = None
    failure_code: str | None = None
    failure_message: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Agent:
    """A registered agent; ``webhook_secret`` is returned at registration only."""

    id: str
    name: str
    pubkey: str
    account_id: str | None = None
    webhook: str | None = None
    webhook_secret: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Funding:
    """The answer of funding an agent from its owner's balance."""

    agent_id: str | None = None
    amount_cents: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class AgentDisabled:
    """The answer of disabling an agent: its sessions revoked, its balance returned."""

    agent_id: str | None = None
    revoked_sessions: int | None = None
    returned_micros: int | None = None
    owner_balance_cents: int | None = None
    replayed: bool | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class InvoiceBrief:
    """An invoice or credit note in brief: a credit note as listed on the invoice it
    credits (``Invoice.credit_notes``; its own JSON, with ``document``, is
    ``invoices.get(note.id)``, its PDF ``invoices.pdf(note.id, …)``). ``number``: gap-free
    per series (``INV-000042``, ``CN-000003``; ``…-TEST-…`` in test mode). Money is decimal
    text (``total``) and integer micros (1 cent = 10,000)."""

    id: str
    number: str
    kind: str
    mode: str
    currency: str
    total_micros: int
    total: str
    issued_at: str
    pdf_url: str
    payment_id: str | None = None
    period: str | None = None


@dataclass(frozen=True)
class Invoice(InvoiceBrief):
    """An invoice or credit note as issued (numbered, never changed). ``kind``: ``payment``
    (one payment's prepaid credit), ``usage`` (a month's usage, ``period`` = ``YYYY-MM``) or
    ``credit_note`` (``credits_invoice_id`` names the invoice it credits). ``credit_notes``:
    the refunds of this invoice's payment; ``net_total`` = ``total`` less ``credited``.
    ``document`` (the full issued document: seller, buyer, lines) comes with ``invoices.get``
    only, None in a list."""

    credits_invoice_id: str | None = None
    credit_notes: list[InvoiceBrief] = field(default_factory=list)
    credited_micros: int = 0
    credited: str = "0.00"
    net_total_micros: int = 0
    net_total: str = "0.00"
    document: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Invoice:
        return parse(cls, data, credit_notes=[parse(InvoiceBrief, n) for n in data.get("credit_notes") or []])


@dataclass(frozen=True)
class InvoicePage:
    """One page of ``invoices.list``, newest first; ``next_cursor`` is None on the last."""

    invoices: list[Invoice]
    next_cursor: str | None = None


@dataclass(frozen=True)
class PaymentMethod:
    """A saved payment method (``type``: ``card`` or ``us_bank_account``). ``default`` is
    the one wallet funding and auto top-up charge (``payment_methods.list`` only; None in
    the answer of ``save`` and ``set_default``)."""

    payment_method_id: str | None
    type: str | None = None
    brand: str | None = None
    last4: str | None = None
    processor: str | None = None
    default: bool | None = None
    created_at: str | None = None


@dataclass(frozen=True)
class AutoTopupRun:
    """One run of auto top-up: ``status`` queued, processing, succeeded, pending, failed or
    skipped (``reason`` says why); ``payment_id`` is its payment in ``pay.history()``."""

    id: int
    status: str
    amount_cents: int
    due_at: str
    created_at: str
    updated_at: str
    reason: str | None = None
    payment_id: str | None = None


@dataclass(frozen=True)
class AutoTopup:
    """The auto top-up rule: under ``threshold_cents`` one top-up of ``amount_cents`` is
    charged to ``method`` (the default card; None: none, runs are skipped), at most
    ``monthly_cap_cents`` a month (``month_cents`` so far). ``enabled`` is False once
    failures disabled it (``disabled_reason``); ``runs``: the last 10, newest first.
    ``card_needs_authentication``: the card is known to need 3-D Secure, so its off-session
    top-ups fail (pay a checkout on-session, or save another card)."""

    threshold_cents: int
    amount_cents: int
    monthly_cap_cents: int
    enabled: bool
    failures: int = 0
    disabled_reason: str | None = None
    month_cents: int = 0
    method: PaymentMethod | None = None
    runs: list[AutoTopupRun] = field(default_factory=list)
    card_needs_authentication: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AutoTopup:
        method = data.get("method")
        return parse(cls, data, method=parse(PaymentMethod, method) if method else None,
                     runs=[parse(AutoTopupRun, r) for r in data.get("runs") or []])


@dataclass(frozen=True)
class PayoutDestination:
    """Where settled earnings are paid out: ``kind`` ``stripe_connect`` (``account``) or
    ``usdc`` (``chain``, ``address``)."""

    kind: str
    account: str | None = None
    chain: str | None = None
    address: str | None = None
    updated_at: str | None = None


@dataclass(frozen=True)
class Payout:
    """One payout: ``status`` pending, sending, paid, failed (still owed; retried at
    ``next_attempt_at``) or canceled (the amount went to the balance)."""

    id: str
    status: str
    amount_cents: int
    amount_micros: int
    kind: str
    destination: str
    attempts: int
    created_at: str
    chain: str | None = None
    processor_ref: str | None = None
    failure_code: str | None = None
    failure_message: str | None = None
    next_attempt_at: str | None = None
    paid_at: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class PayoutList:
    """``payouts.list()``: the payouts (newest first, at most 100), the destination (None:
    earnings are kept as balance), what is owed to it and the payout minimum."""

    payouts: list[Payout]
    destination: PayoutDestination | None
    minimum_cents: int
    owed_cents: int
    owed_micros: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PayoutList:
        dest = data.get("destination")
        return parse(cls, data, payouts=[parse(Payout, p) for p in data["payouts"]],
                     destination=parse(PayoutDestination, dest) if dest else None)


@dataclass(frozen=True)
class DestinationRemoved:
    """The answer of removing the payout destination: what was owed to it is now balance
    (``moved_to_balance_cents``); ``kind`` None: earnings are kept as balance."""

    moved_to_balance_cents: int
    kind: str | None = None


@dataclass(frozen=True)
class Build:
    """A module an agent submitted for review: ``status`` pending_review, approved or
    rejected (``review_notes``). ``webhook_secret`` (``whsec_…``, with which the gateway
    signs the calls it forwards to ``webhook``) is in the answer of ``builds.submit`` only."""

    id: str
    agent_id: str
    slug: str
    status: str
    price_cents: int
    actions: list[str]
    webhook: str
    description: str
    created_at: str
    review_notes: str | None = None
    reviewed_at: str | None = None
    webhook_secret: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Statement:
    """One monthly settlement of earnings (``month`` = ``YYYY-MM``): ``amount`` reached the
    balance (or the payout destination): ``earned`` less ``carry_over_repaid``."""

    id: str
    month: str
    amount_cents: int
    amount_micros: int
    earned_cents: int
    earned_micros: int
    carry_over_repaid_cents: int
    carry_over_repaid_micros: int
    settled_at: str


@dataclass(frozen=True)
class Earnings:
    """Earnings of the modules an agent (``agents.earnings``: ``agent_id``) or an account
    (``payouts.earnings``: ``account_id``, and ``owed`` to its payout destination) owns,
    ``share_pct`` of their revenue: ``accrued`` (not settled yet; negative after a refund of
    a settled month's call), ``settled`` and ``lifetime``, in cents (floors) and micros
    (exact), with the 12 most recent ``settlements``."""

    share_pct: int
    accrued_cents: int
    accrued_micros: int
    settled_cents: int
    settled_micros: int
    lifetime_cents: int
    lifetime_micros: int
    settlements: list[Statement] = field(default_factory=list)
    agent_id: str | None = None
    account_id: str | None = None
    owed_cents: int | None = None
    owed_micros: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Earnings:
        return parse(cls, data, settlements=[parse(Statement, s) for s in data.get("settlements") or []])


@dataclass(frozen=True)
class LeaderboardEntry:
    rank: int
    agent_id: str
    name: str
    earnings_cents: int


@dataclass(frozen=True)
class Leaderboard:
    """Top agents by earnings in the ISO week [``week_start``, ``week_end``) (UTC)."""

    week_start: str
    week_end: str
    limit: int
    entries: list[LeaderboardEntry]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Leaderboard:
        return parse(cls, data, entries=[parse(LeaderboardEntry, e) for e in data["entries"]])


@dataclass(frozen=True)
class WalletFunding:
    """The answer of ``wallet.fund``: ``status`` ``succeeded`` (card: credited at once) or
    ``pending`` (ach until it settles; usdc: ``deposit`` holds the instructions)."""

    payment_id: str
    method: str
    status: str
    amount_cents: int
    balance_cents: int
    deposit: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class BillingDetails:
    """The buyer printed on invoices issued from now on (``country``: ISO 3166-1 alpha-2)."""

    name: str | None = None
    address: str | None = None
    country: str | None = None
    tax_id: str | None = None
    updated_at: str | None = None


@dataclass(frozen=True)
class Org:
    """An organisation the caller belongs to: ``role`` is the caller's there, and
    ``balance_cents`` its balance in the credential's mode. Pass ``id`` as ``org_id``."""

    id: str
    name: str
    plan: str
    balance_cents: int
    role: str
    created_at: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Member:
    """A member of an organisation; ``monthly_budget_cents`` None means no budget."""

    member_id: str
    email: str | None
    role: str
    created_at: str
    monthly_budget_cents: int | None = None
    spent_this_month_cents: int = 0
    disabled_agents: list[str] = field(default_factory=list)  # ``orgs.update_member``: what
    revoked_invites: list[str] = field(default_factory=list)  # the new role took away
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class MemberRemoved:
    """The answer of ``orgs.remove_member``: the member's organisation keys, agents and
    pending invitations went with them."""

    removed: bool
    member_id: str
    revoked_keys: list[str]
    disabled_agents: list[str]
    revoked_invites: list[str]


@dataclass(frozen=True)
class Invite:
    """An invitation to an organisation (its single-use link goes by e-mail only)."""

    id: str
    org_id: str
    email: str
    role: str
    invited_by: str
    created_at: str
    expires_at: str
    accepted_at: str | None = None
    revoked_at: str | None = None


@dataclass(frozen=True)
class AuditEntry:
    """One change: who (``actor_account_id``, ``credential_id``), what (``action``), on
    what (``target``), ``before`` and ``after``, and the request's id and IP."""

    id: str
    created_at: str
    action: str
    actor_account_id: str | None = None
    credential_id: str | None = None
    target: str | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    request_id: str | None = None
    ip: str | None = None


@dataclass(frozen=True)
class AuditPage:
    entries: list[AuditEntry]
    next_cursor: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AuditPage:
        return parse(cls, data, entries=[parse(AuditEntry, e) for e in data["entries"]])


@dataclass(frozen=True)
class ProviderKey:
    """One of the account's own chat-provider keys (BYOK): only its ``prefix`` is shown."""

    id: str
    provider: str
    prefix: str
    created_at: str
    checked_at: str | None = None


@dataclass(frozen=True)
class ByokSettings:
    """``byok_only``: route only to the account's own keys; ``byok_fallback``: own keys
    failing, fail over to the platform's keys (charged the model price)."""

    byok_only: bool
    byok_fallback: bool


@dataclass(frozen=True)
class ProviderKeys(ByokSettings):
    """The account's provider keys with its BYOK settings."""

    provider_keys: list[ProviderKey] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProviderKeys:
        return parse(cls, data, provider_keys=[parse(ProviderKey, k) for k in data.get("provider_keys") or []])


@dataclass(frozen=True)
class AlertEvent:
    """One firing of an alert (``value`` met the condition in ``period``) and its delivery:
    ``delivery_status`` pending (retried; ``next_attempt_at``), delivered or failed."""

    id: str
    alert_id: str
    name: str
    metric: str
    op: str
    threshold: float
    value: float
    window: str
    period: str
    channel: str
    fired_at: str
    delivery_status: str
    attempts: int = 0
    delivered_at: str | None = None
    next_attempt_at: str | None = None
    last_error: str | None = None


@dataclass(frozen=True)
class ModelUsage:
    """Chat completions of one model: ``spend_micros`` is exact (``spend_cents`` floors)."""

    model: str
    calls: int
    spend_cents: int
    spend_micros: int = 0


@dataclass(frozen=True)
class AgentUsage:
    """An agent's calls in [``period_start``, ``period_end``): totals, by module and by chat model."""

    agent_id: str
    period_start: str
    period_end: str
    calls: int
    errors: int
    spend_cents: int
    by_module: list[ModuleUsage] = field(default_factory=list)
    by_model: list[ModelUsage] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AgentUsage:
        return parse(cls, data, by_module=[parse(ModuleUsage, m) for m in data.get("by_module") or []],
                     by_model=[parse(ModelUsage, m) for m in data.get("by_model") or []])


@dataclass(frozen=True)
class CheckoutState:
    """A checkout resumed: ``url`` while it can still be paid, None once paid, canceled,
    expired or its bank payment submitted."""

    payment_id: str
    status: str
    url: str | None = None
    expires_at: str | None = None


@dataclass(frozen=True)
class ConnectMessage:
    """The single-use message to sign to connect a wallet (EVM: EIP-191 ``personal_sign``;
    Solana: ed25519 over its UTF-8 bytes), until ``expires_at``."""

    message: str
    nonce: str
    expires_at: str
    chain: str
    address: str


@dataclass(frozen=True)
class ConnectedWallet:
    id: str
    chain: str
    address: str
    connected_at: str
    connected: bool = True

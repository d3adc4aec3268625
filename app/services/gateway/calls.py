"""The module call path (SPEC endpoint 1): idempotency, charging, forwarding,
finalizing with a signed receipt, refunds, the 402 payment request and the sweep.

Charging scheme (one database transaction before forwarding; on PostgreSQL it is ONE
autocommit statement, ``gw_open_calls`` via ``money.charging``, and the finalize is one
autocommit ``gw_finalize_calls`` statement, by default written by the process's finalize
writer right after the answer: ``charging.DeferredFinalizer``):
  idempotency record (``in_flight``) + the key's spend-limit reserve + conditional ledger
  debit (customer −P; platform revenue +P, or +0.7P revenue / +0.3P ``earnings:<owner
  agent>``) + the ``pending`` call row → COMMIT → forward →
  * provider 2xx/4xx: call ``succeeded`` (4xx: ``ok=false``, still charged), receipt
    stored, idempotency record ``done`` with the exact response body → COMMIT.
  * provider failure: refund (``money.refunds``) = the reversing ledger posting (ref
    ``call_refund:<id>``), call ``refunded``, idempotency record deleted (the key may be
    retried) → COMMIT → 502/504.
  Usage is not written on this path: it is read from the call log (``billing.usage_log``).
  The provider is called between the two units of work (``platform/uow.py``), with no
  transaction open. A process dying between the two commits leaves a ``pending`` call;
  the sweep refunds it after ``deadline_at`` (timeout + CALL_SWEEP_MARGIN_SECONDS).
  ``pending → refunded`` is a conditional UPDATE and the refund posting has a unique
  ledger ``ref``, so a call is refunded at most once whoever gets there first.
x402 (an ``X-Payment`` header and a balance that cannot cover the price): the open is
refused (nothing written), ``x402.accept`` verifies, reserves (own unit of work) and settles
the payment (facilitator over HTTP, no transaction open), ``x402.book`` credits it to the
balance (own unit of work), and the call is opened again by the same ``gw_open_calls``:
one open path for every call (``open_call``).
Test mode (``svc_test_``): the sandbox URL, no ledger movement, records/usage/receipt
marked ``test``; ``cost_cents`` shows the price that live mode would charge.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import orjson
from flask import current_app

from app.services.accounts import key_controls
from app.errors import DomainError, InvalidRequest, PaymentRequired, ProviderTimeout, UpstreamError
from app.ids import new_id
from app.models.base import utcnow
from app import telemetry
from app.services.money import spend
from app.services.gateway import catalog
from app.services.money import charging
from app.services.money import ledger
from app.services.gateway import receipts
from app.services.gateway import upstream
from app.services.billing import paywall, x402
from app.services.platform import http
from app.services.platform.uow import unit_of_work
from app.services.platform.idempotency import (IdempotencyKeyInUse, IdempotencyKeyReused,  # noqa: F401
                                               replay_or_conflict as _replay_or_conflict)
from app.services.money.refunds import purge_idempotency, refund, sweep_pending  # noqa: F401
from app.services.money.revenue_share import call_legs as _legs


@dataclass(frozen=True)
class CallResult:
    body: bytes       # the exact JSON response body
    replayed: bool    # an Idempotency-Key replay (no charge, no forwarding)
    headers: dict = field(default_factory=dict)  # e.g. PAYMENT-RESPONSE of an x402-paid call


# --- 402 and the X-Payment seam ------------------------------------------------------

def _call_path(slug: str | None) -> str:
    return f"/v1/module/{slug}/call" if slug else "/v1/module"


def _resource_url(slug: str | None) -> str:
    return paywall.resource_url(_call_path(slug))


def _description(slug: str | None) -> str:
    """The resource description of a call's x402 request (the 402 and a refusal's fresh one)."""
    return f"Call of module {slug}" if slug else "Module call"


def _extensions(slug: str | None, action: str | None, price_cents: int) -> dict | None:
    """The x402 Bazaar metadata of the action's call (``discovery.module_call_extension``)."""
    if not slug or not action:
        return None
    from app.services.gateway.discovery import module_call_extension

    return module_call_extension(slug, action, price_cents)


# How the 402's message tells an HTTP caller to pay by x402 (the MCP door says its own way).
X402_RETRY = "retry the call with an x402 payment in a PAYMENT-SIGNATURE header (X-Payment for x402 v1)"


def payment_required(price_cents: int, slug: str | None = None, action: str | None = None) -> PaymentRequired:
    """402 for a call whose price the balance cannot cover (``paywall.payment_required``,
    with the action's Bazaar metadata); the call may be retried with an x402 payment header."""
    return paywall.payment_required(
        price_cents, subject="This call", cost=f"{int(price_cents)} cent{'' if int(price_cents) == 1 else 's'}",
        alternative=None, x402_retry=X402_RETRY,
        path=_call_path(slug),
        description=_description(slug),
        extensions=_extensions(slug, action, price_cents))


def fund_from_payment(payment: str, *, account_id: str, price_micros: int,
                      mode: str, slug: str | None = None, action: str | None = None) -> "x402.X402Payment":
    """Steps 1 and 2 of paying this call from an ``X-Payment`` / ``PAYMENT-SIGNATURE``
    header, with no transaction open (``x402.accept``).

    Called only when the balance cannot cover ``price_micros``: verifies the payment
    (EIP-3009 signature, amount ≥ price, recipient X402_PAY_TO, validity, network, asset),
    reserves the authorization (single use, its own unit of work) and settles it
    (facilitator or sandbox). The caller books the credit (``x402.book``) in the unit of
    work that debits the call. Raises 400 ``invalid_payment`` (undecodable) or 402
    ``payment_invalid`` (refused; with ``reason`` and a fresh ``PAYMENT-REQUIRED``)."""
    return x402.accept(payment, account_id=account_id, price_micros=price_micros, mode=mode,
                       resource_url=_resource_url(slug), description=_description(slug),
                       extensions=_extensions(slug, action, -(-int(price_micros) // ledger.MICROS_PER_CENT)))


# --- helpers -------------------------------------------------------------------------

def request_hash(slug: str, mode: str, body: dict) -> str:
    canon = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(f"{slug}\n{mode}\n".encode() + canon).hexdigest()


# --- the call --------------------------------------------------------------------------

def call(*, account_id: str, mode: str, slug: str, body: dict, idempotency_key: str | None = None,
         payment: str | None = None, request_id: str | None = None, key_id: str | None = None,
         actor: str | None = None, controls: key_controls.KeyControls | None = None,
         actor_account: str | None = None) -> CallResult:
    """Perform one metered module call (see the module docstring for the scheme); ``key_id``:
    the API key whose spend limit (and member budget) applies (``app.services.money.spend``);
    ``account_id`` pays, ``actor`` (the credential's id) is who acted, ``actor_account`` the
    person behind it (an organisation key's member; default: ``account_id``): all are
    recorded, and the receipt names them. ``controls``:
    the key's allow-list of modules (403 ``module_not_allowed``) and rpm limit (429)."""
    key_controls.check_module(controls, slug)
    key_controls.count_request(controls)
    cfg = current_app.config
    mod = catalog.get_module(slug)
    act = catalog.get_action(mod, body.get("action"))
    test = mode == "test"
    base = mod.sandbox_url if test else mod.upstream_url
    if not base:
        raise InvalidRequest(f"Module '{slug}' has no sandbox; call it with a live key.")
    url = base + act.path if act.path != "/" else base
    if http.precheck(url, allow_private_hosts=cfg["ALLOW_PRIVATE_URLS"]) is not None:
        raise UpstreamError("The module's upstream address is not allowed.")
    if idempotency_key is not None and not 0 < len(idempotency_key) <= 128:
        raise InvalidRequest("Idempotency-Key: must be 1 to 128 characters.")
    paid: list = []
    with telemetry.span("call.open"):
        opened = open_call(account_id=account_id, mode=mode, mod=mod, act=act, body=body,
                           idempotency_key=idempotency_key, payment=payment, paid_out=paid, key_id=key_id,
                           actor=actor)
    if isinstance(opened, CallResult):
        return opened
    call_id = opened
    paid_headers = x402.response_headers(paid[0]) if paid else {}
    try:
        body = _forward_and_finalize(call_id, cfg=cfg, mod=mod, act=act, url=url, body=body,
                                     request_id=request_id, mode=mode, account_id=account_id,
                                     idempotency_key=idempotency_key, actor=actor,
                                     actor_account=actor_account)
    except DomainError as err:
        # refunded (provider failure, late answer): a settled x402 payment stays in the
        # balance as credit, and the answer says it was taken (PAYMENT-RESPONSE)
        err.headers.update(paid_headers)
        raise
    return CallResult(body, False, paid_headers)


def _forward_and_finalize(call_id: str, *, cfg, mod, act, url: str, body: dict, request_id, mode: str,
                          account_id: str, idempotency_key, actor, actor_account) -> bytes:
    """Forward the opened call to the provider and finalize it (the response body), or
    refund it and raise (502/504, or whatever failed)."""
    slug = mod.slug
    try:
        headers, payload = upstream.build_request(
            auth=mod.provider_auth, body=body, call_id=call_id, request_id=request_id,
            mode=mode, production=cfg["PRODUCTION"])
        with telemetry.span("call.forward"):
            answer = upstream.forward(method=act.method, url=url, body=body, payload=payload,
                                      headers=headers, timeout=act.timeout_seconds,
                                      max_bytes=cfg["PROVIDER_MAX_RESPONSE_BYTES"],
                                      allow_private_hosts=cfg["ALLOW_PRIVATE_URLS"])
    except upstream.ProviderFailure as exc:
        refund(call_id, "provider_timeout" if exc.kind == "timeout" else "provider_error")
        if exc.kind == "timeout":
            raise ProviderTimeout(f"The provider did not answer within {act.timeout_seconds:g} s; "
                                  "the call was not charged.") from None
        raise UpstreamError(f"The provider failed ({exc.detail}); the call was not charged.") from None
    except upstream.ProviderMisconfigured:
        refund(call_id, "provider_error")
        raise UpstreamError("The gateway has no credentials for this provider; "
                            "the call was not charged.") from None
    except BaseException:
        refund(call_id, "provider_error")
        raise
    try:
        with telemetry.span("call.finalize"):  # receipt signature + the finalize statement
            body = _finalize(call_id, account_id, slug, act, mode, answer, idempotency_key,
                             actor, actor_account)
    except ProviderTimeout:
        raise
    except BaseException:
        # e.g. signing or the database failed: refund now if still pending (else the sweep will)
        try:
            refund(call_id, "internal_error")
        except Exception:
            pass
        raise
    return body


def open_call(*, account_id: str, mode: str, mod: catalog.ModuleSnap, act: catalog.ActionSnap,
              body: dict, idempotency_key: str | None = None,
              payment: str | None = None, paid_out: list | None = None,
              key_id: str | None = None, actor: str | None = None) -> str | CallResult:
    """The charging transaction: claim the Idempotency-Key, reserve the key's spend
    limit, debit, write the ``pending`` call, COMMIT (``money.charging.open_pg``: one
    ``gw_open_calls`` statement). Returns the new call id, or the stored response when the
    key was already used for this request (a replay).

    x402: when the balance cannot cover the price and a payment header came with the call,
    the payment is verified, reserved and settled with no transaction open
    (``fund_from_payment``), credited to the payer's balance in a unit of work of its own
    (``x402.book``, the engine's x402 booking), and the call is opened again the one way
    every call is opened. Should the balance be short again (a concurrent call spent the
    credit meanwhile), the answer is 402 and the credit stays in the balance: no money is
    lost, and the chat completion's x402 path works the same way."""
    slug = mod.slug
    req_hash = request_hash(slug, mode, body) if idempotency_key is not None else None
    price_micros = ledger.cents_to_micros(act.price_cents)
    charged = mode != "test" and price_micros > 0
    args = (account_id, mode, mod, act, idempotency_key, req_hash, price_micros, charged,
            key_id, actor)
    try:
        return _open_pg(*args, payment=payment)
    except _PaymentNeeded:
        pass
    paid = fund_from_payment(payment, account_id=account_id, price_micros=price_micros,
                             mode=mode, slug=slug, action=act.name)
    call_id = new_id("call")
    with unit_of_work():
        x402.book(paid, call_id=call_id)
    try:
        opened = _open_pg(*args, call_id=call_id)
    except DomainError as exc:
        exc.headers.update(x402.response_headers(paid))  # paid and credited: say so
        raise
    if paid_out is not None and not isinstance(opened, CallResult):
        paid_out.append(paid)
    return opened


_LATE = "The provider answered after the call's deadline; the call was refunded and not charged."


class _PaymentNeeded(Exception):
    """The balance cannot cover the call and an x402 payment header came with it."""


def _open_pg(account_id, mode, mod, act, idempotency_key, req_hash, price_micros, charged,
             key_id=None, actor=None, *, payment=None, call_id=None) -> str | CallResult:
    """``open_call`` on PostgreSQL: ONE autocommit ``gw_open_calls`` statement, possibly
    shared with other calls of this process (its commit does not wait for the WAL flush;
    why that is safe: docs/performance.md, "What a crash can lose"). A refusal leaves
    nothing of this call behind (the function checks first and reverts what the refused
    row wrote): 402, or
    ``_PaymentNeeded`` when the balance cannot cover the call and an x402 payment came
    with it. ``key_id``: the key whose spend limit applies (set only for such keys)."""
    call_id, res = charging.open_pg(
        account_id=account_id, mode=mode, mod=mod, act=act, idem_key=idempotency_key,
        req_hash=req_hash, price_micros=price_micros, charged=charged,
        legs=_legs(account_id, price_micros, mod.owner_agent_id) if charged else [],
        spend_key=key_id, actor=actor, call_id=call_id)
    if res.outcome == "insufficient":
        if payment:
            raise _PaymentNeeded()
        raise payment_required(act.price_cents, mod.slug, act.name)
    if res.outcome == "key_spend_limit":  # the refusal's details (rare path, reads only)
        with unit_of_work():
            raise spend.refusal(key_id, price_micros, utcnow())
    if res.outcome == "member_budget":
        with unit_of_work():
            raise spend.budget_refusal(key_id, price_micros, utcnow())
    if res.outcome == "existing":
        return CallResult(_replay_or_conflict(res.idem_hash, res.idem_status, res.idem_body,
                                              req_hash, account_id, idempotency_key).encode(), True)
    return call_id


def _finalize(call_id, account_id, slug, act, mode, answer, idempotency_key, actor=None,
              actor_account=None) -> bytes:
    receipt = receipts.sign(call_id=call_id, account_id=account_id, module=slug, action=act.name,
                            cost_cents=act.price_cents, result=answer.result, ok=answer.ok,
                            mode=mode, actor=actor, actor_account_id=actor_account)
    body = orjson.dumps({"ok": answer.ok, "module": slug, "call_id": call_id,
                         "cost_cents": act.price_cents, "result": answer.result,
                         "receipt": receipt})
    # one autocommit statement: the call and its key's stored response
    done = charging.finalize_pg(
        call_id=call_id, account_id=account_id, idem_key=idempotency_key, ok=answer.ok,
        provider_status=answer.status, receipt=receipt, finished_at=utcnow(),
        response_body=body.decode())
    if not done:
        raise ProviderTimeout(_LATE)
    return body

"""The one 402 ``payment_required`` builder (SPEC part 7), used by module calls and chat.

Headers: ``WWW-Authenticate: X402 realm="gateway", nonce="…"``, ``X-Price-Cents``,
``X-Nonce`` (random per response) and, when x402 is offered (``X402_PAY_TO`` and a
facilitator, ``x402.offered``), ``X-Pay-To`` (``X402_PAY_TO``) and x402's v2
``PAYMENT-REQUIRED``; otherwise neither is sent (never an empty ``X-Pay-To``) and the
message does not offer an ``X-Payment`` retry. Body: the error, a
message pointing to ``POST /api/wallet/fund`` (usable by keys with ``billing:write`` and
by agent sessions; an organisation key's names the organisation and, for a role that
cannot fund it, who can), and ``price_cents``, ``pay_to`` (null when x402 is off), ``nonce``,
``fund_endpoint`` plus x402's v1 payment request (``x402Version``, ``accepts``) when on.
Builds an exception only; it reads configuration and writes nothing.
"""
from __future__ import annotations

import secrets

from flask import current_app, g, has_app_context

from app.errors import PaymentRequired
from app.services.billing import x402

FUND_ENDPOINT = "POST /api/wallet/fund"


def _org_of_caller() -> tuple[str, str] | None:
    """(organisation id, member's role) when the request's credential is an organisation
    key, else None."""
    p = g.get("principal") if has_app_context() else None
    role = p.extra.get("org_role") if p is not None else None
    return (p.account_id, role) if role else None


def _whose_balance() -> str:
    org = _org_of_caller()
    return f"the balance of organisation {org[0]}" if org else "your balance"


def _fund_how() -> str:
    """``POST /api/wallet/fund``; for an organisation key whose role cannot fund, who can."""
    from app.services.orgs.roles import SCOPE_ROLES

    org = _org_of_caller()
    if org is None or org[1] in SCOPE_ROLES["billing:write"]:
        return FUND_ENDPOINT
    return f"{FUND_ENDPOINT} by an owner or billing member of the organisation (your role: {org[1]})"


def resource_url(path: str) -> str:
    """The absolute URL of ``path`` on this gateway (``BASE_URL``), named in x402 requests."""
    return current_app.config["BASE_URL"].rstrip("/") + path


def payment_required(price_cents: int, *, subject: str, cost: str, alternative: str | None, path: str,
                     description: str, headers: dict | None = None,
                     x402_retry: str | None = None, extensions: dict | None = None) -> PaymentRequired:
    """402 for ``subject`` costing ``cost`` (``price_cents`` rounded up to cents), which the
    balance cannot cover. The message names ``POST /api/wallet/fund``, ``alternative`` and,
    when x402 is offered, ``x402_retry`` (e.g. ``gateway.calls.X402_RETRY``);
    ``path``/``description`` name the resource in the x402 request, ``extensions`` its x402
    extensions (the Bazaar metadata, ``billing.bazaar``); ``headers`` are added."""
    cents = int(price_cents)
    nonce = "n_" + secrets.token_urlsafe(18)
    pay_to = current_app.config["X402_PAY_TO"] if x402.offered() else None  # None: x402 not offered
    others = [a for a in (alternative, x402_retry if pay_to else None) if a]
    msg = (f"{subject} costs {cost} and {_whose_balance()} cannot cover it. Add credits "
           f"with {_fund_how()}" + "".join(f" or {a}" for a in others) + ".")
    x402_body, x402_headers = x402.payment_required(cents, resource_url(path), description, error=msg,
                                                  extensions=extensions)
    return PaymentRequired(msg, headers={
        "WWW-Authenticate": f'X402 realm="gateway", nonce="{nonce}"',
        "X-Price-Cents": str(cents), **({"X-Pay-To": pay_to} if pay_to else {}), "X-Nonce": nonce,
        **x402_headers, **(headers or {}),
    }, extra={"price_cents": cents, "pay_to": pay_to, "nonce": nonce, "fund_endpoint": FUND_ENDPOINT,
              **x402_body})

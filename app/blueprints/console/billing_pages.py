"""Console pages: billing in the browser (issue 40 item 5), acting for the chosen payer
(``org_context``: the personal account or an organisation, whose role must allow
``billing:read`` to see and ``billing:write`` to change, as on the API).

Saved payment methods (save a sandbox test card, make one the default, remove one), paying
with the saved default method (once per rendered form: the form carries its own
idempotency key), a pending checkout resumed or canceled, a wallet connected by signing the
shown message (pasted, or sent by a browser wallet: ``wallet.js``), and auto top-up
settings. Every form calls the services the ``/api/pay`` and ``/api/wallet`` routes call;
no page sends the person to a raw API path."""
from __future__ import annotations

import secrets

from flask import abort, current_app, redirect, request, url_for
from marshmallow.validate import Range

from app.blueprints.console import bp, org_context, web
from app.blueprints.console.account_pages import dollars_to_cents
from app.blueprints.payments.autotopup_schemas import AutoTopupRequestSchema
from app.blueprints.wallets.schemas import ConnectMessageQuerySchema, WalletConnectSchema
from app.errors import DomainError
from app.models.base import utcnow
from app.services.billing import autotopup, checkouts, methods, payments, wallets
from app.services.billing.chains import CHAINS
from app.services.billing.processors import SANDBOX_METHODS, for_mode
from app.services.platform import idempotency

READ, WRITE = ("billing:read",), ("billing:write",)
NO_CARD = "No saved card yet: save one under “Saved payment methods” first."
NEEDS_3DS = ("This card asks for 3-D Secure authentication, which needs you present: top up through "
             "the checkout (“Top up”) with this card instead.")


def context() -> dict:
    """What the billing page shows besides the history: the saved default and every saved
    method, pending checkouts, auto top-up, the sandbox test cards, the wallet form's
    choices. A deployment without a processor for the mode (live without Stripe, or the
    sandbox turned off) still shows the page: the history and the wallet, and why paying
    is not offered."""
    payer, mode = org_context.payer_id(), web.mode()
    try:
        processor = for_mode(mode).name
    except DomainError as exc:
        processor, payments_off = None, exc.message
    else:
        payments_off = None
    ctx = {"method": None, "methods": [], "autotopup": None, "test_cards": {}, "payments_off": payments_off,
           "chains": CHAINS, "wallet_form": {}, "connect": None, "pay_key": "console-" + secrets.token_urlsafe(16),
           "can_pay": org_context.allows(*WRITE), "topup_form": None, "card_needs_3ds": False}
    if processor is not None:
        ctx.update(method=payments.saved_method(payer, mode), methods=methods.list_methods(payer, mode),
                   test_cards=dict(SANDBOX_METHODS) if processor == "sandbox" else {})
        try:
            ctx["autotopup"] = autotopup.view(payer, mode)
        except DomainError:  # none set
            pass
        # auto top-up charges off-session: a card known to need 3-D Secure fails there (warned)
        ctx["card_needs_3ds"] = autotopup.needs_authentication(payer, mode)
        ctx["autotopup_max_failures"] = current_app.config["AUTOTOPUP_MAX_FAILURES"]
    ctx["can_charge"] = ctx["can_pay"] and processor is not None
    return ctx


def _page(status: int = 200, **extra):
    from app.blueprints.console.money_pages import _billing_page

    return _billing_page(status, **extra)


def _fail(exc: DomainError, section: str, **extra):
    """A service's refusal on the billing page, next to the form it came from."""
    if exc.status == 403:
        return org_context.refused_page(exc)
    if exc.status == 404:
        abort(404)
    message = NO_CARD if exc.code == "no_payment_method" else \
        NEEDS_3DS if exc.extra.get("decline_code") == "authentication_required" else exc.message
    return _page(exc.status if exc.status in (400, 402, 409, 429) else 400, errors={section: message}, **extra)


def _done(message: str):
    return redirect(url_for("console.billing", done=message), code=303)


def _act(section: str, done: str, service, *args):
    """A form that only calls a service: the role's guard, ``service(payer, mode, *args)``,
    then the refusal next to the form of ``section`` or the redirect saying ``done``."""
    if (refused := org_context.guard(WRITE)):
        return refused
    try:
        service(org_context.payer_id(), web.mode(), *args)
    except DomainError as exc:
        return _fail(exc, section)
    return _done(done)


@bp.post("/billing/card")
def save_card():
    """Save a payment method and make it the default (the sandbox's test cards; the service
    of ``POST /api/pay/method``)."""
    if (refused := org_context.guard(WRITE)):
        return refused
    pm = request.form.get("payment_method_id") or ""
    if pm not in SANDBOX_METHODS or for_mode(web.mode()).name != "sandbox":
        return _page(400, errors={"card": "Choose one of the listed test cards."})
    try:
        payments.set_default_method(org_context.payer_id(), web.mode(), pm)
    except DomainError as exc:
        return _fail(exc, "card")
    return _done("card_saved")


@bp.post("/billing/methods/<pm_id>/default")
def default_method(pm_id: str):
    """Make a saved method the default again."""
    return _act("card", "default_set", methods.make_default, pm_id)


@bp.post("/billing/methods/<pm_id>/remove")
def remove_method(pm_id: str):
    """Remove a saved method (detached at the processor first)."""
    return _act("card", "method_removed", methods.remove, pm_id)


@bp.post("/billing/pay")
def pay_saved():
    """Pay with the saved default method (a card credits at once; a bank account when it
    settles). The form's own key makes a double submit pay once."""
    if (refused := org_context.guard(WRITE)):
        return refused
    payer, mode = org_context.payer_id(), web.mode()
    text = (request.form.get("pay_amount") or "").strip().removeprefix("$")
    cents = dollars_to_cents(text)
    if cents is None or cents < 100:
        return _page(400, errors={"pay": "Enter an amount in dollars, at least 1.00 (e.g. 10 or 25.50)."},
                     pay_amount=text)
    profile = payments.saved_method(payer, mode)
    method = "ach" if profile is not None and profile.payment_method_type == "us_bank_account" else "card"
    key = (request.form.get("pay_key") or "")[:128]
    req_hash = idempotency.request_hash("console pay", mode, {"amount_cents": cents, "payer": payer})
    try:
        if key and idempotency.claim(payer, key, req_hash) is not None:
            return _done("paid")  # this form was already paid
        try:
            payments.fund_with_saved_method(payer, mode, cents, method)
        except BaseException:
            if key:
                idempotency.release(payer, key)
            raise
        if key:
            idempotency.complete(payer, key, "paid")
    except DomainError as exc:
        return _fail(exc, "pay", pay_amount=text)
    return _done("paid" if method == "card" else "ach_started")


@bp.get("/billing/checkouts/<payment_id>/resume")
def resume_checkout(payment_id: str):
    """Back to a pending checkout's hosted page (or the billing page saying why not)."""
    if (refused := org_context.guard(WRITE)):
        return refused
    try:
        state = checkouts.resume(org_context.payer_id(), web.mode(), payment_id)
    except DomainError as exc:
        return _fail(exc, "checkout")
    if state["url"]:
        return redirect(state["url"], code=303)
    # still pending without a page: its time ran out (not marked expired yet), or it was paid and
    # the processor's confirmation is on its way
    said = f"is {state['status']}"
    if state["status"] == "pending":
        expired = state["expires_at"] is not None and state["expires_at"] <= utcnow()
        said = "has expired" if expired else "was paid; its confirmation is on its way,"
    return _page(409, errors={"checkout": f"This checkout {said} and can no longer be paid."})


@bp.post("/billing/checkouts/<payment_id>/cancel")
def cancel_checkout(payment_id: str):
    """Cancel a pending checkout (nothing was charged)."""
    return _act("checkout", "checkout_canceled", checkouts.cancel, payment_id)


@bp.post("/billing/wallet/message")
def wallet_message():
    """Step 1 of connecting a wallet: the message to sign (single use, short-lived)."""
    if (refused := org_context.guard(WRITE)):
        return refused
    form = {f: (request.form.get(f) or "").strip() for f in ("chain", "address")}
    body, errors = web.load_form(ConnectMessageQuerySchema(), form)
    if errors:
        return _page(400, errors={"wallet": " ".join(f"{k}: {v}" for k, v in errors.items())}, wallet_form=form)
    try:
        connect = wallets.connect_message(org_context.payer_id(), body["chain"], body["address"])
    except DomainError as exc:
        return _fail(exc, "wallet", wallet_form=form)
    return _page(connect=connect, wallet_form=form)


@bp.post("/billing/wallet/connect")
def wallet_connect():
    """Step 2: the signature of the shown message (pasted, or sent by the browser wallet)."""
    if (refused := org_context.guard(WRITE)):
        return refused
    form = {f: (request.form.get(f) or "").strip() for f in ("chain", "address", "signature", "nonce")}
    body, errors = web.load_form(WalletConnectSchema(), {k: v for k, v in form.items() if v})
    if errors:
        return _page(400, errors={"wallet": " ".join(f"{k}: {v}" for k, v in errors.items())}, wallet_form=form)
    try:
        wallets.connect(org_context.payer_id(), body["chain"], body["address"], body["signature"],
                        body.get("nonce"), mode=web.mode())
    except DomainError as exc:
        return _fail(exc, "wallet", wallet_form=form)
    return _done("wallet_connected")


AUTOTOPUP_FIELDS = ("threshold", "add_amount", "monthly_cap")
# each dollar field of the form: its schema field (cents) and how a message names it
AUTOTOPUP_SCHEMA = {"threshold": ("threshold_cents", "the threshold"), "add_amount": ("amount_cents", "the amount added"),
                    "monthly_cap": ("monthly_cap_cents", "the monthly cap")}
CAP_UNDER_AMOUNT = "The monthly cap must be at least the amount added."


def _range_in_dollars(field: str) -> str:
    """A schema field's range (cents) as the form says it, in dollars: "from $1.00 to $10,000.00"."""
    rng = next(v for v in AutoTopupRequestSchema().fields[field].validators if isinstance(v, Range))
    return f"from ${rng.min / 100:,.2f} to ${rng.max / 100:,.2f}"


@bp.post("/billing/auto-topup")
def set_autotopup():
    """Set (replace) auto top-up: below the threshold, one top-up of the amount is charged to
    the saved card, at most the monthly cap a month (the service of ``PUT /api/pay/auto-topup``)."""
    if (refused := org_context.guard(WRITE)):
        return refused
    form = {f: (request.form.get(f) or "").strip().removeprefix("$") for f in AUTOTOPUP_FIELDS}
    values = {f: dollars_to_cents(v) for f, v in form.items()}
    bad = [f for f, v in values.items() if v is None]
    if bad:
        return _page(400, errors={"autotopup": "Enter dollar amounts, e.g. 5 or 2.50 ("
                                               + ", ".join(f.replace("add_", "").replace("_", " ") for f in bad) + ")."}, topup_form=form)
    body, errors = web.load_form(AutoTopupRequestSchema(),
                                 {field: values[f] for f, (field, _name) in AUTOTOPUP_SCHEMA.items()})
    if errors:  # a range: said in dollars, as typed (the schema's messages count cents)
        said = [f"{name} {_range_in_dollars(field)}" for field, name in AUTOTOPUP_SCHEMA.values() if field in errors]
        return _page(400, errors={"autotopup": "Enter " + "; ".join(said) + "."}, topup_form=form)
    try:
        autotopup.configure(org_context.payer_id(), web.mode(), **body)
    except DomainError as exc:
        if exc.status == 422:  # the one rule relating two fields, named in the API's cents fields
            return _page(400, errors={"autotopup": CAP_UNDER_AMOUNT}, topup_form=form)
        return _fail(exc, "autotopup", topup_form=form)
    return _done("autotopup_set")


@bp.post("/billing/auto-topup/delete")
def delete_autotopup():
    """Turn auto top-up off (the service of ``DELETE /api/pay/auto-topup``)."""
    return _act("autotopup", "autotopup_off", autotopup.remove)


DONE = {"card_saved": "Card saved: it is now the default payment method.",
        "default_set": "Default payment method changed.", "method_removed": "Payment method removed.",
        "paid": "Paid with the saved card: the credits are in the balance.",
        "ach_started": "Bank payment started: the credits arrive when it settles.",
        "checkout_canceled": "Checkout canceled; nothing was charged.",
        "wallet_connected": "Wallet connected.", "autotopup_set": "Auto top-up is on.",
        "autotopup_off": "Auto top-up is off."}


def done_message() -> str | None:
    return DONE.get(request.args.get("done") or "")


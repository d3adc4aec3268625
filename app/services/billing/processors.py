"""Payment processors: one interface, two implementations (DESIGN §8).

* ``StripeProcessor`` talks to Stripe through the official ``stripe`` SDK (Checkout
  Sessions, Customers with a default PaymentMethod, off-session PaymentIntents for card
  and ``us_bank_account``). ``STRIPE_API_BASE`` points the SDK elsewhere (tests).
* ``SandboxProcessor`` is a real flow without money: a hosted checkout page served by the
  app (``/pay/sandbox/checkout/<id>``), Stripe-like test payment method ids, and events
  that are signed with the sandbox secret and delivered through the same webhook code.

``for_mode(mode)`` picks one: ``svc_test_`` credentials (mode ``test``) use the sandbox,
whose payments fund the test balance only. Live mode uses Stripe when
``PAYMENTS_PROCESSOR=stripe``; outside production ``PAYMENTS_PROCESSOR=sandbox`` (the default
there) lets the sandbox stand in for it. In production live mode never gets the sandbox:
without Stripe, live payments answer 503 ``payments_unavailable`` (config.py refuses to
start with ``PAYMENTS_PROCESSOR=sandbox``, and with Stripe but without its keys).
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass

import stripe
from flask import current_app

from app.errors import DomainError, Forbidden, ServiceUnavailable
from app.ids import random_b62

log = logging.getLogger(__name__)


class PaymentMethodNotFound(DomainError):
    status, code, message = 404, "payment_method_not_found", "No such payment method."
    description = ("The processor does not know the `payment_method_id` (the sandbox knows its test ids "
                   "only): a well-formed id of nothing, not a malformed request.")


class PaymentMethodInvalid(DomainError):
    status, code, message = 409, "payment_method_invalid", "Unusable payment method."
    description = ("The processor knows the payment method but it cannot be used in its current state "
                   "(an unsupported type, attachment refused, a saved method it will no longer charge).")


class PaymentsUnavailable(DomainError):
    status, code, message = 503, "payments_unavailable", "Live payments are not available on this deployment."
    description = ("No real payment processor is configured for live mode (production without "
                   "PAYMENTS_PROCESSOR=stripe): live card, ACH and checkout are refused; test keys "
                   "still use the sandbox.")


class CardDeclined(DomainError):
    status, code, message = 402, "card_declined", "The card was declined."
    description = "The processor declined the charge; the message carries the decline reason."


@dataclass
class MethodInfo:
    id: str
    type: str  # card | us_bank_account
    brand: str | None
    last4: str | None


@dataclass
class ChargeResult:
    provider_id: str
    status: str  # succeeded | processing | failed
    failure_code: str | None = None
    failure_message: str | None = None


# Stripe-like test payment methods of the sandbox: id -> (type, brand, last4, outcome)
SANDBOX_METHODS: dict[str, tuple[str, str | None, str, str]] = {
    "pm_card_visa": ("card", "visa", "4242", "succeeds"),
    "pm_card_mastercard": ("card", "mastercard", "4444", "succeeds"),
    "pm_card_chargeDeclined": ("card", "visa", "0002", "generic_decline"),
    "pm_card_insufficientFunds": ("card", "visa", "9995", "insufficient_funds"),
    # 3-D Secure required: paid on-session (the hosted checkout authenticates it), refused
    # off-session with authentication_required, as Stripe's test card 4000 0027 6000 3184
    "pm_card_authenticationRequired": ("card", "visa", "3184", "authentication_required"),
    "pm_usBankAccount": ("us_bank_account", "STRIPE TEST BANK", "6789", "settles_later"),
}


def asks_for_authentication(processor: str, pm_id: str | None) -> bool:
    """Whether the processor says of a saved method, before any charge, that its off-session
    charges fail with ``authentication_required``: the sandbox's 3-D Secure test card. Stripe
    says it of no method (the bank decides at each charge), so a Stripe card is known to need
    it only from a charge that failed so (``autotopup.needs_authentication``)."""
    return processor == "sandbox" and SANDBOX_METHODS.get(pm_id or "", ("", "", "", ""))[3] == "authentication_required"


DECLINE_MESSAGES = {
    "generic_decline": "Your card was declined.",
    "insufficient_funds": "Your card has insufficient funds.",
    "authentication_required": "This payment requires the cardholder to authenticate (3-D Secure).",
}


@dataclass
class TransferResult:
    """A payout transfer's answer: ``paid`` (``ref`` the transfer id) or ``failed``
    (definitive: ``code``, ``message``). An unknown outcome raises ``ServiceUnavailable``:
    asking again with the same idempotency key gets the same answer."""
    status: str  # paid | failed
    ref: str | None = None
    code: str | None = None
    message: str | None = None


def sign_payload(payload: bytes, secret: str, timestamp: int | None = None) -> str:
    """A ``Stripe-Signature`` header value for ``payload`` (Stripe's v1 scheme)."""
    ts = int(timestamp if timestamp is not None else time.time())
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


def sandbox_webhook_secret() -> str:
    cfg = current_app.config
    if cfg.get("SANDBOX_WEBHOOK_SECRET"):
        return cfg["SANDBOX_WEBHOOK_SECRET"]
    derived = hmac.new(cfg["SECRET_KEY"].encode(), b"sandbox-webhook-secret", hashlib.sha256).hexdigest()
    return "whsec_sbx_" + derived


class Processor(ABC):
    """What the payment service needs from a processor (implemented by the sandbox and
    Stripe processors below)."""

    name = "abstract"

    @abstractmethod
    def ensure_customer(self, account_id: str, email: str | None, customer_id: str | None) -> str:
        """The processor customer of the account (created when ``customer_id`` is None)."""

    @abstractmethod
    def retrieve_method(self, pm_id: str) -> MethodInfo:
        """Look up a payment method; raises InvalidRequest for an unknown id."""

    @abstractmethod
    def attach_default(self, customer_id: str, pm_id: str) -> None:
        """Attach ``pm_id`` to the customer and make it the default method."""

    @abstractmethod
    def create_checkout(self, payment, customer_id: str | None, success_url: str,
                        cancel_url: str) -> tuple[str, str]:
        """Returns (session id, hosted checkout url)."""

    @abstractmethod
    def checkout_method(self, payment) -> str | None:
        """The payment method a paid checkout was paid with (to save it), or None."""

    @abstractmethod
    def charge(self, payment, customer_id: str, pm: MethodInfo) -> ChargeResult:
        """Off-session charge of the saved method (idempotent on ``payment.id``)."""

    @abstractmethod
    def detach(self, pm_id: str) -> None:
        """Detach a saved method from its customer (it can no longer be charged)."""

    @abstractmethod
    def checkout_url(self, session_id: str) -> str | None:
        """The hosted page of an open checkout session (None: no longer open)."""

    @abstractmethod
    def expire_checkout(self, session_id: str) -> bool:
        """Close an open checkout session so it can no longer be paid; False when it is
        not open any more (paid, or a bank payment submitted)."""


    @abstractmethod
    def transfer(self, amount_cents: int, destination: str, idempotency_key: str, metadata: dict) -> TransferResult:
        """Pay ``amount_cents`` USD to a connected account (Stripe Connect ``acct_…``),
        idempotent on ``idempotency_key`` (the same key answers the same transfer)."""


class SandboxProcessor(Processor):
    name = "sandbox"

    def transfer(self, amount_cents, destination, idempotency_key, metadata):
        # Simulated and deterministic, so a retry with the same key gets the same answer,
        # in any process: the transfer id is derived from the key. A connected account id
        # containing "fail" is refused, as Stripe refuses an unusable destination.
        if "fail" in destination.lower():
            return TransferResult("failed", code="account_invalid",
                                  message=f"The sandbox refuses transfers to {destination}.")
        return TransferResult("paid", "tr_sbx_" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:24])

    def ensure_customer(self, account_id, email, customer_id):
        return customer_id or "cus_sbx_" + random_b62(16)

    def retrieve_method(self, pm_id):
        spec = SANDBOX_METHODS.get(pm_id)
        if spec is None:
            raise PaymentMethodNotFound(
                f"payment_method_id: unknown sandbox payment method; use one of {', '.join(SANDBOX_METHODS)}.")
        return MethodInfo(pm_id, spec[0], spec[1], spec[2])

    def attach_default(self, customer_id, pm_id):
        self.retrieve_method(pm_id)

    def create_checkout(self, payment, customer_id, success_url, cancel_url):
        session_id = "cs_sbx_" + random_b62(24)
        return session_id, self.checkout_url(session_id)

    def detach(self, pm_id):
        return None  # the sandbox's test methods belong to no one

    def checkout_method(self, payment):
        return (payment.meta or {}).get("sandbox_method")  # chosen on the sandbox page

    def checkout_url(self, session_id):
        base = current_app.config["BASE_URL"].rstrip("/")
        return f"{base}/pay/sandbox/checkout/{session_id}"

    def expire_checkout(self, session_id):
        return True  # the sandbox's session is its payment row: closed by the caller

    def charge(self, payment, customer_id, pm):
        outcome = SANDBOX_METHODS[pm.id][3]
        provider_id = "pi_sbx_" + random_b62(24)
        if outcome == "succeeds":
            return ChargeResult(provider_id, "succeeded")
        if outcome == "settles_later":
            return ChargeResult(provider_id, "processing")
        return ChargeResult(provider_id, "failed", outcome, DECLINE_MESSAGES.get(outcome))


class StripeProcessor(Processor):
    name = "stripe"

    def __init__(self):
        cfg = current_app.config
        if not cfg.get("STRIPE_SECRET_KEY"):
            raise ServiceUnavailable("Stripe is not configured (STRIPE_SECRET_KEY).")
        kwargs = {}
        if cfg.get("STRIPE_API_BASE"):
            kwargs["base_addresses"] = {"api": cfg["STRIPE_API_BASE"]}
        self.client = stripe.StripeClient(cfg["STRIPE_SECRET_KEY"], max_network_retries=2, **kwargs)

    @staticmethod
    def _unavailable(exc: Exception) -> ServiceUnavailable:
        log.warning("stripe call failed: %s", exc)
        return ServiceUnavailable("The payment processor is unavailable; nothing was charged.")

    def ensure_customer(self, account_id, email, customer_id):
        if customer_id:
            return customer_id
        try:
            cus = self.client.v1.customers.create(
                params={"email": email, "metadata": {"account_id": account_id}} if email
                else {"metadata": {"account_id": account_id}},
                options={"idempotency_key": f"customer:{account_id}"})
        except stripe.StripeError as exc:
            raise self._unavailable(exc) from None
        return cus.id

    def retrieve_method(self, pm_id):
        try:
            pm = self.client.v1.payment_methods.retrieve(pm_id)
        except stripe.InvalidRequestError:
            raise PaymentMethodNotFound("payment_method_id: unknown to the processor.") from None
        except stripe.StripeError as exc:
            raise self._unavailable(exc) from None
        if pm.type == "card":
            return MethodInfo(pm.id, "card", pm.card.brand, pm.card.last4)
        if pm.type == "us_bank_account":
            bank = pm.us_bank_account
            return MethodInfo(pm.id, "us_bank_account", bank.bank_name, bank.last4)
        raise PaymentMethodInvalid(f"payment_method_id: type {pm.type} is not supported (card, us_bank_account).")

    def attach_default(self, customer_id, pm_id):
        try:
            self.client.v1.payment_methods.attach(pm_id, params={"customer": customer_id})
            self.client.v1.customers.update(
                customer_id, params={"invoice_settings": {"default_payment_method": pm_id}})
        except stripe.InvalidRequestError as exc:
            raise PaymentMethodInvalid(f"payment_method_id: {exc.user_message or 'cannot be attached'}.") from None
        except stripe.StripeError as exc:
            raise self._unavailable(exc) from None

    def create_checkout(self, payment, customer_id, success_url, cancel_url):
        meta = {"payment_id": payment.id, "account_id": payment.account_id}
        params = {
            "mode": "payment",
            "line_items": [{"quantity": 1, "price_data": {
                "currency": "usd", "unit_amount": payment.amount_micros // 10_000,
                "product_data": {"name": payment.product or "Gateway credits"}}}],
            "success_url": success_url, "cancel_url": cancel_url,
            "client_reference_id": payment.account_id, "metadata": meta,
            "payment_intent_data": {"metadata": meta},
        }
        if customer_id:
            params["customer"] = customer_id
        if (payment.meta or {}).get("save_method"):  # the card is attached to the customer for later
            params["payment_intent_data"]["setup_future_usage"] = "off_session"
        try:
            session = self.client.v1.checkout.sessions.create(
                params=params, options={"idempotency_key": f"checkout:{payment.id}"})
        except stripe.StripeError as exc:
            raise self._unavailable(exc) from None
        return session.id, session.url

    def checkout_method(self, payment):
        if not payment.payment_intent:
            return None
        try:
            intent = self.client.v1.payment_intents.retrieve(payment.payment_intent)
        except stripe.StripeError as exc:
            raise self._unavailable(exc) from None
        pm = getattr(intent, "payment_method", None)  # an id, or the object when expanded
        return pm if isinstance(pm, str) else getattr(pm, "id", None)

    def detach(self, pm_id):
        try:
            self.client.v1.payment_methods.detach(pm_id)
        except stripe.InvalidRequestError:  # already detached or gone: nothing to undo
            log.info("stripe: payment method %s was not attached", pm_id)
        except stripe.StripeError as exc:
            raise self._unavailable(exc) from None

    def checkout_url(self, session_id):
        try:
            session = self.client.v1.checkout.sessions.retrieve(session_id)
        except stripe.StripeError as exc:
            raise self._unavailable(exc) from None
        return session.url if session.status == "open" else None

    def expire_checkout(self, session_id):
        try:
            self.client.v1.checkout.sessions.expire(session_id)
        except stripe.InvalidRequestError:  # not open: completed (paid or processing) or expired
            return False
        except stripe.StripeError as exc:
            raise self._unavailable(exc) from None
        return True

    def charge(self, payment, customer_id, pm):
        params = {
            "amount": payment.amount_micros // 10_000, "currency": "usd", "customer": customer_id,
            "payment_method": pm.id, "payment_method_types": [pm.type], "off_session": True,
            "confirm": True, "metadata": {"payment_id": payment.id, "account_id": payment.account_id},
        }
        try:
            pi = self.client.v1.payment_intents.create(
                params=params, options={"idempotency_key": f"charge:{payment.id}"})
        except stripe.CardError as exc:
            err = exc.error
            pi_id = getattr(getattr(err, "payment_intent", None), "id", None) or f"pi_failed_{payment.id}"
            code = getattr(err, "decline_code", None) or exc.code or "card_declined"
            return ChargeResult(pi_id, "failed", code, exc.user_message or "The card was declined.")
        except stripe.InvalidRequestError as exc:
            raise PaymentMethodInvalid(f"The saved payment method cannot be charged: {exc.user_message}.") from None
        except stripe.StripeError as exc:
            raise self._unavailable(exc) from None
        if pi.status == "succeeded":
            return ChargeResult(pi.id, "succeeded")
        if pi.status in ("processing", "requires_capture"):
            return ChargeResult(pi.id, "processing")
        err = getattr(pi, "last_payment_error", None)
        return ChargeResult(pi.id, "failed", getattr(err, "code", None) or pi.status,
                            getattr(err, "message", None) or f"Payment {pi.status}.")


    def transfer(self, amount_cents, destination, idempotency_key, metadata):
        try:
            tr = self.client.v1.transfers.create(
                params={"amount": int(amount_cents), "currency": "usd", "destination": destination,
                        "metadata": metadata}, options={"idempotency_key": idempotency_key})
        except (stripe.InvalidRequestError, stripe.PermissionError) as exc:
            return TransferResult("failed", code=exc.code or "transfer_refused",
                                  message=(exc.user_message or str(exc))[:300])
        except stripe.StripeError as exc:  # unknown outcome: asked again with the same key
            raise self._unavailable(exc) from None
        return TransferResult("paid", tr.id)


def for_mode(mode: str) -> Processor:
    """The processor for a credential mode (``live`` / ``test``)."""
    cfg = current_app.config
    processor = cfg.get("PAYMENTS_PROCESSOR", "sandbox")
    if mode != "test" and processor != "stripe" and (cfg.get("PRODUCTION") or processor != "sandbox"):
        raise PaymentsUnavailable("Live payments need a real processor; this deployment has none "
                                  "(PAYMENTS_PROCESSOR=stripe with STRIPE_SECRET_KEY and STRIPE_WEBHOOK_SECRET).")
    if mode == "test" or processor == "sandbox":
        if not cfg.get("PAYMENTS_SANDBOX_ENABLED", True):
            raise Forbidden("Sandbox payments are disabled on this deployment.")
        return SandboxProcessor()
    return StripeProcessor()


def json_payload(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":"), sort_keys=True).encode()

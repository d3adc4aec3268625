"""Shared marshmallow pieces of the blueprints' schemas: fields computed from the model
objects services return (cents from micros, …), the JSON-integer field, and ``Extended``
(an object plus values shown once, such as a new key's secret).

Services return model objects or dataclasses; the schemas here and in
``app/blueprints/<area>/schemas.py`` shape them into JSON (``@blp.response``), so output
is shaped in one place. A derived field keeps its class (``Integer``, ``Boolean``, …), so
the OpenAPI document still states the JSON type.
"""
from __future__ import annotations

from typing import Any, Callable

import marshmallow as ma

from app.services.billing.ledger import micros_to_cents


def derived(field: ma.fields.Field, getter: Callable[[Any], Any]) -> ma.fields.Field:
    """``field`` whose dumped value is ``getter(obj)`` instead of an attribute."""
    field.get_value = lambda obj, attr, accessor=None, default=ma.missing: getter(obj)
    return field


def cents(micros_attr: str, **kw) -> ma.fields.Integer:
    """Cents (floor, DESIGN §3) of the integer micros attribute ``micros_attr`` (None is 0)."""
    kw.setdefault("required", True)
    return derived(ma.fields.Integer(**kw),
                   lambda obj: micros_to_cents(ma.utils.get_value(obj, micros_attr) or 0))


def text_or_empty(attr: str, **kw) -> ma.fields.String:
    """A string attribute dumped as ``""`` when it is None."""
    kw.setdefault("required", True)
    return derived(ma.fields.String(**kw), lambda obj: getattr(obj, attr) or "")


def required(field_cls: type[ma.fields.Field], *args, **kw) -> ma.fields.Field:
    """``field_cls(*args, required=True, **kw)``: the response fields every object carries."""
    return field_cls(*args, required=True, **kw)


def listed(inner: type[ma.fields.Field] | ma.Schema | type, **kw) -> ma.fields.List:
    """A required list of nested schema objects (``inner`` a schema class) or of a field."""
    item = ma.fields.Nested(inner) if isinstance(inner, type) and issubclass(inner, ma.Schema) else inner
    return ma.fields.List(item, required=True, **kw)


class JsonInteger(ma.fields.Integer):
    """A JSON integer: ``5`` and ``5.0`` are accepted (JSON Schema ``integer``); strings,
    booleans and fractions are not."""

    def _validated(self, value):
        if isinstance(value, (str, bool)) or (isinstance(value, float) and not value.is_integer()):
            raise self.make_error("invalid")
        return super()._validated(value)


class Extended:
    """``obj``'s attributes plus ``extra`` ones, for dumping: e.g. a created key with its
    secret (shown once) or an alert event with its delivery state."""

    def __init__(self, obj: Any, **extra: Any):
        self._obj = obj
        self.__dict__.update(extra)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._obj, name)


# The headers of every 402 ``payment_required`` (``app.services.billing.paywall``), for the
# OpenAPI document of the routes that can answer it (module calls, chat completions).
PAYMENT_REQUIRED_HEADERS = {
    "PAYMENT-REQUIRED": {"description": "x402 v2 payment request (base64 JSON: `x402Version`, `accepts` "
                                        "with scheme `exact`, USDC, `payTo`, atomic `amount`, EIP-712 "
                                        "domain in `extra`).", "schema": {"type": "string"}},
    "WWW-Authenticate": {"description": '`X402 realm="gateway", nonce="<X-Nonce>"`',
                         "schema": {"type": "string"}},
    "X-Price-Cents": {"description": "Price in cents (rounded up).", "schema": {"type": "integer"}},
    "X-Pay-To": {"description": "Address that receives x402 payments (X402_PAY_TO); absent when x402 is "
                                "off (then neither `PAYMENT-REQUIRED` nor an X-Payment retry is offered).",
                 "schema": {"type": "string"}},
    "X-Nonce": {"description": "Random single-use nonce for the payment.", "schema": {"type": "string"}},
}

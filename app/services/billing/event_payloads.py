"""Shape of processor (Stripe / sandbox) webhook events, checked after the signature and
before any field is used (docs/security.md "Hostile input"): a signed event whose fields
have the wrong JSON types is refused with 400 ``invalid_request`` and changes nothing,
instead of failing half-way through applying it.

Only what ``payment_events`` reads is checked: the event's ``id`` and ``type``, and in
``data.object`` the amounts (non-negative JSON integers, at most ``MAX_AMOUNT`` cents),
the identifiers and codes (strings of at most 255 characters; an error message 2,000) and the nested objects.
A dispute event (``charge.dispute.*``) must name its dispute (``data.object.id``): money
moves once per dispute id.
"""
from __future__ import annotations

from app.errors import InvalidRequest

MAX_AMOUNT = 10**12  # cents
_AMOUNTS = ("amount", "amount_total", "amount_received", "amount_refunded")
_STRINGS = ("id", "payment_intent", "currency", "payment_status", "status", "customer",
            "payment_method", "charge", "reason")
_OBJECTS = ("metadata", "last_payment_error")


def _refuse(where: str, what: str) -> None:
    raise InvalidRequest(f"The webhook event's {where} must be {what}.")


def _string(value, where: str, limit: int = 255) -> None:
    if value is not None and (not isinstance(value, str) or len(value) > limit):
        _refuse(where, f"a string of at most {limit} characters")


def validate(event: dict) -> dict:
    """``event`` unchanged when its fields have the types ``payment_events`` expects;
    raises InvalidRequest otherwise."""
    for key in ("id", "type"):
        if not isinstance(event.get(key), str) or not 0 < len(event[key]) <= 255:
            _refuse(key, "a string of 1 to 255 characters")
    created = event.get("created")
    if created is not None and (isinstance(created, bool) or not isinstance(created, int) or created < 0):
        _refuse("created", "a non-negative integer (Unix time)")
    obj = event["data"]["object"]
    for key in _AMOUNTS:
        value = obj.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value <= MAX_AMOUNT):
            _refuse(f"data.object.{key}", f"an integer from 0 to {MAX_AMOUNT}")
    for key in _STRINGS:
        _string(obj.get(key), f"data.object.{key}")
    for key in _OBJECTS:
        if obj.get(key) is not None and not isinstance(obj[key], dict):
            _refuse(f"data.object.{key}", "an object")
    for key in ("code", "message"):
        _string((obj.get("last_payment_error") or {}).get(key), f"data.object.last_payment_error.{key}", 2000)
    _string((obj.get("metadata") or {}).get("payment_id"), "data.object.metadata.payment_id")
    if event["type"].startswith("charge.dispute.") and not obj.get("id"):
        _refuse("data.object.id", "the dispute's id (a string of 1 to 255 characters)")
    return event

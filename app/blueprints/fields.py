"""Shared marshmallow pieces of the blueprints' schemas: fields computed from the model
objects services return (cents from micros, …), the JSON-integer field, and ``Extended``
(an object plus values shown once, such as a new key's secret).

Services return model objects or dataclasses; the schemas here and in
``app/blueprints/<area>/schemas.py`` shape them into JSON (``@blp.response``), so output
is shaped in one place. A derived field keeps its class (``Integer``, ``Boolean``, …), so
the OpenAPI document still states the JSON type.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Callable

import marshmallow as ma

from app.services.money.ledger import micros_to_cents


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


class QueryInteger(ma.fields.Integer):
    """An integer query parameter: ASCII decimal digits with an optional leading ``-``
    (OpenAPI's ``integer`` written in a URL). Python's ``int()``, which ``Integer`` uses,
    would also read ``1_0``, `` 5 ``, ``+5`` and other scripts' digits (``٥``) as numbers."""

    _DIGITS = re.compile(r"-?[0-9]+\Z")

    def _validated(self, value):
        if isinstance(value, bool) or (isinstance(value, str) and not self._DIGITS.match(value)):
            raise self.make_error("invalid")
        return super()._validated(value)


class JsonNumber(ma.fields.Float):
    """A JSON number: ``0.5`` and ``1`` are accepted (JSON Schema ``number``); strings, which
    ``Float`` would parse (``"0.5"``), are not (nor booleans)."""

    def _validated(self, value):
        if isinstance(value, str):
            raise self.make_error("invalid")
        return super()._validated(value)


class JsonBoolean(ma.fields.Boolean):
    """A JSON boolean: ``true`` or ``false`` only (not ``"yes"``, ``1`` …)."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


class HeaderString(ma.fields.String):
    """A request header's text. WSGI hands header bytes over as latin-1 characters; a value
    whose bytes are valid UTF-8 (clients may send UTF-8, RFC 9110 §5.5) is read as UTF-8,
    so its characters, not its bytes, are counted by ``Length``."""

    def _deserialize(self, value, attr, data, **kwargs):
        text = super()._deserialize(value, attr, data, **kwargs)
        try:
            return text.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            return text


def idempotency_key_header(description: str) -> HeaderString:
    """The ``Idempotency-Key`` request header of every route that takes one: optional, 1–128
    characters (UTF-8 read as UTF-8), exactly the document's ``maxLength``: no byte cap
    beside it, which a schema-valid key of 86 CJK characters would have failed;
    ``description`` says what it makes happen once on that route."""
    return HeaderString(data_key="Idempotency-Key", validate=ma.validate.Length(min=1, max=128),
                        metadata={"description": description})


class Extended:
    """``obj``'s attributes plus ``extra`` ones, for dumping: e.g. a created key with its
    secret (shown once) or an alert event with its delivery state."""

    def __init__(self, obj: Any, **extra: Any):
        self._obj = obj
        self.__dict__.update(extra)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._obj, name)


# The 503 of a route that takes x402 payments when the facilitator gives no verdict
# (``x402.FacilitatorUnavailable``), for the OpenAPI document of those routes.
X402_UNAVAILABLE_DOC = (
    "`facilitator_unavailable`: the x402 facilitator gave no verdict on the payment at `/verify`; nothing "
    "moved or was charged: send the same payment again after `Retry-After`. `settlement_unavailable`: it gave no "
    "verdict on the settlement, so whether the USDC moved is not known yet; nothing was charged and the "
    "authorization stays reserved: if it settled, reconciliation credits it to the balance, so do not pay again "
    "and retry the call after `Retry-After` (then paid from the balance); the same payment sent again before "
    "then gets this answer too. `reason` repeats the code. Also "
    "`service_unavailable` while the database is unreachable.",
    {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer", "minimum": 1}}})


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
                                "not offered (no X402_PAY_TO, or no facilitator: X402_FACILITATOR_URL); "
                                "then neither `PAYMENT-REQUIRED` nor an X-Payment retry is offered.",
                 "schema": {"type": "string"}},
    "X-Nonce": {"description": "Random single-use nonce for the payment.", "schema": {"type": "string"}},
    "PAYMENT-RESPONSE": {"description": "On a `payment_invalid` whose settlement the facilitator refused: the "
                                        "x402 v2 settlement result, base64 JSON `{success: false, errorReason, "
                                        "transaction: \"\", network, payer}`.", "schema": {"type": "string"}},
    "X-PAYMENT-RESPONSE": {"description": "The same for x402 v1 (`X-Payment`).", "schema": {"type": "string"}},
}

# The headers of an answer paid by x402 (``billing.x402.response_headers``): module calls, chat
# (a refused settlement's 402 carries them too: ``PAYMENT_REQUIRED_HEADERS``).
PAYMENT_RESPONSE_HEADERS = {
    "PAYMENT-RESPONSE": {"description": "x402 v2 settlement of a payment sent with `PAYMENT-SIGNATURE`: "
                                        "base64 JSON `{success, transaction, network, payer, amount}`.",
                         "schema": {"type": "string"}},
    "X-PAYMENT-RESPONSE": {"description": "The same for x402 v1 (`X-Payment`).", "schema": {"type": "string"}},
}


# --- the input policy (every request schema) ------------------------------------------
#
# Every request schema (body, query, form, headers) derives from ``InputSchema``; when a
# schema is instantiated its text fields (also inside lists and nested schemas; not the
# free-form JSON of ``Dict``/``Raw`` fields, such as analytics ``props`` or chat messages,
# which have their own rules) get the house rules, so a new field cannot forget them:
#
# * no control characters: C0 (``\x00``–``\x1f``), DEL and the C1 range are refused; a
#   field declared ``multiline`` (``metadata={"multiline": True}``) may also hold ``\t``,
#   ``\n`` and ``\r``. NUL is refused everywhere (PostgreSQL cannot store it).
# * a length bound: a text field without its own ``Length(max=…)`` gets
#   ``Length(max=TEXT_MAX)``. Query-string fields declare a smaller one (at most
#   ``QUERY_MAX``) and headers at most 8,000, so a value just over the bound still fits
#   the server's request-line and header limits and gets this 400, not a 414/431.
# * a nesting limit: a request whose JSON nests deeper than ``MAX_JSON_DEPTH`` arrays/objects
#   is refused (400) when its schema loads it, before the route calls any service (so a
#   module call is refused before any charge).
# The first two are exported in the OpenAPI document (``not: {pattern: [forbidden]}`` and
# ``maxLength``), so clients and fuzzers know them. Values that end up in an e-mail header
# also take ``header_safe``.
#
# Published patterns are ECMA-262 regular expressions (JSON Schema's dialect) that Python
# reads the same way: anchored with ^ and $ (not \Z: ECMA has no such escape), explicit
# character classes instead of \s (the two dialects' sets differ), and matched here with
# ``Pattern`` (``fullmatch``: Python's $ also matches before a final newline, ECMA's does
# not). tests/test_openapi_rules.py compares every pattern of the document in both.

TEXT_MAX = 2000
QUERY_MAX = 300
_C1 = r"\x80-\x9f"
# the characters refused in one-line text (every control character) and in multi-line text
# (the same but tab, line feed and carriage return), as regular-expression class contents
_CTRL = rf"\x00-\x1f\x7f{_C1}"
_CTRL_MULTILINE = rf"\x00-\x08\x0b\x0c\x0e-\x1f\x7f{_C1}"
CONTROL_CHARS = _CTRL  # for the path-segment converter (app/converters.py)
SINGLE_LINE_PATTERN = rf"^[^{_CTRL}]*$"
MULTILINE_PATTERN = rf"^[^{_CTRL_MULTILINE}]*$"
# Some character that is not white space (every character Python's ``str.strip`` removes is
# listed, so what passes keeps a text after trimming; read alike by ECMA-262 and Python): a
# name or message that must not be blank.
_STRIP = r" \t\n\r\f\v\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
NOT_BLANK = rf"^[{_STRIP}]*[^{_STRIP}][\s\S]*$"
# White space as Python's \s and str.strip() read it, spelled out (ECMA-262's \s is another set).
SPACE = r"\t\n\x0b\x0c\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# A URL the service will call (webhooks, alert targets): scheme, a host without userinfo,
# an optional path. http is refused in production and when private hosts are not allowed
# (``netguard.validate_url``: configuration, not statable here), as is a host that does not
# resolve to a public address.
URL_CORE = r"https?://[^\x00-\x20\x7f/?#@]+(/[^\x00-\x20\x7f]*)?"
HTTPS_PATTERN = rf"^{URL_CORE}$"
_SINGLE_LINE_ERROR = "must not contain control characters or line breaks."
_MULTILINE_ERROR = "must not contain control characters (line breaks and tabs are allowed)."


class NoControlChars(ma.validate.Validator):
    """The control-character rule of the input policy (published as ``not``, see
    ``_apply_policy``)."""

    def __init__(self, multiline: bool = False):
        self._pattern = re.compile(MULTILINE_PATTERN if multiline else SINGLE_LINE_PATTERN)
        self.error = _MULTILINE_ERROR if multiline else _SINGLE_LINE_ERROR

    def __call__(self, value):
        if isinstance(value, str) and not self._pattern.fullmatch(value):
            raise ma.ValidationError(self.error)
        return value


class Pattern(ma.validate.Regexp):
    """``Regexp`` matched with ``fullmatch``: the validator of every published pattern
    (Python's ``$`` also matches before a final newline; JSON Schema's does not)."""

    def __call__(self, value):
        if self.regex.fullmatch(value) is None:
            raise ma.ValidationError(self._format_error(value))
        return value


# One line, and no "=?" (RFC 2047 encoded-word syntax, which a mail library may decode
# into raw line breaks): every run of "=" is followed by a character other than "?" or
# ends the value. A plain regular expression, so it is exported as the field's pattern.
HEADER_SAFE_PATTERN = rf"^(?:[^={_CTRL}]|=+[^=?{_CTRL}])*=*$"

# For a value that goes into an e-mail header (a name in a subject, an address).
header_safe = Pattern(
    HEADER_SAFE_PATTERN, error="must be one line without control characters or '=?' (encoded-word syntax).")
# The same for a name the service trims and then requires (an alert's name): not blank too,
# so a name of white space only breaks the document as it is refused (400).
header_safe_name = Pattern(
    rf"^(?=[{_STRIP}]*[^{_STRIP}]){HEADER_SAFE_PATTERN[1:]}",
    error="must not be blank, and be one line without control characters or '=?' (encoded-word syntax).")


def _apply_policy(field: ma.fields.Field) -> None:
    """Give ``field`` (and the fields inside it) the input policy, once."""
    if getattr(field, "_input_policy", False):
        return
    field._input_policy = True
    if isinstance(field, ma.fields.List):
        _apply_policy(field.inner)
    elif isinstance(field, ma.fields.Tuple):
        for inner in field.tuple_fields:
            _apply_policy(inner)
    if isinstance(field, (ma.fields.DateTime, ma.fields.Date, ma.fields.Time)):
        _guard_raw_text(field)
        return
    if not isinstance(field, ma.fields.String):
        return
    validators = list(field.validators)
    multiline = bool(field.metadata.get("multiline"))
    validators.append(NoControlChars(multiline))
    # published as "not a string holding a forbidden character": a search for one character,
    # read alike by every regex dialect (a field's own pattern stays its ``pattern``; an
    # anchored "^[^…]*$" would not do: Python's $ also matches before a final newline, so
    # Python-based tools would take "x\n" for valid). ``not`` keeps ``null`` valid.
    field.metadata = {**field.metadata, "not": {
        "type": "string", "pattern": f"[{_CTRL_MULTILINE if multiline else _CTRL}]"}}
    if not any(isinstance(v, ma.validate.Length) and v.max is not None for v in validators) \
            and not any(isinstance(v, ma.validate.OneOf) for v in validators):
        validators.append(ma.validate.Length(max=TEXT_MAX))
    field.validators = validators


DATETIME_TEXT_MAX = 64  # longer than any RFC 3339 date-time


def _guard_raw_text(field: ma.fields.Field) -> None:
    """The input policy for a field parsed from text into another type (date-times): the
    raw text is bounded and free of control characters before it is parsed (validators
    would only see the parsed value). The bound is published as ``maxLength``."""
    rule = NoControlChars()
    parse = field._deserialize

    def deserialize(value, attr, data, **kwargs):
        if isinstance(value, str):
            if len(value) > DATETIME_TEXT_MAX:
                raise ma.ValidationError(f"Longer than maximum length {DATETIME_TEXT_MAX}.")
            rule(value)
            if value.endswith("z"):  # RFC 3339 §5.6: "z" is "Z" (the parser knows only "Z")
                value = value[:-1] + "Z"
        return parse(value, attr, data, **kwargs)

    field._deserialize = deserialize
    field.metadata = {**field.metadata, "maxLength": DATETIME_TEXT_MAX}


MAX_JSON_DEPTH = 32


def json_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """How deep ``value`` nests arrays/objects (a scalar is 0), counted iteratively and
    stopping once past ``limit`` (so a hostile document costs at most its size)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


class InputSchema(ma.Schema):
    """Base of every request schema: applies the input policy above to each field
    (marshmallow copies declared fields per instance, so the class stays untouched)."""

    def on_bind_field(self, field_name: str, field_obj: ma.fields.Field) -> None:
        _apply_policy(field_obj)

    @ma.pre_load
    def _nesting_limit(self, data, **kwargs):
        if json_depth(data) > MAX_JSON_DEPTH:
            raise ma.ValidationError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels.")
        return data


_SINGLE_LINE = re.compile(SINGLE_LINE_PATTERN)


def plain_text(value: Any, max_len: int, *, min_len: int = 0) -> bool:
    """True when ``value`` is a str that passes the input policy's single-line rules and
    these bounds: the check of a hand-written fast loader (``FastLoad``)."""
    return (type(value) is str and min_len <= len(value) <= max_len
            and _SINGLE_LINE.fullmatch(value) is not None)


def header_text(value: str) -> str:
    """A header value as ``HeaderString`` reads it (UTF-8 bytes read as UTF-8)."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


class FastLoad:
    """Mixin for a request schema on a hot path: ``fast_load(data)`` accepts the common
    valid input with a few plain checks and returns exactly what ``load`` would, or None
    to let marshmallow load it — so every refusal (and its 400 body) still comes from the
    schema and its input policy. The schema class stays the OpenAPI source. The project's
    parser (``app.extensions``) calls it and keeps one instance of such a schema per
    process."""

    def fast_load(self, data: Any) -> Any:  # pragma: no cover - interface
        return None


def idempotency_headers(name: str, description: str) -> type[InputSchema]:
    """The request-headers schema of a route that takes nothing but ``Idempotency-Key``
    (``routing.endpoint(headers=…, idempotent=True)``): the money-moving POSTs and alert
    creation."""
    meta = type("Meta", (), {"unknown": ma.EXCLUDE})
    return type(name, (InputSchema,), {"Meta": meta, "__doc__": f"Headers: {description}",
                                       "idempotency_key": idempotency_key_header(description)})

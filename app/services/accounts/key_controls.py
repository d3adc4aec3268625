"""Per-key controls (docs/keys.md "Per-key controls"): a key's allow-lists of chat models
and modules, and its requests-per-minute / tokens-per-minute limits.

* The controls are read with the credential (``app.auth`` puts a ``KeyControls`` in the
  principal, cached and dropped on every worker when ``PATCH /api/keys/{id}`` changes
  them, like a spend limit) and handed to the services as a plain argument.
* Module gateway (``gateway.calls.call``, MCP's ``tools/call`` too): the modules
  allow-list (403 ``module_not_allowed``) and the rpm limit. Chat host
  (``chat.completions.create_completion``, ``/v1/messages`` too): the models allow-list
  (a named model outside it is 403 ``model_not_allowed``; ``model: auto`` routes among the
  allowed models only), the rpm and the tpm limit; ``/v1/messages/count_tokens`` (no model
  call): the models allow-list only.
* Counting: fixed one-minute windows (UTC, from the minute's start) counted by the one
  rate counter (``app.services.platform.ratecount``, as the plan's limit) in the store
  every worker and node shares: Redis when the rate-limit storage is Redis, else
  PostgreSQL. Each count is ONE conditional statement: a request that does not fit is
  refused (429 ``rate_limited`` with ``Retry-After`` = the seconds to the window's end)
  and NOT counted, so a client retrying too fast does not starve itself. The store
  unreachable: the request is allowed and logged (fail open, as the plan's limit).
* Tokens: a completion is admitted while the minute's count plus its estimate (estimated
  prompt tokens, plus ``max_tokens`` when the request sets one) fits the limit; the
  estimate is counted at admission and corrected to the provider's total tokens when the
  completion settles (given back when it is released), in the window it was counted in.
  In-flight completions may thus end a minute above the limit by their output; the next
  request is refused until the window ends.
* A rotated key counts on its successor's counters under its successor's rpm/tpm (one limit
  per rotation, as the spend limit), so a rotation's overlap does not double the key's rates
  and a rate set on the successor holds the retiring key too; allow-lists stay each key's own.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from app.errors import Forbidden, InvalidRequest, RateLimited
from app.services.platform import ratecount

log = logging.getLogger(__name__)

WINDOW = 60  # seconds: the limits are per minute
MAX_LIST = 100  # entries of an allow-list
MAX_RPM, MAX_TPM = 1_000_000, 1_000_000_000
FIELDS = ("allowed_models", "allowed_modules", "rpm_limit", "tpm_limit")
RATES = ("rpm_limit", "tpm_limit")  # counted on the rotation's one counter: its newest key's values


class ModelNotAllowed(Forbidden):
    code = "model_not_allowed"
    message = "This key may not use this model."
    description = "Chat: the key's `allowed_models` does not list the requested model (PATCH /api/keys/{id})."


class ModuleNotAllowed(Forbidden):
    code = "module_not_allowed"
    message = "This key may not call this module."
    description = "Module call: the key's `allowed_modules` does not list this module (PATCH /api/keys/{id})."


@dataclass(frozen=True)
class KeyControls:
    """What a key may do, as the services check it. ``counter_id``: the key whose counters
    count (the head of its rotation)."""

    counter_id: str
    models: frozenset[str] | None = None
    modules: frozenset[str] | None = None
    rpm: int | None = None
    tpm: int | None = None


def of(key_id: str, counter_id: str, allowed_models, allowed_modules, rpm, tpm) -> KeyControls | None:
    """The controls of a key row's values (None when it has none: nothing to check)."""
    if allowed_models is None and allowed_modules is None and rpm is None and tpm is None:
        return None
    return KeyControls(counter_id=counter_id or key_id,
                       models=None if allowed_models is None else frozenset(allowed_models),
                       modules=None if allowed_modules is None else frozenset(allowed_modules),
                       rpm=rpm, tpm=tpm)


# --- validation (POST /api/keys, PATCH /api/keys/{id}) ----------------------------------

def _names(field: str, value) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and 0 < len(v) <= 96 for v in value):
        raise InvalidRequest(f"{field}: must be a list of names (1 to 96 characters each) or null.", param=field)
    if len(value) > MAX_LIST:
        raise InvalidRequest(f"{field}: at most {MAX_LIST} entries.", param=field)
    return sorted(set(value))


def _limit(field: str, value, top: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise InvalidRequest(f"{field}: must be an integer from 1 to {top}, or null.", param=field)
    return value


def validated(changes: dict) -> dict:
    """The control columns named in ``changes`` (absent: unchanged; null: removed),
    checked: allow-lists of 0–100 names (an empty list allows nothing), limits ≥ 1."""
    out: dict = {}
    for field in ("allowed_models", "allowed_modules"):
        if field in changes:
            out[field] = _names(field, changes[field])
    if "rpm_limit" in changes:
        out["rpm_limit"] = _limit("rpm_limit", changes["rpm_limit"], MAX_RPM)
    if "tpm_limit" in changes:
        out["tpm_limit"] = _limit("tpm_limit", changes["tpm_limit"], MAX_TPM)
    return out


def inherited(creator, ctl: dict) -> dict:
    """A new key made by a key (``creator``, an ``ApiKey``; None: the account owner) gets the
    creator's controls it was not given, like its scopes and spend limit."""
    if creator is None:
        return ctl
    return {**{f: getattr(creator, f) for f in FIELDS if getattr(creator, f) is not None}, **ctl}


def beyond(creator, values: dict) -> str | None:
    """Why a key with the controls ``values`` (every field: the key's result) would do more
    than ``creator`` may (None: it would not). Within means: each allow-list of the creator
    holds every name of the key's (a key without the list may use anything: beyond), and
    each per-minute limit of the creator is at least the key's."""
    if creator is None:
        return None
    for field in ("allowed_models", "allowed_modules"):
        own = getattr(creator, field)
        if own is not None and (values.get(field) is None or not set(values[field]) <= set(own)):
            return f"{field}: at most this key's own ({', '.join(sorted(own)) or 'none'})."
    for field in ("rpm_limit", "tpm_limit"):
        own = getattr(creator, field)
        if own is not None and (values.get(field) is None or values[field] > own):
            return f"{field}: at most this key's own ({own})."
    return None


# --- allow-lists ---------------------------------------------------------------------------

def check_module(controls: KeyControls | None, slug: str) -> None:
    """403 ``module_not_allowed`` unless the key may call ``slug``."""
    if controls is not None and controls.modules is not None and slug not in controls.modules:
        raise ModuleNotAllowed(f"This key may not call module {slug!r}; its allowed modules are "
                               f"{', '.join(sorted(controls.modules)) or 'none'}.", param="slug")


def allowed_models(controls: KeyControls | None, model: str) -> frozenset[str] | None:
    """The models ``model: auto`` may route to for this key (None: any); a named model
    outside the allow-list is 403 ``model_not_allowed``."""
    if controls is None or controls.models is None:
        return None
    if model != "auto" and model not in controls.models:
        raise ModelNotAllowed(f"This key may not use model {model!r}; its allowed models are "
                              f"{', '.join(sorted(controls.models)) or 'none'}.", param="model")
    return controls.models


# --- counting ------------------------------------------------------------------------------

@dataclass
class Ticket:
    """Tokens counted at a completion's admission: corrected when it settles."""

    counter_id: str
    window: int  # the window's start (epoch seconds)
    tokens: int


def _per_minute(limit: int) -> tuple:
    return ratecount.parse(f"{limit}/minute")


def _count(counter_id: str, kind: str, n: int, limit: int) -> list | None:
    """``ratecount.hit`` of ``n`` against the key's ``kind`` limit; None when the store is
    unreachable (fail open, as the plan's limit)."""
    try:
        return ratecount.hit(f"key:{counter_id}:{kind}", _per_minute(limit), n)
    except Exception:
        log.warning("key rate counter unavailable; allowing the request")
        return None


def _refuse(what: str, limit: int, now: float, window: int, extra: str = "") -> RateLimited:
    retry = max(1, math.ceil(window + WINDOW - now))
    return RateLimited(f"This key's {what} limit of {limit} per minute is reached{extra}; retry in {retry} s.",
                       headers={"Retry-After": str(retry), "RateLimit-Limit": str(limit),
                                "RateLimit-Remaining": "0", "RateLimit-Reset": str(retry)})


def count_request(controls: KeyControls | None) -> None:
    """Count one request against the key's rpm limit (429 when the minute is full; the
    refused request is not counted); an admitted one's ``RateLimit-*`` headers report this
    limit when it has fewer requests left than the plan's (``ratelimits.note``)."""
    if controls is None or controls.rpm is None:
        return
    windows = _count(controls.counter_id, "rpm", 1, controls.rpm)
    if windows is None:
        return
    if not ratecount.admitted(windows):
        now = time.time()
        raise _refuse("requests-per-minute", controls.rpm, now, int(now // WINDOW) * WINDOW)
    from app import ratelimits

    ratelimits.note(windows)  # the response's RateLimit-* name this limit when it is the tighter one


def reserve_tokens(controls: KeyControls | None, tokens: int) -> Ticket | None:
    """Count a completion's estimated tokens against the key's tpm limit (429 when they do
    not fit the minute); returns the ticket ``settle_tokens`` corrects, or None."""
    if controls is None or controls.tpm is None:
        return None
    now = time.time()
    window = int(now // WINDOW) * WINDOW
    tokens = max(0, int(tokens))
    if tokens == 0:
        return Ticket(controls.counter_id, window, 0)
    windows = _count(controls.counter_id, "tpm", tokens, controls.tpm)
    if windows is not None and not ratecount.admitted(windows):
        extra = (f" (this request alone is estimated at {tokens} tokens: lower max_tokens or the prompt)"
                 if tokens > controls.tpm else "")
        raise _refuse("tokens-per-minute", controls.tpm, now, window, extra)
    return Ticket(controls.counter_id, window, tokens)


def settle_tokens(ticket: Ticket | None, actual: int) -> None:
    """Correct a ticket's count to the completion's ``actual`` total tokens (0: released),
    in the window it was counted in (nothing when that window has ended)."""
    if ticket is None:
        return
    delta = int(actual) - ticket.tokens
    if delta:
        ratecount.give(f"key:{ticket.counter_id}:tpm", _per_minute(1), ticket.window, delta)
    ticket.tokens = int(actual)

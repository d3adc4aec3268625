"""Every rate limit of the service, one mechanism: named limits read from config.py at
request time (the ``limits`` syntax, e.g. ``"5/minute;30/hour"``; the names and defaults
are listed and explained in config.py's rate-limit section), counted by ONE counter,
``app.services.platform.ratecount`` (with the per-key rpm/tpm limits of
``accounts.key_controls``), in the store every worker and node shares: Redis when the
rate-limit storage is Redis, else PostgreSQL (the embedded default's gunicorn workers).

* ``per_ip(name)``: a route decorator, ``config[name]`` per client IP (after ProxyFix);
* ``per_email(name)``: a route decorator, ``config[name]`` per e-mail address in the body,
  placed after the body's validation (``routing.endpoint`` does): a request refused as
  invalid (400) uses none of the address's limit; ``count_email(name, email)`` the same
  count, made when the service calls it back (the contact form: a repeat counts nothing);
* ``per_credential(principal)``: the plan's limit (``PLANS[plan]["rate_limit"]``) for the
  credential's account (all its keys and sessions together), applied by
  ``@authenticated`` (app.auth) and the thin WSGI entry;
* ``recipient_allowed(name, email)``: ``config[name]`` per recipient mailbox, for the mail a
  stranger can make us send (``outbox.add_email(throttle=name)``): over it, the mail is not
  sent and the request is answered as usual.

E-mail keys are the canonical mailbox (``accounts.mailbox.canonical``: ``a+1@x`` and
``a+2@x`` are one inbox), hashed. A refused request counts in no window (a client
retrying too fast does not starve itself). A breach is 429 ``rate_limited`` with
``Retry-After`` and ``RateLimit-*`` (app.errors); a passing request carries the
``RateLimit-*`` of the window closest to refusing (``note``: the plan's windows and the
key's rpm limit). The storage unreachable: allowed (fail open,
logged). ``RATELIMIT_ENABLED`` off: nothing is counted.
"""
from __future__ import annotations

import logging
from functools import wraps

from flask import current_app, g, request

from app.errors import RateLimited
from app.ids import sha256_hex
from app.services.platform import ratecount

log = logging.getLogger(__name__)


def mailbox_key(email: str) -> str:
    """The hashed canonical mailbox of ``email``: every ``+tag`` and (Gmail) dotted
    spelling of one inbox counts as one recipient."""
    from app.services.accounts.mailbox import canonical

    return sha256_hex(canonical(email))[:32]


def _ip_key() -> str:
    """The client IP as seen after ProxyFix (the real client behind nginx)."""
    return "ip:" + (request.remote_addr or "unknown")


def _email_key() -> str:
    """The canonical mailbox of the JSON body's e-mail (hashed), or the client IP without one."""
    data = request.get_json(silent=True, cache=True)
    email = data.get("email") if isinstance(data, dict) else None
    if isinstance(email, str) and 0 < len(email) <= 320:
        return "email:" + mailbox_key(email)
    return _ip_key()


def _counted(name: str, spec: str) -> list | None:
    """``ratecount.hit`` of one request; None when limits are off or the storage is down."""
    if not current_app.config.get("RATELIMIT_ENABLED", True):
        return None
    try:
        return ratecount.hit(name, ratecount.parse(spec))
    except Exception:  # storage down: fail open (documented), the service keeps working
        log.warning("rate limit storage unavailable; allowing %s", name.split(":", 1)[0])
        return None


def _refuse_or_note(windows: list | None, message: str) -> None:
    """429 (``RateLimited``) when a window refused; else the first window's ``RateLimit-*``
    headers for the response (``g.ratelimit_headers``, written by app.requestid)."""
    if windows is None:
        return
    for item, remaining, reset in windows:
        if remaining < 0:
            retry = max(1, reset)
            raise RateLimited(message.format(item=item),
                              headers={"Retry-After": str(retry), "RateLimit-Limit": str(item.amount),
                                       "RateLimit-Remaining": "0", "RateLimit-Reset": str(retry)})
    note(windows)


def note(windows: list) -> None:
    """Keep for the response (``g.ratelimit_headers``, written by app.requestid) the
    ``RateLimit-*`` of the admitted window closest to refusing — the fewest remaining, then
    the soonest reset — among ``windows`` and any noted before in this request (the plan's,
    then a key's rpm limit), as the RateLimit header fields draft asks when several policies
    apply. Until 2026-11-29 the plan's first window was reported: a key limited to 3 requests
    a minute read `RateLimit-Remaining: 59981` until its 429."""
    item, remaining, reset = min(windows, key=lambda w: (w[1], w[2]))
    kept = g.get("ratelimit_headers")
    if kept is not None and (int(kept["RateLimit-Remaining"]), int(kept["RateLimit-Reset"])) <= (remaining, reset):
        return
    g.ratelimit_headers = {"RateLimit-Limit": str(item.amount),
                           "RateLimit-Remaining": str(remaining), "RateLimit-Reset": str(reset)}


def recipient_allowed(config_name: str, email: str) -> bool:
    """Count one mail to ``email``'s mailbox against ``config[config_name]`` (every window);
    False when a window is full (then nothing is counted). Storage down: allowed."""
    windows = _counted(f"mail:{config_name}:{mailbox_key(email)}", current_app.config[config_name])
    return windows is None or ratecount.admitted(windows)


def _throttle(config_name: str, key, what: str):
    """Decorator: ``config[config_name]`` per route (each route its own count, as
    Flask-Limiter's decorators counted) and per ``key()``."""
    def decorator(view):
        @wraps(view)
        def wrapper(*args, **kwargs):
            _check(config_name, key(), what)
            return view(*args, **kwargs)
        return wrapper
    return decorator


def _check(config_name: str, key: str, what: str) -> None:
    """Count this request against ``config[config_name]`` for ``key`` (the route's own count):
    429 when a window is full."""
    spec = current_app.config[config_name]
    _refuse_or_note(_counted(f"{config_name}:{request.endpoint}:{key}", spec),
                    f"Rate limit exceeded ({spec} {what}: {{item}}); retry after the window ends.")


def count_email(config_name: str, email: str) -> None:
    """``per_email``'s count, made when a service says so (the contact form passes it to
    ``contact.submit`` as ``admit``: a repeated message, a double click, counts in no window)."""
    _check(config_name, "email:" + mailbox_key(email), "per e-mail address")


def per_ip(config_name: str):
    """Decorator: the limit in ``config[config_name]`` per client IP."""
    return _throttle(config_name, _ip_key, "per client IP")


def per_email(config_name: str):
    """Decorator: the limit in ``config[config_name]`` per e-mail address in the body."""
    return _throttle(config_name, _email_key, "per e-mail address")


# --- per credential: the plan's limit ---------------------------------------------------

def per_credential(principal) -> None:
    """The plan's limit (the plan table) for the credential's ACCOUNT: every key, rotated
    key and agent session of one account counts in one set of windows (until 2026-11-27
    each credential had its own, so five keys got five times the plan). Fixed windows
    counted by ``ratecount`` in the store every worker and node shares (Redis, else
    PostgreSQL: the embedded default's workers too); a refused request is not counted.

    With Redis this is ONE round trip for all the plan's limits, or none while this
    process holds a lease of them (high limits: ``RATELIMIT_LEASE_FRACTION``). A breach is
    429 ``rate_limited`` with ``Retry-After``; a passing request gets ``RateLimit-*``
    headers for the plan's window closest to refusing (``note``). When the storage is unreachable the request is
    allowed (fail open, logged)."""
    app = current_app
    if not app.config.get("RATELIMIT_ENABLED", True):
        return
    spec = app.config["PLANS"].get(principal.plan, {}).get("rate_limit")
    if not spec:
        return
    items = ratecount.parse(spec)
    try:
        cfg = app.config
        windows = ratecount.hit(f"plan:{principal.account_id}", items, store_=ratecount.store(cfg),
                                lease=ratecount.lease_size(items, cfg.get("RATELIMIT_LEASE_FRACTION", 0)))
    except Exception:  # storage down: fail open (documented), calls keep working
        log.warning("rate limit storage unavailable; allowing request")
        return
    _refuse_or_note(windows, "Rate limit of {item} exceeded for this account (its keys and sessions share it).")

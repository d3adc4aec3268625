"""Rate limits of the public endpoints: per client IP (after ProxyFix) and per e-mail
address in the JSON body, with limit strings read from config at request time. Storage
is Flask-Limiter's (Redis when REDIS_URL is set, so every worker and node shares the
counters). A breach is 429 ``rate_limited`` with ``Retry-After`` (app.errors)."""
from __future__ import annotations

from flask import current_app, request

from app.extensions import limiter
from app.ids import sha256_hex


def _email_key() -> str:
    """The normalised e-mail of the JSON body (hashed), or the client IP without one."""
    data = request.get_json(silent=True, cache=True)
    email = data.get("email") if isinstance(data, dict) else None
    if isinstance(email, str) and 0 < len(email) <= 320:
        return "email:" + sha256_hex(email.strip().lower())[:32]
    return "ip:" + (request.remote_addr or "unknown")


def per_ip(config_name: str):
    """Decorator: the limit in ``config[config_name]`` per client IP."""
    return limiter.limit(lambda: current_app.config[config_name],
                         error_message=lambda: f"{current_app.config[config_name]} per client IP")


def per_email(config_name: str):
    """Decorator: the limit in ``config[config_name]`` per e-mail address in the body."""
    return limiter.limit(lambda: current_app.config[config_name], key_func=_email_key,
                         error_message=lambda: f"{current_app.config[config_name]} per e-mail address")

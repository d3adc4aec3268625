"""Authentication: bearer parsing, credential lookup (cached, revocation-correct),
scope checks (per-key plan rate limits: ``app.ratelimits``) and batched ``last_used_at``.

* ``init_app(app)`` (called by ``create_app``) wires this module: it registers the
  credential resolvers (``svc_live_`` / ``svc_test_`` keys from ``api_keys`` here,
  ``svc_sess_`` agent sessions from ``app.services.agents.identity``) and starts the two
  background threads below. Importing this module starts and registers nothing.
* Resolved credentials are cached per process for ``AUTH_CACHE_TTL`` seconds, and never
  past their own expiry (a key's ``expires_at``, a session's end: checked on every cache
  hit, so an expired key is refused on every worker at that instant). A
  revocation (or a changed expiry, e.g. a rotation) deletes the local entry and publishes the credential hash on the Redis
  channel ``<prefix>:revocations``; every process subscribes (one daemon thread) and
  drops the entry, so revocation reaches every worker and node in about a second and
  in at most the TTL when a broadcast is lost.
* ``last_used_at`` is recorded in memory and flushed by a daemon thread every
  ``LAST_USED_FLUSH_SECONDS`` (one transaction, key rows locked in id order, so flushes
  of several processes cannot deadlock), never on the request path.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from functools import wraps
from typing import Callable

from flask import current_app, g, request
from flask_smorest import Blueprint as _SmorestBlueprint
from sqlalchemy import select, text

from app import ratelimits
from app.errors import Forbidden, InsufficientScope, Unauthorized
from app.extensions import db, get_redis, redis_key
from app.ids import secret_is_well_formed, sha256_hex
from app.models import Account, ApiKey, ProviderKey
from app.services.accounts import key_controls
from app.models.base import utcnow
from app.services.platform.uow import unit_of_work

log = logging.getLogger(__name__)

SECURITY_SCHEME = "bearerAuth"
API_KEY_HEADER_SCHEME = "anthropicApiKey"  # ``x-api-key``, on /v1/messages (Anthropic's header)


@dataclass(frozen=True)
class Principal:
    """Who is calling: the account a credential acts for, and what it may do."""

    account_id: str
    credential_id: str
    credential_hash: str
    kind: str  # "key" | "session"
    mode: str  # "live" | "test"
    scopes: frozenset[str]
    is_admin: bool = False
    plan: str = "starter"
    agent_id: str | None = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def test_mode(self) -> bool:
        return self.mode == "test"


# --- resolvers -------------------------------------------------------------------------

Resolver = Callable[[str, str], "Principal | None"]  # (token, token_hash) -> Principal
_resolvers: dict[str, Resolver] = {}


def register_resolver(prefix: str, resolver: Resolver) -> None:
    """Register how credentials with ``prefix`` are looked up (e.g. agent sessions)."""
    _resolvers[prefix] = resolver


# whether the paying account has provider keys (BYOK): only then does a completion read them
_HAS_PROVIDER_KEYS = (select(ProviderKey.id).where(ProviderKey.owner_kind == "account",
                                                   ProviderKey.owner_id == Account.id)
                      .limit(1).exists().label("byok"))


def _resolve_key(token: str, token_hash: str) -> Principal | None:
    prefix = token[:9]
    if not secret_is_well_formed(token, prefix):
        return None
    row = db.session.execute(
        select(ApiKey.id, ApiKey.mode, ApiKey.scopes, ApiKey.revoked_at, Account.id,
               Account.is_admin, Account.plan, Account.agent_id, ApiKey.expires_at,
               ApiKey.spend_limit_micros, ApiKey.rotated_to, ApiKey.allowed_models, ApiKey.allowed_modules,
               ApiKey.rpm_limit, ApiKey.tpm_limit, _HAS_PROVIDER_KEYS, ApiKey.member_account_id)
        .join(Account, Account.id == ApiKey.account_id)
        .where(ApiKey.key_hash == token_hash)
    ).first()
    if row is None or row[3] is not None or (row[8] is not None and row[8] <= utcnow()):
        return None
    expected_mode = "test" if prefix == "svc_test_" else "live"
    if row[1] != expected_mode:
        return None
    extra = {"expires_at_epoch": row[8].timestamp()} if row[8] is not None else {}
    head = _rotation_head(row[10]) if row[10] is not None else None  # (id, rpm_limit, tpm_limit)
    if head is not None:  # rotated: its charges count on the newest key's counter, under that
        # key's limit (read in the charge's statement), whether this key's own row has one or not
        extra["spend_limited"], extra["spend_key"] = True, head[0]
    elif row[9] is not None:  # a limit change broadcasts like a revocation: the cache never lags
        extra["spend_limited"] = True
    if row[16] is not None:  # an organisation key: it pays from the organisation, acts as its member
        from app.services.orgs.orgs import member_role

        role = member_role(row[4], row[16])
        if role is None:  # no longer a member (removal revokes the keys too)
            return None
        extra.update(member=row[16], org_role=role)
    # per-key controls: its own allow-lists; rpm/tpm counted on the rotation's newest key's counters
    # under that key's values (a change to it broadcasts for the retiring keys too)
    rpm, tpm = head[1:] if head is not None else (row[13], row[14])
    if any(v is not None for v in (row[11], row[12], rpm, tpm)):
        extra["controls"] = key_controls.of(row[0], head[0] if head is not None else row[0], row[11], row[12],
                                            rpm, tpm)
    if row[15]:  # the account has provider keys of its own (bring your own key)
        extra["byok"] = True
    return Principal(account_id=row[4], credential_id=row[0], credential_hash=token_hash,
                     kind="key", mode=row[1], scopes=frozenset(row[2] or ()),
                     is_admin=bool(row[5]), plan=row[6], agent_id=row[7], extra=extra)



# --- per-process cache + revocation broadcast ------------------------------------------

_cache: dict[str, tuple[float, Principal, float]] = {}  # hash -> (expires_at, principal, hard_expiry)
_cache_lock = threading.Lock()
_state = {"pid": None}
_last_used: dict[str, datetime] = {}
_last_used_lock = threading.Lock()


def _channel(app) -> str:
    return redis_key("revocations", app=app)


def invalidate(token_hash: str) -> None:
    with _cache_lock:
        _cache.pop(token_hash, None)


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


# A broadcast naming an account (plan or admin change) instead of one credential.
_ACCOUNT = "account:"


def invalidate_account(account_id: str) -> None:
    """Drop every cached credential acting for ``account_id`` (its plan, admin flag or
    other account facts carried by the principal changed)."""
    with _cache_lock:
        for token_hash in [h for h, (_, p, _) in _cache.items() if p.account_id == account_id]:
            _cache.pop(token_hash, None)


def _drop(message: str) -> None:
    """Apply one broadcast: a credential hash, or ``account:<id>``."""
    if message.startswith(_ACCOUNT):
        invalidate_account(message[len(_ACCOUNT):])
    else:
        invalidate(message)


def _publish(message: str) -> None:
    r = get_redis()
    if r is not None:
        try:
            r.publish(_channel(current_app), message)
        except Exception:  # Redis down: the cache TTL still bounds it
            log.warning("credential cache broadcast failed; relying on cache TTL")


def broadcast_revocation(*token_hashes: str) -> None:
    """Drop the credentials here and tell every other process (best effort; TTL bounds it)."""
    for token_hash in token_hashes:
        invalidate(token_hash)
        _publish(token_hash)


def broadcast_account_change(account_id: str) -> None:
    """An account's plan or admin flag changed: every process drops the credentials it
    cached for that account, so the next request sees the change (like a revocation:
    about a second, at most ``AUTH_CACHE_TTL`` when a broadcast is lost)."""
    invalidate_account(account_id)
    _publish(_ACCOUNT + account_id)


def _subscriber(app) -> None:
    """Daemon thread: drop cached credentials named on the revocation channel."""
    import redis as redis_lib

    url = app.config["REDIS_URL"]
    while True:
        try:
            client = redis_lib.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=None)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(_channel(app))
            # Anything cached before (re)subscribing may have missed a broadcast.
            clear_cache()
            for message in pubsub.listen():
                data = message.get("data")
                if isinstance(data, bytes):
                    _drop(data.decode())
        except Exception:
            time.sleep(1.0)


def _flusher(app) -> None:
    """Daemon thread: write batched last_used_at values."""
    interval = float(app.config["LAST_USED_FLUSH_SECONDS"])
    while True:
        time.sleep(interval)
        try:
            with app.app_context():
                flush_last_used()
        except Exception:
            log.exception("last_used_at flush failed")


def _ensure_background(app) -> None:
    """Start this process's subscriber/flusher threads once (after a gunicorn fork too)."""
    pid = os.getpid()
    if _state["pid"] == pid:
        return
    with _cache_lock:
        if _state["pid"] == pid:
            return
        _state["pid"] = pid
        _cache.clear()
        if app.config.get("REDIS_URL"):
            threading.Thread(target=_subscriber, args=(app,), name="revocations", daemon=True).start()
        if not app.config.get("TESTING"):
            threading.Thread(target=_flusher, args=(app,), name="last-used", daemon=True).start()


_LOCK_KEYS = text("SELECT id FROM api_keys WHERE id = ANY(CAST(:ids AS varchar[])) ORDER BY id FOR UPDATE")
_SET_LAST_USED = text("""
    UPDATE api_keys k SET last_used_at = greatest(coalesce(k.last_used_at, v.at), v.at)
      FROM unnest(CAST(:ids AS varchar[]), CAST(:ats AS timestamptz[])) AS v(id, at)
     WHERE k.id = v.id""")


def flush_last_used() -> int:
    """Write the buffered last_used_at values; returns how many. One transaction that
    locks the keys' rows in id order first (every process flushes in the same order, so
    two flushes cannot deadlock: they did, with one UPDATE per key in arrival order) and
    never moves a key's time backwards (another process may have flushed a later one)."""
    with _last_used_lock:
        pending = dict(_last_used)
        _last_used.clear()
    if not pending:
        return 0
    ids = sorted(pending)
    with unit_of_work():
        db.session.execute(_LOCK_KEYS, {"ids": ids})
        db.session.execute(_SET_LAST_USED, {"ids": ids, "ats": [pending[i] for i in ids]})
    return len(pending)


def init_app(app) -> None:
    """Register the credential resolvers and start this process's background threads
    (revocation listener, ``last_used_at`` flusher). A worker forked after this restarts
    them on its first request (``_ensure_background`` checks the process id)."""
    from app.services.agents.identity import SESSION_PREFIX, resolve_session

    register_resolver("svc_live_", _resolve_key)
    register_resolver("svc_test_", _resolve_key)
    register_resolver(SESSION_PREFIX, resolve_session)
    _ensure_background(app)


def resolve(token: str) -> Principal | None:
    """Principal for a raw bearer token, or None (unknown, malformed, revoked, expired)."""
    app = current_app._get_current_object()
    _ensure_background(app)
    token_hash = sha256_hex(token)
    now = time.monotonic()
    hit = _cache.get(token_hash)
    if hit is not None and hit[0] > now and hit[2] > time.time():
        return hit[1]
    resolver = _resolvers.get(token[:9])
    if resolver is None:
        return None
    principal = resolver(token, token_hash)
    if principal is not None:
        hard = float(principal.extra.get("expires_at_epoch", float("inf")))
        with _cache_lock:
            _cache[token_hash] = (now + float(app.config["AUTH_CACHE_TTL"]), principal, hard)
    return principal


def parse_bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def bearer_token() -> str | None:
    return parse_bearer(request.headers.get("Authorization"))


def authenticate(token: str | None, optional: bool = False) -> Principal | None:
    """The principal of a bearer ``token`` (None: none was sent), recording its use for
    ``last_used_at``; raises 401 ``Unauthorized`` when there is none unless ``optional``.
    The one credential check of both entries (``current_principal`` and the metered
    call's thin entry, ``app.blueprints.gateway.hotpath``)."""
    principal = resolve(token) if token and len(token) <= 200 else None
    if principal is None:
        if optional:
            return None
        raise Unauthorized("Missing or invalid bearer credential." if token is None
                           else "Invalid, expired or revoked credential.")
    if principal.kind == "key":
        with _last_used_lock:
            _last_used[principal.credential_id] = utcnow()
    return principal


def check_scopes(principal: Principal, scopes) -> None:
    """403 ``insufficient_scope`` unless the principal carries every scope of ``scopes``;
    on an organisation key, 403 ``org_role_required`` unless the member's role allows them
    (``app.services.orgs.roles``)."""
    missing = [s for s in scopes if s not in principal.scopes]
    if missing:
        raise InsufficientScope(f"This route requires scope {', '.join(missing)}.")
    role = principal.extra.get("org_role")
    if role is not None:  # an organisation key: the member's role narrows its scopes
        from app.services.orgs.roles import require_scopes

        require_scopes(role, scopes, principal.account_id)


def current_principal(optional: bool = False) -> Principal | None:
    """The authenticated principal of this request (resolving it once)."""
    if "principal" in g:
        return g.principal
    principal = authenticate(bearer_token(), optional)
    g.principal = principal
    if principal is not None:
        g.account_id = principal.account_id
    return principal


# --- route decorator -----------------------------------------------------------------

def _document(func, scopes: tuple[str, ...], admin: bool, public: bool):
    """Record security, required scopes and the auth error responses in the route's
    OpenAPI operation (flask-smorest's ``_apidoc``)."""
    doc: dict = {}
    errors: list[int] = []
    if public:
        doc["security"] = []
    else:
        doc["security"] = [{SECURITY_SCHEME: list(scopes) + (["admin"] if admin else [])}]
        errors = [401, 429] + ([403] if scopes or admin else [])
        text = "Requires a bearer credential"
        if scopes:
            text += " with scope " + ", ".join(f"`{s}`" for s in scopes)
        if admin:
            text += " and a live key of an admin account carrying scope `admin`"
        doc["x-required-scopes"] = list(scopes)
        doc["x-admin-only"] = admin
        doc["x-auth"] = text + "."
    wrapped = _SmorestBlueprint.doc(**doc)(func)
    responses = wrapped._apidoc.setdefault("response", {}).setdefault("responses", {})
    for status in errors:
        # a status the route documents itself keeps its text (flask-smorest would let the
        # named response win over it)
        if not responses.get(status):
            responses[status] = [{401: "UNAUTHORIZED", 403: "FORBIDDEN", 429: "TOO_MANY_REQUESTS"}[status]]
    return wrapped


def authenticated(*scopes: str, admin: bool = False, rate_limit: bool = True):
    """Require a bearer credential with ``scopes``; with ``admin``, a LIVE key of an admin
    account that carries the explicit ``admin`` scope (403 otherwise).

    Sets ``g.principal``; the route receives nothing extra. Also documents the route's
    security requirement, required scopes and 401/403/429 responses in OpenAPI.
    """
    def decorator(func):
        @wraps(func)
        def wrapper(*args, **kwargs):
            principal = current_principal()
            check_scopes(principal, scopes)
            if admin:
                _check_admin(principal)
            if rate_limit:
                ratelimits.per_credential(principal)
            return func(*args, **kwargs)

        return _document(wrapper, scopes, admin, public=False)

    return decorator


def _check_admin(principal: Principal) -> None:
    """Admin routes: an admin account, a live key (never test mode, never an agent
    session), and the explicit ``admin`` scope."""
    from app.scopes import ADMIN_SCOPE

    if not principal.is_admin:
        raise Forbidden("This route is for admin accounts only.")
    if principal.mode != "live" or principal.kind != "key":
        raise Forbidden("Admin routes need a live key (svc_live_) of an admin account.")
    if ADMIN_SCOPE not in principal.scopes:
        raise InsufficientScope("This route requires scope admin (mint a live key with scope admin).")


def public(func):
    """Mark a route as needing no credential (documented with ``security: []``)."""
    return _document(func, (), False, public=True)


def key_of(p: Principal) -> str | None:
    """The API key id whose spend limit applies to a key credential's charges: its own, or
    for a rotated key still in its overlap the newest key of its rotation (which carried
    the count over: old and new key share one limit, the newest key's, even when the old
    key's own row has none: a limit set on the new key holds the old one too). An
    organisation key always has one:
    its charges count in its member's month (the member's budget, read by the engine in
    the charge's statement). None for a session or a personal key without a limit, so
    unlimited calls (of a key never rotated) skip the limit's statements altogether."""
    if p.kind != "key" or not (p.extra.get("spend_limited") or p.extra.get("member")):
        return None
    return p.extra.get("spend_key") or p.credential_id


def person_of(p: Principal) -> str:
    """The person behind a credential: the member who owns an organisation key, else the
    credential's own account (who a receipt names as ``actor_account_id``)."""
    return p.extra.get("member") or p.account_id


def controls_of(p: Principal):
    """The key's controls (``key_controls.KeyControls``: allow-lists, rpm/tpm), or None."""
    return p.extra.get("controls")


def _rotation_head(key_id: str) -> tuple[str, int | None, int | None]:
    """The newest key of a rotation, following ``rotated_to`` from ``key_id``: its id, rpm and
    tpm limits."""
    for hops in range(33):  # a chain is as long as the rotations within one overlap (32 hops at most)
        row = db.session.execute(select(ApiKey.rotated_to, ApiKey.rpm_limit, ApiKey.tpm_limit)
                                 .where(ApiKey.id == key_id)).first()
        if row is None:
            break
        if row[0] is None or hops == 32:
            return key_id, row[1], row[2]
        key_id = row[0]
    return key_id, None, None


def principal() -> Principal:
    """The principal set by ``@authenticated`` (for use inside route methods)."""
    return g.principal

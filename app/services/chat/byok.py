"""Bring your own key (docs/chat.md "Bring your own key"): an owner's own provider keys,
stored encrypted, and what routing needs of them.

* ``add_key`` checks the key with one cheap call to the provider (its model list) before
  anything is stored, then stores it sealed (``platform.crypto.seal``: SecretBox under
  ``BYOK_ENCRYPTION_KEY``, or a key derived from ``SECRET_KEY`` when that is unset); only
  its first characters (``prefix``) are ever shown again.
* Owners: ``owner_kind`` ``account`` today (the paying account); an organisation (issue 37)
  becomes another kind of owner with the same rows and settings.
* ``own_keys`` (one query, only for credentials whose account has provider keys: the
  principal says so) gives routing the keys in clear for one request
  (``catalog.OwnKeys``); a key that no longer decrypts (the encryption key changed) is
  skipped and logged.
* Rotating the encryption key (docs/operations.md "Rotating the BYOK encryption key"):
  keys are read under the current key, then under each of ``BYOK_PREVIOUS_KEYS``, then
  (when ``BYOK_ENCRYPTION_KEY`` is set) under the key derived from ``SECRET_KEY``, the
  default before an explicit key was set; ``reseal`` (``flask chat reseal-keys``) seals
  every stored key under the current one, after which the previous keys can go.
* A completion served with an own key is charged the platform fee
  (``CHAT_BYOK_FEE_PERCENT`` % of its exact cost at the model's price, rounded half up once
  to a micro) instead of the price; ``mark`` records the key and the list cost on the
  completion row before the settle (so a settled BYOK row always says so).

Entry points (each one unit of work): ``add_key``, ``list_keys``, ``delete_key``,
``update_settings``; ``own_keys`` and ``mark`` are the completion's reads and write.
"""
from __future__ import annotations

import hashlib
import logging
import re
from decimal import Decimal

from flask import current_app
from sqlalchemy import select, update

from app.errors import Conflict, DomainError, Forbidden, InvalidRequest, NotFound, UpstreamError
from app.extensions import db
from app.ids import new_id
from app.models import Account, ChatCompletion, ProviderKey
from app.models.base import utcnow
from app.services.chat import providers
from app.services.chat.catalog import OwnKeys, catalog
from app.services.platform import crypto
from app.services.platform.uow import transactional, unit_of_work
from config import byok_previous_keys

log = logging.getLogger(__name__)

OWNER_ACCOUNT = "account"
PREFIX_LEN = 8  # characters of the provider key shown (e.g. "sk-proj-")
MIN_KEY_LEN, MAX_KEY_LEN = 8, 512
KEY_PATTERN = "^[!-~]{%d,%d}$" % (MIN_KEY_LEN, MAX_KEY_LEN)  # what provider keys are made of
KEY_RE = re.compile(KEY_PATTERN)


class ProviderKeyInvalid(DomainError):
    # 422: a well-formed key that the world outside refuses, not a malformed request (issue 42 item 12)
    status, code, message = 422, "provider_key_invalid", "The provider refused this key."
    description = ("Bring your own key: the provider answered 401/403 to the key's check call; nothing was "
                   "stored.")


class ProviderKeyExists(Conflict):
    code = "provider_key_exists"
    description = "Bring your own key: the account already has a key for this provider; delete it first."


def _box_key() -> bytes:
    """The 32-byte SecretBox key that seals: ``BYOK_ENCRYPTION_KEY`` (64 hex characters),
    or derived from ``SECRET_KEY`` (BLAKE2b, personalised) when unset."""
    return _box_keys()[0]


def _box_keys() -> list[bytes]:
    """The keys a stored provider key may be sealed under, the current one first: then
    ``BYOK_PREVIOUS_KEYS`` in their order, then, when ``BYOK_ENCRYPTION_KEY`` is set, the
    key derived from ``SECRET_KEY`` (what sealed keys before an explicit key was set)."""
    cfg = current_app.config
    derived = derived_key(cfg["SECRET_KEY"])
    raw = cfg.get("BYOK_ENCRYPTION_KEY")
    keys = [bytes.fromhex(raw)] if raw else [derived]
    keys += [bytes.fromhex(k) for k in byok_previous_keys(cfg.get("BYOK_PREVIOUS_KEYS"))]
    if raw:
        keys.append(derived)
    return list(dict.fromkeys(keys))  # each once, in order


def derived_key(secret_key) -> bytes:
    """The SecretBox key derived from ``SECRET_KEY`` (BLAKE2b, personalised): the sealing
    key while ``BYOK_ENCRYPTION_KEY`` is unset."""
    return hashlib.blake2b(str(secret_key).encode(), digest_size=32, person=b"gw-byok-v1").digest()


def _unseal(keys: list[bytes], sealed: bytes) -> tuple[str | None, int]:
    """(the key in clear, the index in ``keys`` of the key that opened it: 0 = the current
    one), or (None, -1) when none of them does."""
    for n, box in enumerate(keys):
        text = crypto.unseal(box, sealed)
        if text is not None:
            return text, n
    return None, -1


def _live(mode: str) -> None:
    if mode != "live":
        raise Forbidden("Provider keys serve live-mode completions only (test keys reach the sandbox "
                        "provider); manage them with a live key.")


def _provider(provider_id: str):
    prov = catalog().providers.get(provider_id) if isinstance(provider_id, str) else None
    if prov is None or not prov.base_url:
        known = sorted(p.id for p in catalog().providers.values() if p.base_url)
        # catalog data: a provider that does not exist (404, like an unknown module)
        raise NotFound(f"provider: no such provider in the chat catalog (one of {', '.join(known)}).",
                       param="provider")
    return prov


def settings(account_id: str) -> dict:
    """The owner's BYOK settings: ``byok_only``, ``byok_fallback``."""
    row = db.session.execute(select(Account.byok_only, Account.byok_fallback)
                             .where(Account.id == account_id)).one()
    return {"byok_only": bool(row[0]), "byok_fallback": bool(row[1])}


def list_keys(account_id: str, mode: str) -> dict:
    """``GET /api/provider-keys``: the owner's keys (prefix only) and settings."""
    _live(mode)
    rows = db.session.execute(select(ProviderKey).where(ProviderKey.owner_kind == OWNER_ACCOUNT,
                                                        ProviderKey.owner_id == account_id)
                              .order_by(ProviderKey.provider)).scalars().all()
    return {"provider_keys": list(rows), **settings(account_id)}


def add_key(account_id: str, mode: str, provider_id: str, api_key: str) -> ProviderKey:
    """``POST /api/provider-keys``: check the key with the provider (no transaction open),
    then store it sealed. 404 for a provider not in the catalog, 422 ``provider_key_invalid``
    when the provider refuses it, 502 ``provider_error`` when it cannot be checked, 409
    ``provider_key_exists``."""
    _live(mode)
    prov = _provider(provider_id)
    if not isinstance(api_key, str) or not KEY_RE.fullmatch(api_key):
        raise InvalidRequest(f"api_key: {MIN_KEY_LEN} to {MAX_KEY_LEN} visible ASCII characters (no spaces).",
                             param="api_key")
    with unit_of_work():
        _no_key_yet(account_id, prov.id)
    try:
        providers.check_key(prov, api_key)
    except providers.UpstreamRejected as exc:
        raise ProviderKeyInvalid(f"{prov.id} refused this key (HTTP {exc.status}): {str(exc)[:200]}; "
                                 "nothing was stored.") from None
    except providers.ProviderFailure as exc:
        raise UpstreamError(f"The key could not be checked ({exc}); nothing was stored. Retry later.") from None
    now = utcnow()
    row = ProviderKey(id=new_id("pkey"), owner_kind=OWNER_ACCOUNT, owner_id=account_id, provider=prov.id,
                      ciphertext=crypto.seal(_box_key(), api_key), prefix=api_key[:PREFIX_LEN],
                      created_at=now, checked_at=now)
    with unit_of_work():
        _no_key_yet(account_id, prov.id)  # a concurrent add: the unique constraint is the last word
        db.session.add(row)
    _changed(account_id)
    return row


def _no_key_yet(account_id: str, provider_id: str) -> None:
    taken = db.session.execute(select(ProviderKey.id).where(
        ProviderKey.owner_kind == OWNER_ACCOUNT, ProviderKey.owner_id == account_id,
        ProviderKey.provider == provider_id)).scalar()
    if taken:
        raise ProviderKeyExists(f"The account already has a {provider_id} key ({taken}); delete it first.")


def delete_key(account_id: str, mode: str, key_id: str) -> ProviderKey:
    """``DELETE /api/provider-keys/{id}``: the key is erased (ciphertext included);
    another owner's id is 404."""
    _live(mode)
    with unit_of_work():
        row = db.session.get(ProviderKey, key_id) if isinstance(key_id, str) and len(key_id) <= 32 else None
        if row is None or row.owner_kind != OWNER_ACCOUNT or row.owner_id != account_id:
            raise NotFound("No such provider key.")
        db.session.delete(row)
    _changed(account_id)
    return row


def update_settings(account_id: str, mode: str, changes: dict) -> dict:
    """``PATCH /api/provider-keys/settings``: ``byok_only``, ``byok_fallback`` (booleans)."""
    _live(mode)
    values = {k: changes[k] for k in ("byok_only", "byok_fallback") if k in changes}
    if not values:
        raise InvalidRequest("Nothing to change: send byok_only and/or byok_fallback.")
    for k, v in values.items():
        if not isinstance(v, bool):
            raise InvalidRequest(f"{k}: must be true or false.", param=k)
    with unit_of_work():
        db.session.execute(update(Account).where(Account.id == account_id).values(**values))
    _changed(account_id)
    with unit_of_work():
        return settings(account_id)


def _changed(account_id: str) -> None:
    """Every worker re-reads the account's credentials (whether it has provider keys)."""
    from app import auth

    auth.broadcast_account_change(account_id)


def fee_pct() -> Decimal:
    return Decimal(str(current_app.config["CHAT_BYOK_FEE_PERCENT"]))


@transactional
def own_keys(account_id: str, *, unseal: bool = True) -> OwnKeys | None:
    """The owner's provider keys in clear and settings, for one completion (None: none).
    ``unseal=False``: which providers they are for, without opening a key (each key's
    secret None; ``GET /v1/models``, where ``OwnKeys.offers`` names the offers they serve)."""
    rows = db.session.execute(
        select(ProviderKey.id, ProviderKey.provider, ProviderKey.ciphertext, Account.byok_only,
               Account.byok_fallback)
        .join(Account, Account.id == ProviderKey.owner_id)
        .where(ProviderKey.owner_kind == OWNER_ACCOUNT, ProviderKey.owner_id == account_id)).all()
    if not rows:
        return None
    boxes, keys = _box_keys() if unseal else None, {}
    for key_id, provider_id, sealed, _, _ in rows:
        api_key = _unseal(boxes, sealed)[0] if unseal else None
        if unseal and api_key is None:
            log.error("provider key %s of %s does not decrypt under BYOK_ENCRYPTION_KEY or "
                      "BYOK_PREVIOUS_KEYS; skipped", key_id, account_id)
            continue
        keys[provider_id] = (key_id, api_key)
    return OwnKeys(keys=keys, only=bool(rows[0][3]), fallback=bool(rows[0][4]) and not rows[0][3],
                   fee_pct=fee_pct())


_COMPLETIONS = ChatCompletion.__table__


@transactional
def mark(completion_id: str, created_at, byok_key_id: str, list_cost_micros: int) -> None:
    """Record on the ``held`` completion that an own key served it and its list cost,
    before the settle charges the fee (a crash in between leaves a held row the sweep
    releases: nothing charged either way)."""
    where = [_COMPLETIONS.c.id == completion_id, _COMPLETIONS.c.status == "held"]
    if created_at is not None:
        where.append(_COMPLETIONS.c.created_at == created_at)
    db.session.execute(update(_COMPLETIONS).where(*where)
                       .values(byok_key_id=byok_key_id, list_cost_micros=list_cost_micros))


def reseal(batch: int = 500) -> dict:
    """Seal every stored provider key under the current encryption key (``flask chat
    reseal-keys``, after a rotation: docs/operations.md). Keys are read as ``own_keys``
    reads them; one unit of work per ``batch`` rows, in id order, so a long run holds no
    long transaction and can be stopped and run again (a key already under the current
    key is left as it is). A row is rewritten only if its ciphertext is still the one read
    (a key deleted or replaced meanwhile is not touched). Returns the counts:
    ``resealed``, ``current`` (already under the current key) and ``unreadable`` (under
    none of the configured keys: left unchanged, ids in ``unreadable_ids``; their owners
    must add them again)."""
    boxes = _box_keys()
    out = {"resealed": 0, "current": 0, "unreadable": 0, "unreadable_ids": []}
    last = ""
    while True:
        with unit_of_work():
            rows = db.session.execute(select(ProviderKey.id, ProviderKey.ciphertext)
                                      .where(ProviderKey.id > last).order_by(ProviderKey.id)
                                      .limit(batch)).all()
            for key_id, sealed in rows:
                api_key, n = _unseal(boxes, sealed)
                if n == 0:
                    out["current"] += 1
                elif api_key is None:
                    out["unreadable"] += 1
                    out["unreadable_ids"].append(key_id)
                else:
                    done = db.session.execute(
                        update(ProviderKey).where(ProviderKey.id == key_id, ProviderKey.ciphertext == sealed)
                        .values(ciphertext=crypto.seal(boxes[0], api_key))
                        .execution_options(synchronize_session=False))
                    out["resealed"] += done.rowcount
        if len(rows) < batch:
            return out
        last = rows[-1][0]

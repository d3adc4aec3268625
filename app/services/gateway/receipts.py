"""Signed receipts: canonical JSON of a call's facts, SHA-256 ``hash``, ed25519 ``sig``.

Signing keys
* ``RECEIPT_SIGNING_KEY`` (base64 of a 32-byte ed25519 seed) when set: the active key.
  Multi-node production deployments set it (every node must sign with the same key);
  public keys of retired keys are published from ``RECEIPT_RETIRED_PUBLIC_KEYS``
  (comma-separated base64 public keys).
* Otherwise a keyring file ``<INSTANCE_PATH>/receipt_keys.json`` is generated once
  (created atomically, mode 0600). ``flask receipts rotate-key`` adds a new active key
  and keeps only the *public* half of the previous one, which stays published.
A key id (``kid``) is ``k_`` + the first 16 hex digits of SHA-256 over the public key,
so it is the same wherever the key lives.

What is signed (receipt version 2) — every field is in the call response:
``{"v", "kid", "call_id", "account_id", "actor", "actor_account_id", "module", "action",
"cost_cents", "result_sha256", "ok", "mode", "ts"}`` where ``account_id`` is the account
that paid (an organisation for an organisation key), ``actor`` the credential that acted
(the API key or agent session id; null when none), ``actor_account_id`` the person behind
it (an organisation key's member, else the paying account itself), and ``result_sha256``
the SHA-256 hex of the canonical JSON of ``result``. Version 1 (receipts signed before
2026-11-28) signed the same facts without ``actor`` and ``actor_account_id``; such
receipts still verify (``verify_response`` rebuilds the facts of the receipt's own ``v``;
docs/decisions.md, "Receipts name the payer and the actor"). Canonical JSON = ``json.dumps(x, sort_keys=True, separators=(",", ":"),
ensure_ascii=False).encode("utf-8")``. ``hash`` = SHA-256 hex of the canonical facts;
``sig`` = base64 ed25519 signature over the canonical facts' bytes.
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass

import orjson
from flask import current_app
from nacl.signing import SigningKey

from app.jsonutil import isoformat
from app.models.base import utcnow
from app.services.platform import crypto

log = logging.getLogger(__name__)

RECEIPT_VERSION = 2
KEYRING_FILE = "receipt_keys.json"
_RELOAD_SECONDS = 5.0
# the signed facts of each receipt version a verifier accepts
VERSION_FIELDS = {
    1: ("v", "kid", "call_id", "account_id", "module", "action", "cost_cents", "result_sha256", "ok", "mode", "ts"),
    2: ("v", "kid", "call_id", "account_id", "actor", "actor_account_id", "module", "action", "cost_cents",
        "result_sha256", "ok", "mode", "ts"),
}
SIGNED_FIELDS = VERSION_FIELDS[RECEIPT_VERSION]


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def canonical_facts(f: dict) -> bytes:
    """``canonical`` of a receipt's facts (strings, integers and booleans only), ~10x
    cheaper: for such values orjson with sorted keys writes the same bytes as
    ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` (same
    escapes, UTF-8, keys in code-point order; checked over every code point by
    tests/services/test_receipts.py). Not for ``result``: floats are written differently
    (``1e+16`` against ``1e16``). Anything orjson refuses (a lone surrogate, an integer
    beyond 64 bits) goes to ``canonical``, which decides as before."""
    try:
        return orjson.dumps(f, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return canonical(f)


def kid_for(public_key: bytes) -> str:
    return "k_" + hashlib.sha256(public_key).hexdigest()[:16]


@dataclass(frozen=True)
class Keyring:
    active_kid: str
    signer: SigningKey
    public: dict  # kid -> {"public_key": b64, "created_at": str, "active": bool}


_lock = threading.Lock()
_state: dict = {"ring": None, "loaded_at": 0.0, "source": None}


def _keyring_path() -> str:
    return os.path.join(current_app.config["INSTANCE_PATH"], KEYRING_FILE)


def _new_entry(signer: SigningKey) -> tuple[str, dict]:
    pub = bytes(signer.verify_key)
    return kid_for(pub), {"seed": base64.b64encode(bytes(signer)).decode(),
                          "public_key": base64.b64encode(pub).decode(),
                          "created_at": isoformat(utcnow())}


def _write_new_file(path: str, data: dict, exclusive: bool) -> bool:
    """Write ``data`` to ``path`` atomically (0600). With ``exclusive`` only if absent."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
    try:
        if exclusive:
            try:
                os.link(tmp, path)  # fails if another process created it first
            except FileExistsError:
                return False
            return True
        os.replace(tmp, path)
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load_file(path: str) -> dict:
    if not os.path.exists(path):
        kid, entry = _new_entry(SigningKey.generate())
        _write_new_file(path, {"active": kid, "keys": {kid: entry}}, exclusive=True)
    with open(path) as fh:
        return json.load(fh)


def _build() -> Keyring:
    env_seed = current_app.config.get("RECEIPT_SIGNING_KEY")
    if env_seed:
        signer = SigningKey(base64.b64decode(env_seed))
        kid = kid_for(bytes(signer.verify_key))
        public = {kid: {"public_key": base64.b64encode(bytes(signer.verify_key)).decode(),
                        "active": True}}
        for item in (current_app.config.get("RECEIPT_RETIRED_PUBLIC_KEYS") or "").split(","):
            item = item.strip()
            if item:
                public.setdefault(kid_for(base64.b64decode(item)),
                                  {"public_key": item, "active": False})
        return Keyring(kid, signer, public)
    if current_app.config.get("PRODUCTION") and not _state.get("warned"):
        _state["warned"] = True
        log.warning("RECEIPT_SIGNING_KEY is not set: receipts are signed with a key generated in "
                    "%s; every node of a multi-node deployment needs the same key", _keyring_path())
    data = _load_file(_keyring_path())
    active = data["active"]
    signer = SigningKey(base64.b64decode(data["keys"][active]["seed"]))
    public = {kid: {"public_key": e["public_key"], "created_at": e.get("created_at"),
                    "active": kid == active} for kid, e in data["keys"].items()}
    return Keyring(active, signer, public)


def keyring() -> Keyring:
    """The signing keyring of this process (reloaded every few seconds, so a rotation
    by the CLI reaches running workers)."""
    now = time.monotonic()
    ring = _state["ring"]
    source = (current_app.config.get("RECEIPT_SIGNING_KEY"), current_app.config["INSTANCE_PATH"])
    if ring is not None and now - _state["loaded_at"] < _RELOAD_SECONDS and _state["source"] == source:
        return ring
    with _lock:
        ring = _build()
        _state.update(ring=ring, loaded_at=now, source=source)
    return ring


def reset_cache() -> None:
    _state.update(ring=None, loaded_at=0.0, source=None)


def rotate_key() -> str:
    """Make a new active key in the instance keyring; the previous public key stays
    published. Returns the new kid. Not available when RECEIPT_SIGNING_KEY is set."""
    if current_app.config.get("RECEIPT_SIGNING_KEY"):
        raise RuntimeError("RECEIPT_SIGNING_KEY is set: rotate by setting a new seed there and "
                           "adding the old public key to RECEIPT_RETIRED_PUBLIC_KEYS.")
    path = _keyring_path()
    with _lock:
        data = _load_file(path)
        for entry in data["keys"].values():
            entry.pop("seed", None)  # retired keys: only the public half is kept
        kid, entry = _new_entry(SigningKey.generate())
        data["keys"][kid] = entry
        data["active"] = kid
        _write_new_file(path, data, exclusive=False)
    reset_cache()
    return kid


def public_keys() -> list[dict]:
    ring = keyring()
    return [{"kid": kid, "alg": "ed25519", "public_key": e["public_key"], "active": e["active"],
             "created_at": e.get("created_at")}
            for kid, e in sorted(ring.public.items(), key=lambda kv: (not kv[1]["active"], kv[0]))]


def result_digest(result) -> str:
    return hashlib.sha256(canonical(result)).hexdigest()


def facts(*, kid: str, call_id: str, account_id: str, module: str, action: str,
          cost_cents: int, result, ok: bool, mode: str, ts: str, actor: str | None = None,
          actor_account_id: str | None = None, v: int = RECEIPT_VERSION) -> dict:
    """The signed facts of receipt version ``v`` (1: without the actor)."""
    f = {"v": v, "kid": kid, "call_id": call_id, "account_id": account_id,
         "module": module, "action": action, "cost_cents": int(cost_cents),
         "result_sha256": result_digest(result), "ok": bool(ok), "mode": mode, "ts": ts}
    if v >= 2:
        f.update(actor=actor, actor_account_id=actor_account_id)
    return f


def sign(*, call_id: str, account_id: str, module: str, action: str, cost_cents: int,
         result, ok: bool, mode: str, ts: str | None = None, actor: str | None = None,
         actor_account_id: str | None = None) -> dict:
    """The receipt object of a call response: ``hash``, ``sig`` and the fields a verifier
    needs besides the response's top-level ``module``, ``call_id``, ``cost_cents``, ``ok``,
    ``result``. ``account_id`` paid; ``actor`` (the credential) and ``actor_account_id``
    (the person behind it; default: the paying account) acted."""
    ring = keyring()
    ts = ts or isoformat(utcnow())
    actor_account_id = actor_account_id or account_id
    f = facts(kid=ring.active_kid, call_id=call_id, account_id=account_id, module=module,
              action=action, cost_cents=cost_cents, result=result, ok=ok, mode=mode, ts=ts,
              actor=actor, actor_account_id=actor_account_id)
    msg = canonical_facts(f)
    return {"hash": hashlib.sha256(msg).hexdigest(),
            "sig": base64.b64encode(ring.signer.sign(msg).signature).decode(),
            "v": RECEIPT_VERSION, "kid": ring.active_kid, "alg": "ed25519", "ts": ts,
            "account_id": account_id, "actor": actor, "actor_account_id": actor_account_id,
            "action": action, "mode": mode}


class ReceiptInvalid(ValueError):
    pass


def verify_response(response: dict, public_keys_by_kid: dict[str, str]) -> dict:
    """Verify a saved call response against published keys (kid -> base64 public key).
    Returns the signed facts; raises ReceiptInvalid."""
    try:
        r = response["receipt"]
        if not isinstance(r, dict):
            raise ReceiptInvalid("not a call response with a receipt: `receipt` is not an object")
        v = r.get("v", 1)
        if isinstance(v, bool) or v not in VERSION_FIELDS:
            raise ReceiptInvalid(f"unsupported receipt version {v}")
        # the values as signed, not lookalikes ("false" or 1 for a boolean, 2.9 or "2" for 2)
        if not isinstance(response["ok"], bool) or type(response["cost_cents"]) is not int:
            raise ReceiptInvalid("`ok` must be a boolean and `cost_cents` an integer, as the receipt signs them")
        actors = {"actor": r["actor"], "actor_account_id": r["actor_account_id"]} if v >= 2 else {}
        f = facts(kid=r["kid"], call_id=response["call_id"], account_id=r["account_id"],
                  module=response["module"], action=r["action"], cost_cents=response["cost_cents"],
                  result=response["result"], ok=response["ok"], mode=r["mode"], ts=r["ts"], v=v, **actors)
        claimed = r["hash"]
        msg = canonical(f)
    except (KeyError, TypeError) as exc:
        raise ReceiptInvalid(f"not a call response with a receipt: missing {exc}") from None
    except UnicodeEncodeError:  # a lone surrogate: no response the gateway signed holds one
        raise ReceiptInvalid("hash does not match the response's fields") from None
    if hashlib.sha256(msg).hexdigest() != claimed:
        raise ReceiptInvalid("hash does not match the response's fields")
    pub = public_keys_by_kid.get(r["kid"]) if isinstance(r["kid"], str) else None
    if pub is None:
        raise ReceiptInvalid(f"unknown key id {r['kid']}")
    try:
        pub_raw, sig_raw = base64.b64decode(pub), base64.b64decode(r["sig"])
    except (ValueError, TypeError):
        raise ReceiptInvalid("signature does not verify") from None
    if not crypto.ed25519_verify(pub_raw, msg, sig_raw):
        raise ReceiptInvalid("signature does not verify")
    return f

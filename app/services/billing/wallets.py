"""Wallets: connect an on-chain wallet by signed message (EIP-4361 for EVM, ed25519 for
Solana), read its USDC balance, USDC deposit instructions, the deposit watcher
(``eth_getLogs``; credited once per (chain, tx, log index)) and the account's ledger
transactions."""
from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from urllib.parse import urlparse

from eth_utils import to_checksum_address
from flask import current_app
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from app.errors import Conflict, DomainError, Forbidden, InvalidRequest, ServiceUnavailable, Unprocessable
from app.extensions import db, get_redis, redis_key
from app.ids import new_id, random_b62
from app.models import ChainCursor, LedgerEntry, LedgerTransaction, Payment, Wallet, X402Authorization
from app.models.base import utcnow
from app.services.billing import chains
from app.services.money import outside
from app.services.money import ledger
from app.services.billing.payments import FundResult, credit_payment, fund_result
from app.services.platform import crypto, tokens
from app.services.platform.uow import transactional, unit_of_work

log = logging.getLogger(__name__)


class NonceInvalid(DomainError):
    status, code, message = 409, "nonce_invalid", "No valid wallet-connect message."
    description = ("No usable wallet-connect message: unknown, expired, already used or for another "
                   "chain/address (stored state: get one from `GET /api/wallet/connect/message`).")


class SignatureInvalid(DomainError):
    status, code, message = 401, "signature_invalid", "The signature does not verify."
    description = "The wallet signature does not verify for the address."


class WalletNotConnected(DomainError):
    # 409: a state of the account, not a malformed request (issue 42 item 12)
    status, code, message = 409, "wallet_not_connected", "No wallet is connected."
    description = "The operation needs a connected wallet (POST /api/wallet/connect)."


# --- connect -------------------------------------------------------------------------

def _message(chain: str, address: str, account_id: str, nonce: str, issued, expires) -> str:
    base = current_app.config["BASE_URL"].rstrip("/")
    domain = urlparse(base).netloc or "gateway"
    family = "Ethereum" if chain in chains.EVM_CHAINS else "Solana"
    chain_id = chains.CHAIN_IDS.get(chain, "mainnet")
    return (f"{domain} wants you to sign in with your {family} account:\n{address}\n\n"
            f"Connect this wallet to gateway account {account_id} ({chain}).\n\n"
            f"URI: {base}/api/wallet/connect\nVersion: 1\nChain ID: {chain_id}\nNonce: {nonce}\n"
            f"Issued At: {issued.strftime('%Y-%m-%dT%H:%M:%SZ')}\n"
            f"Expiration Time: {expires.strftime('%Y-%m-%dT%H:%M:%SZ')}")


def _subject(account_id: str, chain: str, address_key: str) -> str:
    return f"{account_id}:{chain}:{address_key}"


def _nonce_of(row) -> str:
    """The nonce a connect-message token was issued with, derived again from its salt."""
    return tokens.keyed_token(tokens.WALLET_CONNECT, row.data["salt"])


@transactional
def connect_message(account_id: str, chain: str, address: str) -> dict:
    """Issue the single-use message the wallet must sign (EIP-4361 text).

    Its nonce is a single-use token stored hashed; it is derived from a random salt with
    SECRET_KEY (``tokens.keyed_token``) so that ``connect`` can rebuild the message when
    the client sends only chain, address and signature, while a database reader learns
    no pending nonce."""
    display, key = chains.normalize_address(chain, address)
    now = utcnow().replace(microsecond=0)
    ttl = int(current_app.config["WALLET_NONCE_TTL_SECONDS"])
    expires = now + timedelta(seconds=ttl)
    salt = random_b62(22)
    nonce = tokens.keyed_token(tokens.WALLET_CONNECT, salt)
    tokens.issue(tokens.WALLET_CONNECT, _subject(account_id, chain, key), ttl,
                 {"salt": salt, "address": display}, token=nonce, now=now)
    return {"message": _message(chain, display, account_id, nonce, now, expires), "nonce": nonce,
            "expires_at": expires, "chain": chain, "address": display}


def _verify_signature(chain: str, address_key: str, message: str, signature: str) -> None:
    """Raise unless ``signature`` is the wallet's signature of ``message``: EIP-191 for EVM
    chains, ed25519 over the UTF-8 text for Solana (canonical base58, ``base58:`` optional)."""
    if not isinstance(signature, str):
        signature = ""
    if chain in chains.EVM_CHAINS:
        raw = crypto.evm_signature(signature)
        if raw is None:
            raise Unprocessable("signature: a 0x-prefixed 65-byte hex EIP-191 signature is required.",
                                param="signature")
        recovered = crypto.recover_personal_message(message, raw)
        if recovered is None:
            raise SignatureInvalid("The signature cannot be recovered.")
        if recovered.lower() != address_key:
            raise SignatureInvalid("The signature was not made by this address.")
        return
    text = signature[len("base58:"):] if signature.startswith("base58:") else signature
    raw = crypto.b58decode(text, crypto.ED25519_SIG_BYTES)
    if raw is None:
        raise Unprocessable("signature: the canonical base58 encoding of a 64-byte ed25519 signature "
                            "is required.", param="signature")
    key = crypto.b58decode(address_key, crypto.ED25519_KEY_BYTES)
    if key is None or not crypto.ed25519_verify(key, message.encode("utf-8"), raw):
        raise SignatureInvalid("The signature was not made by this address.")


def connect(account_id: str, chain: str, address: str, signature: str, nonce: str | None = None,
            mode: str = "live") -> Wallet:
    """Attach the wallet (see ``_connect``); one unit of work. An address that a concurrent
    request attached to another account first is a 409. Live mode only: the account's one
    wallet attributes real USDC deposits to the live balance, which a test key must not
    change (DESIGN §5)."""
    if mode != "live":
        raise Forbidden("The wallet attributes real USDC deposits to the live balance: connect it "
                        "with a live key (svc_live_).")
    try:
        return _connect(account_id, chain, address, signature, nonce)
    except IntegrityError:
        raise Conflict("This address is connected to another account.") from None


@transactional
def _connect(account_id: str, chain: str, address: str, signature: str, nonce: str | None) -> Wallet:
    """Attach the wallet after verifying the signature over the issued message (the
    latest one for this chain and address, or the one whose ``nonce`` is given). The
    signature is checked first; only then is the message consumed (``tokens.consume``),
    in the same transaction that attaches the wallet: a bad signature burns nothing, a
    replay or a second concurrent use fails."""
    display, key = chains.normalize_address(chain, address)
    subject = _subject(account_id, chain, key)
    if nonce:
        row = tokens.lookup(tokens.WALLET_CONNECT, nonce)
        row = row if tokens.is_usable(row) and row.subject == subject else None
    else:
        row = tokens.find_usable(tokens.WALLET_CONNECT, subject)
    if row is None:
        raise NonceInvalid("No unused, unexpired connect message for this chain and address; "
                           "get one from GET /api/wallet/connect/message.")
    issued_nonce = _nonce_of(row)
    issued = row.created_at.replace(microsecond=0)
    _verify_signature(chain, key, _message(chain, row.data["address"], account_id, issued_nonce, issued,
                                           row.expires_at), signature)
    if tokens.consume(tokens.WALLET_CONNECT, issued_nonce) is None:
        raise NonceInvalid("This connect message was already used.")
    other = db.session.execute(select(Wallet).where(Wallet.address_key == key)).scalar_one_or_none()
    if other is not None and other.account_id != account_id:
        raise Conflict("This address is connected to another account.")
    wallet = db.session.execute(select(Wallet).where(Wallet.account_id == account_id)).scalar_one_or_none()
    if wallet is None:
        wallet = Wallet(id=new_id("wal"), account_id=account_id)
        db.session.add(wallet)
    before = {"chain": wallet.chain, "address": wallet.address} if wallet.address else None
    wallet.chain, wallet.address, wallet.address_key, wallet.connected_at = chain, display, key, utcnow()
    from app.services.orgs import audit

    audit.record(account_id, None, "wallet.connect", wallet.id, before=before,
                 after={"chain": chain, "address": display})
    return wallet


def get_wallet(account_id: str) -> Wallet | None:
    return db.session.execute(select(Wallet).where(Wallet.account_id == account_id)).scalar_one_or_none()


# --- balance ---------------------------------------------------------------------------

_local_cache: dict[str, tuple[float, int]] = {}
_local_lock = threading.Lock()


def _cached_usdc(chain: str, address: str) -> int:
    ttl = int(current_app.config["WALLET_BALANCE_CACHE_SECONDS"])
    key = redis_key("usdcbal", chain, address)
    r = get_redis()
    if r is not None:
        try:
            hit = r.get(key)
            if hit is not None:
                return int(hit)
        except Exception:
            r = None
    else:
        with _local_lock:
            hit = _local_cache.get(key)
        if hit and hit[0] > time.monotonic():
            return hit[1]
    value = chains.usdc_balance(chain, address)
    if ttl > 0:
        if r is not None:
            try:
                r.set(key, value, ex=ttl)
            except Exception:
                pass
        else:
            with _local_lock:
                _local_cache[key] = (time.monotonic() + ttl, value)
    return value


def balance(account_id: str, mode: str = "live") -> dict:
    """Credits of ``mode`` and the connected wallet's on-chain USDC (``connected: false``,
    ``usdc: "0.000000"``, ``chain: null`` when no wallet is connected)."""
    credits = ledger.cached_balance(account_id, mode)
    wallet = get_wallet(account_id)
    out = {"credits_cents": ledger.micros_to_cents(credits), "usdc": chains.format_usdc(0), "chain": None,
           "address": None, "connected": False}
    if wallet is not None:
        out.update(usdc=chains.format_usdc(_cached_usdc(wallet.chain, wallet.address)),
                   chain=wallet.chain, address=wallet.address, connected=True)
    return out


# --- USDC deposits ------------------------------------------------------------------------

def deposit_address() -> str | None:
    """USDC_DEPOSIT_ADDRESS (default: X402_PAY_TO), EIP-55 checksummed; None = deposits off."""
    cfg = current_app.config
    addr = cfg.get("USDC_DEPOSIT_ADDRESS") or cfg.get("X402_PAY_TO")
    return to_checksum_address(addr) if addr else None


def fund_usdc(account_id: str, mode: str, amount_cents: int) -> FundResult:
    """Deposit instructions: send exactly ``amount_atomic`` USDC from the connected wallet
    to ``pay_to`` on ``chain``; the watcher credits it once confirmed. Live mode only: the
    transfer is real USDC, which the watcher credits to the live balance (a test key's
    announcement made it play money on the test balance)."""
    if mode != "live":
        raise Forbidden("method: usdc deposits move real USDC to the live balance; announce them "
                        "with a live key (test-mode credits: method card with a sandbox card).")
    wallet = get_wallet(account_id)
    if wallet is None:
        raise WalletNotConnected("Connect a wallet first (POST /api/wallet/connect); deposits are "
                                 "attributed by the sending address.")
    if wallet.chain not in chains.EVM_CHAINS:
        raise Conflict("method: USDC deposits are watched on EVM chains (base, ethereum, polygon); "
                       "connect an EVM wallet.")
    pay_to = deposit_address()
    if pay_to is None:
        raise ServiceUnavailable("USDC deposits are not configured on this deployment (USDC_DEPOSIT_ADDRESS).")
    micros = ledger.cents_to_micros(amount_cents)
    expires = utcnow() + timedelta(seconds=int(current_app.config["USDC_DEPOSIT_TTL_SECONDS"]))
    payment = Payment(id=new_id("pay"), account_id=account_id, method="usdc", kind="deposit",
                      processor="chain", mode=mode, amount_micros=micros, status="pending",
                      expires_at=expires, meta={"chain": wallet.chain, "from": wallet.address, "pay_to": pay_to})
    with unit_of_work():
        db.session.add(payment)
    deposit = {"chain": wallet.chain, "chain_id": chains.CHAIN_IDS[wallet.chain],
               "token": chains.usdc_contract(wallet.chain), "pay_to": pay_to, "from": wallet.address,
               "amount_atomic": str(micros), "amount_usdc": chains.format_usdc(micros),
               "reference": payment.id, "expires_at": expires,
               "confirmations": int(current_app.config["CHAIN_CONFIRMATIONS"])}
    return fund_result(payment, deposit)


def _credit_transfer(chain: str, t: dict) -> str:
    provider_id = f"{chain}:{t['tx']}:{t['log_index']}"
    if t["value"] <= 0:
        return "zero"
    if db.session.execute(select(Payment.id).where(Payment.provider_id == provider_id)).first():
        return "duplicate"
    wallet = db.session.execute(select(Wallet).where(Wallet.address_key == t["from"].lower(),
                                                     Wallet.chain.in_(chains.EVM_CHAINS))).scalar_one_or_none()
    if wallet is None:
        log.warning("USDC transfer %s from unconnected address %s not attributed", provider_id, t["from"])
        return "unattributed"
    got = chains.receipt(chain, t["tx"])
    if not chains.succeeded(got):
        return "reverted"
    external_ref = outside.chain_ref(chain, t["tx"], t["log_index"])
    used = [f"{chain}:{a.lower()}:{n}" for a, n in chains.authorizations_used(chain, got) if a == t["from"]]
    if used or db.session.execute(select(X402Authorization.id).where(
            X402Authorization.transaction == t["tx"])).first():
        # An EIP-3009 transfer: the same money as an x402 authorization. One of ours that is
        # reserved or settled is booked by the x402 path (or its reconciliation); any other
        # (not ours, or one released as unused) is credited under the authorization's key,
        # so the two rails can never both credit it.
        if not used or db.session.execute(select(X402Authorization.id).where(
                X402Authorization.auth_key.in_(used),
                X402Authorization.status.in_(("reserved", "settled")))).first():
            return "x402"
        external_ref = outside.x402_ref(used[0])
    candidates = db.session.execute(
        select(Payment).where(Payment.account_id == wallet.account_id, Payment.method == "usdc",
                              Payment.mode == "live",  # real USDC: never the test balance
                              Payment.status == "pending", Payment.provider_id.is_(None),
                              Payment.amount_micros == t["value"])
        .order_by(Payment.created_at)).scalars().all()
    payment = next((p for p in candidates if (p.meta or {}).get("chain") == chain), None)
    try:
        with unit_of_work():
            if payment is None:  # an unannounced deposit from a connected wallet: credit it too
                payment = Payment(id=new_id("pay"), account_id=wallet.account_id, method="usdc",
                                  kind="deposit", processor="chain", mode="live", amount_micros=t["value"],
                                  status="pending", meta={"chain": chain, "from": t["from"], "unannounced": True})
                db.session.add(payment)
            payment.provider_id = provider_id
            payment.meta = {**(payment.meta or {}), "tx": t["tx"], "log_index": t["log_index"],
                            "block": t["block"]}
            db.session.flush()
            credited = credit_payment(payment, ref=f"usdc:{provider_id}", external_ref=external_ref)
    except IntegrityError:
        return "duplicate"
    return "credited" if credited else "already_final"


def scan_chain(chain: str) -> dict:
    """Scan confirmed blocks for USDC transfers to the deposit address and credit them.
    The cursor advances only after every transfer in the range is processed."""
    cfg = current_app.config
    pay_to = deposit_address()
    if pay_to is None:
        raise ServiceUnavailable("USDC deposits are not configured (USDC_DEPOSIT_ADDRESS).")
    with unit_of_work():
        db.session.execute(update(Payment).where(Payment.method == "usdc", Payment.status == "pending",
                                                 Payment.provider_id.is_(None), Payment.expires_at < utcnow())
                           .values(status="expired", updated_at=utcnow())
                           .execution_options(synchronize_session=False))
    head = chains.block_number(chain)
    safe = head - int(cfg["CHAIN_CONFIRMATIONS"])
    with unit_of_work():
        cursor = db.session.get(ChainCursor, chain)
        if cursor is None:
            cursor = ChainCursor(chain=chain, last_block=max(-1, safe - int(cfg["CHAIN_WATCH_LOOKBACK_BLOCKS"])))
            db.session.add(cursor)
    start = cursor.last_block + 1
    end = min(safe, start + int(cfg["CHAIN_WATCH_MAX_BLOCKS"]) - 1)
    stats = {"chain": chain, "from_block": start, "to_block": end, "credited": 0, "seen": 0}
    if end < start:
        return stats
    for t in chains.transfer_logs(chain, pay_to, start, end):
        stats["seen"] += 1
        if _credit_transfer(chain, t) == "credited":
            stats["credited"] += 1
    with unit_of_work():
        db.session.execute(update(ChainCursor).where(ChainCursor.chain == chain, ChainCursor.last_block < end)
                           .values(last_block=end, updated_at=utcnow())
                           .execution_options(synchronize_session=False))
    return stats


def chains_to_watch() -> list[str]:
    """EVM chains with a connected wallet or a pending deposit (and an RPC endpoint)."""
    if deposit_address() is None:
        return []
    used = set(db.session.execute(select(Wallet.chain).where(Wallet.chain.in_(chains.EVM_CHAINS))).scalars())
    return [c for c in chains.EVM_CHAINS if c in used and chains.rpc_url(c)]


# --- ledger transactions -------------------------------------------------------------------

# Postings that name their call or completion in the ref only (the charge is posted by
# gw_open_calls / gw_chat_holds / gw_chat_settle with no meta): ref prefix -> the id after it.
_CALL_REFS = ("call:", "call_refund:", "chat_hold:", "chat_settle:")


def _call_of_ref(ref: str | None) -> str | None:
    for prefix in _CALL_REFS:
        if ref and ref.startswith(prefix):
            return ref[len(prefix):]
    return None


def transactions(account_id: str, limit: int = 50, cursor: str | None = None, mode: str = "live") -> dict:
    """The account's ledger entries (credits and debits), newest first; ``cursor`` is the
    ``next_cursor`` of the previous page."""
    stmt = (select(LedgerEntry.id, LedgerEntry.amount_micros, LedgerEntry.created_at,
                   LedgerTransaction.kind, LedgerTransaction.ref, LedgerTransaction.meta)
            .join(LedgerTransaction, LedgerTransaction.id == LedgerEntry.txn_id)
            .where(LedgerEntry.ledger_account == ledger.customer(account_id, mode)))
    if cursor:
        if not cursor.isdigit() or len(cursor) > 19:
            raise InvalidRequest("cursor: not a cursor returned by this endpoint.")
        stmt = stmt.where(LedgerEntry.id < int(cursor))
    rows = db.session.execute(stmt.order_by(LedgerEntry.id.desc()).limit(limit + 1)).all()
    items = []
    for entry_id, amount, created_at, kind, ref, meta in rows[:limit]:
        meta = meta or {}
        items.append({"id": f"le_{entry_id}", "type": "credit" if amount > 0 else "debit", "kind": kind,
                      "amount_cents": ledger.micros_to_cents(abs(amount)) * (1 if amount > 0 else -1),
                      "amount_micros": int(amount), "payment_id": meta.get("payment_id"),
                      "call_id": meta.get("call_id") or _call_of_ref(ref), "created_at": created_at})
    next_cursor = str(rows[limit - 1][0]) if len(rows) > limit else None
    return {"transactions": items, "next_cursor": next_cursor}

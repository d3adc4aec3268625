"""Agents: registration, ed25519 sign-in (nonce → signature → session), session lookup
for ``svc_sess_`` bearer tokens, and who may see an agent's data (DESIGN §6).

Sign-in (SPEC part 5 item 4):

1. ``issue_nonce()`` → ``n_`` + 32 base62 characters (≈190 bits), valid
   ``AGENT_NONCE_TTL_SECONDS`` (300 s), a single-use token (``platform.tokens``): only
   its SHA-256 is stored, like credentials, so a database reader cannot front-run
   pending challenges.
2. The agent signs the exact UTF-8 bytes of the nonce string with its ed25519 key.
3. ``sign_in()`` checks the formats, verifies the signature (before touching the
   database, so only the key holder learns whether its key is registered), then
   consumes the nonce (``tokens.consume``: one conditional UPDATE) and writes the
   session in the same transaction — of two concurrent sign-ins with one nonce exactly
   one succeeds.
4. Sessions are ``svc_sess_`` + 32 base62 + 6-char CRC32, stored as SHA-256, valid
   ``AGENT_SESSION_TTL_SECONDS`` (3600 s), acting as the agent's account with
   ``SESSION_SCOPES``.
"""
from __future__ import annotations

import base64
import os
import re
from datetime import timedelta

from flask import current_app
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.auth import Principal
from app.errors import Conflict, DomainError, Forbidden, InvalidRequest, NotFound, Unprocessable
from app.extensions import db
from app.ids import new_id, new_secret, random_b62, secret_is_well_formed, sha256_hex
from app.models import Account, Agent, AgentSession
from app.models.base import utcnow
from app.scopes import SESSION_SCOPES
from app.services.accounts import accounts
from app.services.platform import crypto, netguard, outbox, tokens
from app.services.platform.uow import transactional, unit_of_work

PUBKEY_PREFIX = "ed25519:"
EVM_PREFIX = "eip155:"
# CAIP-10 account id of an EVM wallet: eip155:<decimal chain id>:<0x + 40 hex>. The chain id
# is bounded (13 digits) so the canonical form fits the 64-character pubkey column.
_EVM_PUBKEY_RE = re.compile(r"^eip155:([1-9][0-9]{0,12}):(0x[0-9a-fA-F]{40})$")
SIGNATURE_PREFIX = "base58:"
NONCE_PREFIX = "n_"
NONCE_RANDOM_LEN = 32
SESSION_PREFIX = "svc_sess_"


class SignInError(DomainError):
    """A refused sign-in: 401 with a specific code (no bearer challenge: sign-in is public).
    This class itself: the sign-in request is malformed; subclasses: the other refusals."""

    status, code = 401, "malformed_signin"
    description = "Agent sign-in: pubkey, signature or nonce is not in the expected form."


class InvalidSignature(SignInError):
    code, description = "invalid_signature", "Agent sign-in: the signature does not verify for this pubkey and nonce."


class UnknownAgent(SignInError):
    code, description = "unknown_agent", "Agent sign-in: no agent is registered with this pubkey."


class UnknownNonce(SignInError):
    code, description = "unknown_nonce", "Agent sign-in: the nonce was never issued."


class NonceUsed(SignInError):
    code, description = "nonce_used", "Agent sign-in: the nonce was already used (replay or concurrent use)."


class NonceExpired(SignInError):
    code, description = "nonce_expired", "Agent sign-in: the nonce expired (nonces live 5 minutes)."


class AgentDisabled(SignInError):
    code, description = "agent_disabled", "Agent sign-in: its owner disabled this agent (DELETE /api/agent/{id})."


_SIGNIN_ERRORS = {cls.code: cls for cls in (SignInError, InvalidSignature, UnknownAgent, AgentDisabled,
                                            UnknownNonce, NonceUsed, NonceExpired)}


def _signin_error(code: str, message: str) -> SignInError:
    return _SIGNIN_ERRORS[code](message)


def new_webhook_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` + base64 of 24 random bytes."""
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def parse_pubkey(value: str) -> bytes | None:
    """32 key bytes of ``ed25519:<base58>``, or None when malformed."""
    if not isinstance(value, str) or not value.startswith(PUBKEY_PREFIX):
        return None
    return crypto.b58decode(value[len(PUBKEY_PREFIX):], crypto.ED25519_KEY_BYTES)


def canonical_pubkey(raw: bytes) -> str:
    return PUBKEY_PREFIX + crypto.b58encode(raw)


def evm_checksum_address(address: str) -> str | None:
    """The EIP-55 form of ``0x`` + 40 hex digits, or None when malformed. A mixed-case
    address must already be a valid EIP-55 checksum (a typo in it is caught); an all-lower
    or all-upper one carries no checksum and is accepted as is."""
    from eth_utils import is_checksum_address, to_checksum_address

    if not isinstance(address, str) or not re.fullmatch(r"0x[0-9a-fA-F]{40}", address):
        return None
    digits = address[2:]
    if digits != digits.lower() and digits != digits.upper() and not is_checksum_address(address):
        return None
    return to_checksum_address(address)


def parse_evm_pubkey(value: str) -> tuple[str, str] | None:
    """``(chain "eip155:<n>", EIP-55 address)`` of a CAIP-10 ``eip155:<n>:<0x address>``,
    or None when malformed (bad form, or a mixed-case address failing its checksum)."""
    m = _EVM_PUBKEY_RE.match(value) if isinstance(value, str) else None
    if m is None:
        return None
    address = evm_checksum_address(m.group(2))
    return (f"eip155:{m.group(1)}", address) if address else None


def evm_pubkey(chain: str, address: str) -> str:
    """The canonical CAIP-10 pubkey of an agent's EVM identity."""
    return f"{chain}:{address}"


def canonical_any_pubkey(pubkey: str) -> str:
    """The canonical form of an ``ed25519:`` or ``eip155:`` pubkey. The document's pattern
    states the shape (checked first, 400); what a pattern cannot state is 422
    ``unprocessable``: an EIP-55 checksum, base58 that is not the canonical spelling of 32
    bytes, a point that is not an ed25519 key, a chain outside ``AGENT_SIWX_CHAINS``."""
    if isinstance(pubkey, str) and pubkey.startswith(EVM_PREFIX):
        parsed = parse_evm_pubkey(pubkey)
        if parsed is None:
            raise Unprocessable("pubkey: must be 'eip155:<chainId>:<0x + 40 hex digits>' (CAIP-10); "
                                "a mixed-case address must be a valid EIP-55 checksum.", param="pubkey")
        chains = current_app.config["AGENT_SIWX_CHAINS"]
        if parsed[0] not in chains:
            raise Unprocessable(f"pubkey: chain {parsed[0]} is not supported; use one of {', '.join(chains)}.",
                                param="pubkey")
        return evm_pubkey(*parsed)
    raw = parse_pubkey(pubkey)
    if raw is None:
        raise Unprocessable("pubkey: must be 'ed25519:' followed by the canonical base58 encoding of 32 "
                            "bytes, or 'eip155:<chainId>:<0x address>'.", param="pubkey")
    if not crypto.ed25519_key_is_valid(raw):
        raise Unprocessable("pubkey: not a valid ed25519 public key.", param="pubkey")
    return canonical_pubkey(raw)


# --- events ----------------------------------------------------------------------------

def send_event(agent: Agent, event: str, data: dict, *, source: str) -> None:
    """In the caller's unit of work: queue the signed ``event`` for the agent's webhook (the
    outbox delivers it after commit). None for an agent without a webhook, nor for a
    disabled one: like a disabled Stripe endpoint its webhook receives nothing more, and
    what was waiting for it was cancelled when it was disabled (docs/decisions.md, "A
    disabled agent's webhook"; agents.disable)."""
    if agent.webhook and agent.disabled_at is None:
        outbox.add_webhook(agent.webhook, event, data, secret=agent.webhook_secret, source=source,
                           account_id=agent.account_id)


# --- registration ----------------------------------------------------------------------

def register(owner_account_id: str, *, name: str, pubkey: str, webhook: str | None,
             caller_is_agent: bool = False, mode: str = "live",
             registered_by: str | None = None) -> tuple[Agent, bool]:
    """Create the agent and its own account (no promotional credit), owned by the caller.

    ``pubkey`` is ``ed25519:<base58>`` or an EVM wallet's CAIP-10 ``eip155:<chainId>:<address>``
    (stored with the EIP-55 address, so any spelling of one address is one agent).
    Idempotent on ``pubkey``: the same owner gets the same agent back (its ``name`` and
    ``webhook`` updated to the values sent); a pubkey registered by another account is
    409 ``conflict``, and so is one registered by a key of the other mode (the agent has the
    mode of the key that registered it), and the pubkey of a disabled agent.
    ``registered_by``: the person whose credential registers it (recorded on a new agent;
    removing that member from the owning organisation disables it). Returns (agent, created)."""
    if caller_is_agent:
        raise Forbidden("Agents cannot register agents; register with a key of the owner account.")
    name = (name or "").strip()
    if not name:
        raise InvalidRequest("name: must not be empty.")
    canonical = canonical_any_pubkey(pubkey)
    if webhook is not None:
        netguard.validate_url(webhook, field="webhook")
    try:
        with unit_of_work():
            existing = db.session.execute(select(Agent).where(Agent.pubkey == canonical)).scalar_one_or_none()
            if existing is not None:
                return _same_owner(existing, owner_account_id, name, webhook, mode), False
            agent_id = new_id("agt")
            acct = accounts.new_account(None, kind="agent", owner_account_id=owner_account_id,
                                        agent_id=agent_id, promo=False)
            agent = Agent(id=agent_id, name=name, pubkey=canonical, account_id=acct.id,
                          owner_account_id=owner_account_id, mode=mode, webhook=webhook,
                          webhook_secret=new_webhook_secret(), registered_by=registered_by,
                          created_at=utcnow(), updated_at=utcnow())
            db.session.add(agent)
            from app.services.orgs import audit

            audit.record(owner_account_id, None, "agent.register", agent_id,
                         after={"name": name, "pubkey": canonical, "mode": mode, "account_id": acct.id})
    except IntegrityError:  # a concurrent register of the same pubkey won
        with unit_of_work():
            existing = db.session.execute(select(Agent).where(Agent.pubkey == canonical)).scalar_one()
            return _same_owner(existing, owner_account_id, name, webhook, mode), False
    return agent, True


def _same_owner(agent: Agent, owner_account_id: str, name: str, webhook: str | None, mode: str) -> Agent:
    if agent.owner_account_id != owner_account_id:
        raise Conflict("This pubkey is registered by another account.")
    if agent.mode != mode:
        raise Conflict(f"This pubkey is registered by a {agent.mode}-mode key of this account.")
    if agent.disabled_at is not None:
        raise Conflict(f"Agent {agent.id} with this pubkey was disabled; register a new key pair.")
    if agent.name != name or agent.webhook != webhook:
        agent.name, agent.webhook = name, webhook
    return agent


def get_agent(agent_id: str) -> Agent:
    agent = db.session.get(Agent, agent_id) if isinstance(agent_id, str) and len(agent_id) <= 32 else None
    if agent is None:
        raise NotFound("No such agent.")
    return agent


def owned_agents(owner_account_id: str, mode: str = "live") -> list[Agent]:
    """The agents an account owns in ``mode``, newest first (read-only, for the console)."""
    return list(db.session.execute(
        select(Agent).where(Agent.owner_account_id == owner_account_id, Agent.mode == mode)
        .order_by(Agent.created_at.desc(), Agent.id)).scalars())


def visible_agent(agent_id: str, *, account_id: str, caller_agent_id: str | None,
                  mode: str = "live") -> Agent:
    """The agent, if the caller is the agent itself (its session, or a key of its own
    account) or a credential of its owner account, in the agent's mode; anyone else
    (and a key of the other mode) gets 404 ``not_found``."""
    agent = get_agent(agent_id)
    if agent.mode == mode and (caller_agent_id == agent.id
                               or account_id in (agent.owner_account_id, agent.account_id)):
        return agent
    raise NotFound("No such agent.")


# --- nonce and sign-in -----------------------------------------------------------------

@transactional
def issue_nonce() -> dict:
    """A fresh single-use nonce and its expiry (a single-use token: only its hash is stored)."""
    nonce = NONCE_PREFIX + random_b62(NONCE_RANDOM_LEN)
    now = utcnow()
    ttl = int(current_app.config["AGENT_NONCE_TTL_SECONDS"])
    tokens.issue(tokens.AGENT_SIGNIN, None, ttl, token=nonce, now=now)
    return {"nonce": nonce, "expires_at": now + timedelta(seconds=ttl)}


def nonce_well_formed(nonce: str) -> bool:
    return (isinstance(nonce, str) and nonce.startswith(NONCE_PREFIX)
            and len(nonce) == len(NONCE_PREFIX) + NONCE_RANDOM_LEN and nonce[2:].isascii()
            and nonce[2:].isalnum())


@transactional
def sign_in(*, pubkey: str, nonce: str, signature: str) -> dict:
    """Verify the signed nonce and open a session. Raises SignInError (401) with code
    ``malformed_signin``, ``invalid_signature``, ``unknown_agent``, ``unknown_nonce``,
    ``nonce_used`` or ``nonce_expired``."""
    raw_key = parse_pubkey(pubkey)
    if raw_key is None:
        raise _signin_error("malformed_signin",
                            "pubkey: must be 'ed25519:' followed by the base58 encoding of 32 bytes.")
    if not isinstance(signature, str) or not signature.startswith(SIGNATURE_PREFIX):
        raise _signin_error("malformed_signin", "signature: must be 'base58:<64-byte signature>'.")
    raw_sig = crypto.b58decode(signature[len(SIGNATURE_PREFIX):], crypto.ED25519_SIG_BYTES)
    if raw_sig is None:
        raise _signin_error("malformed_signin", "signature: must be 'base58:<64-byte signature>'.")
    if not nonce_well_formed(nonce):
        raise _signin_error("malformed_signin", "nonce: must be a nonce from GET /api/agent/nonce.")
    if not crypto.ed25519_verify(raw_key, nonce.encode("utf-8"), raw_sig):
        raise _signin_error("invalid_signature", "The signature does not verify for this pubkey and nonce.")
    return open_session(canonical_pubkey(raw_key), nonce)


def open_session(pubkey: str, nonce: str) -> dict:
    """The common end of both sign-ins (ed25519 and SIWX), once the signature verified:
    find the agent by its canonical ``pubkey``, consume ``nonce`` (one conditional UPDATE:
    of concurrent uses exactly one wins) and write a ``svc_sess_`` session, in the caller's
    transaction. Raises ``unknown_agent``, ``agent_disabled``, ``unknown_nonce``, ``nonce_used``,
    ``nonce_expired``."""
    agent = db.session.execute(select(Agent).where(Agent.pubkey == pubkey)).scalar_one_or_none()
    if agent is None:
        raise _signin_error("unknown_agent", "No agent is registered with this pubkey.")
    if agent.disabled_at is not None:
        raise _signin_error("agent_disabled", f"Agent {agent.id} was disabled by its owner; it cannot sign in.")
    if tokens.consume(tokens.AGENT_SIGNIN, nonce) is None:
        row = tokens.lookup(tokens.AGENT_SIGNIN, nonce)
        if row is None:
            raise _signin_error("unknown_nonce", "This nonce was not issued by GET /api/agent/nonce.")
        if row.used_at is not None:
            raise _signin_error("nonce_used", "This nonce was already used; get a new one.")
        raise _signin_error("nonce_expired", "This nonce has expired; get a new one.")
    now = utcnow()
    ttl = int(current_app.config["AGENT_SESSION_TTL_SECONDS"])
    token = new_secret(SESSION_PREFIX)
    db.session.add(AgentSession(id=new_id("sess"), agent_id=agent.id, token_hash=sha256_hex(token),
                                created_at=now, expires_at=now + timedelta(seconds=ttl)))
    return {"agent_id": agent.id, "session": token, "expires_in": ttl}


@transactional
def purge_expired(older_than: timedelta = timedelta(days=1)) -> int:
    """Delete sessions that expired more than ``older_than`` ago (sign-in nonces are
    single-use tokens, purged by ``tokens.purge``)."""
    cutoff = utcnow() - older_than
    n = db.session.execute(AgentSession.__table__.delete().where(AgentSession.expires_at < cutoff)).rowcount
    return n


# --- svc_sess_ resolver (app.auth) -----------------------------------------------------

def resolve_session(token: str, token_hash: str) -> Principal | None:
    if not secret_is_well_formed(token, SESSION_PREFIX):
        return None
    row = db.session.execute(
        select(AgentSession.id, AgentSession.expires_at, AgentSession.revoked_at, Agent.id,
               Account.id, Account.plan, Agent.mode)
        .join(Agent, Agent.id == AgentSession.agent_id)
        .join(Account, Account.id == Agent.account_id)
        .where(AgentSession.token_hash == token_hash, Agent.disabled_at.is_(None))
    ).first()
    if row is None or row[2] is not None or row[1] <= utcnow():
        return None
    return Principal(account_id=row[4], credential_id=row[0], credential_hash=token_hash,
                     kind="session", mode=row[6], scopes=frozenset(SESSION_SCOPES), is_admin=False,
                     plan=row[5], agent_id=row[3], extra={"expires_at_epoch": row[1].timestamp()})


"""Sign-In-With-X (CAIP-122 / SIWE, EIP-4361) for agents with an EVM wallet, built on the
x402 package's ``x402.extensions.sign_in_with_x`` (docs/agents.md "Sign in with an EVM wallet").

An agent registered with ``pubkey: "eip155:<chainId>:<address>"`` (CAIP-10, see
``identity.register``) signs in with its wallet instead of ed25519 and gets the same
``svc_sess_`` session. It reuses the ed25519 sign-in's machinery: the nonce is one of
``identity.issue_nonce`` (single use, 5 minutes, stored as SHA-256 only), and the end of the
flow is ``identity.open_session`` (agent lookup, one conditional UPDATE consuming the nonce,
session with ``AGENT_SESSION_TTL_SECONDS``, the same Principal).

1. ``challenge()`` (``GET /api/agent/siwx``): the extension's challenge, as its server side
   builds it for a 402 (``info`` + ``supportedChains`` + ``schema``): domain and uri of this
   API (``BASE_URL``), a fresh nonce, issuedAt, expirationTime = the nonce's expiry.
   EIP-4361 nonces are alphanumeric, so the SIWE nonce is the gateway nonce without its
   ``n_`` prefix (the same token: ``n_`` + it is what is consumed).
2. The client signs the SIWE message with ``create_siwx_payload`` (EIP-191 personal_sign)
   and sends ``SIGN-IN-WITH-X: <base64 JSON>`` (``encode_siwx_header``).
3. ``sign_in(header)`` (``POST /api/agent/siwx``): ``parse_siwx_header``; the chain must be
   one of ``AGENT_SIWX_CHAINS``; ``validate_siwx_message`` (domain, uri origin, issuedAt no
   older than the nonce TTL and not in the future, expirationTime, notBefore);
   ``verify_siwx_signature`` — EOA signatures only, offline: no ``provider`` and no
   ``evm_verifier`` are given, so siwe recovers the signer locally and never asks a node
   (smart-contract wallets, EIP-1271/6492, would need one: not supported); then
   ``open_session`` with the CAIP-10 of (chainId, address). Every refusal is a 401 and
   changes nothing; a refused signature does not consume the nonce.

The package's EVM path needs ``siwe`` (distribution ``signinwithethereum``, installed
without its dependencies: see requirements-nodeps.txt); without it sign-in is 503.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from urllib.parse import urlparse

from flask import current_app

from app.errors import ServiceUnavailable
from app.services.agents import identity
from app.services.agents.identity import NONCE_PREFIX, SignInError
from app.services.platform.uow import transactional

HEADER = "SIGN-IN-WITH-X"
PATH = "/api/agent/siwx"
MAX_HEADER_LEN = 8000


class SiwxWrongDomain(SignInError):
    code, description = ("siwx_wrong_domain",
                         "Agent SIWX sign-in: the message's domain or uri is not this API's.")


class SiwxMessageExpired(SignInError):
    code, description = ("siwx_message_expired",
                         "Agent SIWX sign-in: the message is expired, not yet valid, or issued too long ago "
                         "(or in the future).")


class SiwxUnsupportedChain(SignInError):
    code, description = ("siwx_unsupported_chain",
                         "Agent SIWX sign-in: the chainId is not one of the supported EVM chains.")


_DOMAIN_CODES = {"invalid_siwx_domain_mismatch", "invalid_siwx_uri_mismatch"}


def origin() -> str:
    """This API's origin (scheme://host[:port]) from ``BASE_URL``: the SIWE domain and uri."""
    from x402.extensions.sign_in_with_x import normalize_configured_origin

    base = urlparse(current_app.config["BASE_URL"])
    return normalize_configured_origin(f"{base.scheme}://{base.netloc}")


def _siwx():
    """The extension module, once ``siwe`` (which its EVM path imports) is importable."""
    try:
        import siwe  # noqa: F401 - the extension imports it lazily; fail early and clearly

        from x402.extensions import sign_in_with_x
    except ImportError as exc:  # pragma: no cover - an install without requirements-nodeps.txt
        raise ServiceUnavailable("Sign-In-With-X is not available on this server (siwe not installed).") from exc
    return sign_in_with_x


def _iso(dt: datetime) -> str:
    """RFC 3339 UTC, whole seconds (rounded down: never later than the real instant)."""
    return dt.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def challenge() -> dict:
    """A fresh SIWX challenge: the extension's ``{info, supportedChains, schema}``."""
    ext = _siwx()
    issued = identity.issue_nonce()
    ttl = int(current_app.config["AGENT_NONCE_TTL_SECONDS"])
    base = origin()
    info = {
        "domain": urlparse(base).netloc,
        "uri": base + PATH,
        "version": "1",
        "statement": "Sign in to the metered API gateway as its agent.",
        "nonce": issued["nonce"][len(NONCE_PREFIX):],
        "issuedAt": _iso(issued["expires_at"] - timedelta(seconds=ttl)),
        "expirationTime": _iso(issued["expires_at"]),
    }
    return {"info": info,
            "supportedChains": [{"chainId": c, "type": ext.get_signature_type(c)}
                                for c in current_app.config["AGENT_SIWX_CHAINS"]],
            "schema": ext.build_siwx_schema()}


def _run(coro):
    """Drive one of the extension's coroutines to its end without an event loop. On the
    EOA path (no ``provider``, no ``evm_verifier``) they only compute and never wait, so
    one ``send`` finishes them. No loop on purpose: under gunicorn's gevent worker the MCP
    door's event loop runs in a greenlet of this same OS thread, and asyncio allows one
    running loop per OS thread (``asyncio.run`` here raised "cannot be called from a
    running event loop" once a worker had served an MCP request)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a SIWX coroutine waited for I/O; it is driven without an event loop")


@transactional
def sign_in(header: str | None) -> dict:
    """Verify a ``SIGN-IN-WITH-X`` header and open a session. Raises SignInError (401):
    ``malformed_signin``, ``siwx_unsupported_chain``, ``siwx_wrong_domain``,
    ``siwx_message_expired``, ``invalid_signature``, ``unknown_agent``, ``agent_disabled``, ``unknown_nonce``,
    ``nonce_used``, ``nonce_expired``."""
    ext = _siwx()
    if not header or len(header) > MAX_HEADER_LEN:
        raise SignInError(f"{HEADER}: required, the base64 of the SIWX payload JSON (at most {MAX_HEADER_LEN} "
                          "characters).")
    try:
        payload = ext.parse_siwx_header(header.strip())
    except (ValueError, RecursionError) as exc:  # bad base64/UTF-8/JSON (or absurdly nested), or not a payload
        raise SignInError(f"{HEADER}: {str(exc)[:300] or type(exc).__name__}") from None
    chains = current_app.config["AGENT_SIWX_CHAINS"]
    if payload.chain_id not in chains or payload.type != "eip191":
        raise SiwxUnsupportedChain(f"chainId must be one of {', '.join(chains)} with type eip191; "
                                   f"got {payload.chain_id!r} ({payload.type}).")
    address = identity.evm_checksum_address(payload.address)
    if address is None:
        raise SignInError("address: must be 0x + 40 hex digits (a mixed-case one must be a valid EIP-55 checksum).")
    ttl = int(current_app.config["AGENT_NONCE_TTL_SECONDS"])
    checked = _run(ext.validate_siwx_message(
        payload, origin(), ext.SIWxValidationOptions(max_age=ttl * 1000)))
    if not checked.is_valid:
        cls = SiwxWrongDomain if checked.invalid_reason in _DOMAIN_CODES else SiwxMessageExpired
        if checked.invalid_reason in ("invalid_siwx_issued_at", "invalid_siwx_expiration_time",
                                      "invalid_siwx_not_before"):
            cls = SignInError
        raise cls(checked.invalid_message or checked.invalid_reason)
    nonce = NONCE_PREFIX + payload.nonce
    if not identity.nonce_well_formed(nonce):
        raise SignInError("nonce: must be the nonce of GET /api/agent/siwx (32 letters and digits).")
    # Offline EOA verification: no provider, no evm_verifier (never a network call).
    try:
        verified = _run(ext.verify_siwx_signature(payload, ext.SIWxVerifyOptions(evm_verifier=None,
                                                                                 provider=None)))
    except Exception as exc:  # the SIWE message cannot be built from these fields (EIP-4361 grammar)
        raise SignInError(f"The SIWX payload does not make an EIP-4361 message: {str(exc)[:300]}") from None
    if not verified.is_valid:
        if verified.invalid_reason == "invalid_siwx_chain_id":
            raise SiwxUnsupportedChain(verified.invalid_message or "Invalid chainId.")
        raise identity.InvalidSignature("The signature does not verify for this address and message "
                                        f"({verified.invalid_message or verified.invalid_reason}).")
    return identity.open_session(identity.evm_pubkey(payload.chain_id, address), nonce)

"""Agents: ``AgentSession`` (sync) and ``AsyncAgentSession`` (async) sign in with an ed25519
key (nonce → signature → ``svc_sess_`` session) or an EVM wallet (Sign-In-With-X: the
challenge → a signed EIP-4361 message → the same session, with the x402 package's
``sign-in-with-x`` extension) and sign in again shortly before the session expires (and
once on a 401), so either can be used like a ``Gateway`` / ``AsyncGateway`` for as long
as it lives."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Coroutine, TypeVar

import base58
from nacl.signing import SigningKey

from gateway_client import ops
from gateway_client._async import AsyncGateway
from gateway_client._core import Op
from gateway_client._sync import Gateway
from gateway_client.errors import GatewayError

if TYPE_CHECKING:  # pragma: no cover
    import openai

T = TypeVar("T")
DEFAULT_CHAIN_ID = "eip155:8453"  # Base


def agent_pubkey(signing_key: SigningKey) -> str:
    """The ``ed25519:<base58>`` public key the gateway registers agents by."""
    return "ed25519:" + base58.b58encode(bytes(signing_key.verify_key)).decode()


def sign_nonce(signing_key: SigningKey, nonce: str) -> str:
    """The ``base58:<signature>`` of a sign-in nonce's UTF-8 bytes."""
    return "base58:" + base58.b58encode(signing_key.sign(nonce.encode("utf-8")).signature).decode()


def wallet_pubkey(wallet: Any, chain_id: str = DEFAULT_CHAIN_ID) -> str:
    """The ``eip155:<chainId>:<address>`` (CAIP-10) public key the gateway registers an
    agent with an EVM wallet (an ``eth_account`` account) by; it signs in on that chain."""
    return f"{chain_id}:{wallet.address}"


class _Ed25519:
    """Sign-in with an ed25519 key: a nonce, signed."""

    def __init__(self, signing_key: SigningKey) -> None:
        self.signing_key, self.pubkey = signing_key, agent_pubkey(signing_key)

    def challenge(self) -> Op[Any]:
        return ops.agent_nonce()

    async def answer(self, nonce: str, base_url: str) -> Op[dict[str, Any]]:
        return ops.agent_signin(self.pubkey, nonce, sign_nonce(self.signing_key, nonce))


class _Siwx:
    """Sign-in with an EVM wallet: the SIWX challenge's EIP-4361 message, signed (EIP-191)
    by x402's ``create_siwx_payload``, which refuses a challenge not bound to ``base_url``."""

    def __init__(self, wallet: Any, chain_id: str) -> None:
        self.wallet, self.chain_id, self.pubkey = wallet, chain_id, wallet_pubkey(wallet, chain_id)

    def challenge(self) -> Op[Any]:
        return ops.agent_siwx_challenge()

    async def answer(self, challenge: dict[str, Any], base_url: str) -> Op[dict[str, Any]]:
        try:
            from x402.extensions.sign_in_with_x import create_siwx_payload, encode_siwx_header
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise GatewayError("wallet sign-in needs the x402 extra: pip install 'gateway-client[x402]'") from exc
        payload = await create_siwx_payload({**challenge["info"], "chainId": self.chain_id, "type": "eip191"},
                                            self.wallet, base_url + ops.SIWX_PATH)
        return ops.agent_siwx_signin(encode_siwx_header(payload))


def _signer(signing_key: SigningKey | None, wallet: Any, chain_id: str) -> _Ed25519 | _Siwx:
    if (signing_key is None) == (wallet is None):
        raise TypeError("give exactly one of signing_key (an ed25519 key) and wallet (an EVM account)")
    return _Ed25519(signing_key) if signing_key is not None else _Siwx(wallet, chain_id)


def _now(step: Coroutine[Any, Any, T]) -> T:
    """The result of a signing step that waits for nothing (an ed25519 key, an
    ``eth_account`` account sign locally), without an event loop: the sync session works
    inside a running loop too. A signer that does wait needs ``AsyncAgentSession``."""
    try:
        step.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    step.close()
    raise GatewayError("this wallet signs asynchronously: use AsyncAgentSession")


class _SignedIn:
    """What both sessions keep: how they sign in (an ed25519 ``signing_key`` or an EVM
    ``wallet`` on ``chain_id``), the session a sign-in answered and when to sign in again
    (``refresh_margin`` before ``expires_at``)."""

    api_key: str | None

    def _start(self, signer: _Ed25519 | _Siwx, signing_key: SigningKey | None) -> None:
        self.api_key = None  # never the GATEWAY_API_KEY of the environment
        self.signing_key = signing_key
        self._signer = signer
        self.pubkey = signer.pubkey
        self.agent_id: str | None = None
        self.expires_at = 0.0  # time.monotonic() when the session ends
        self.refresh_margin = 60.0

    def _take(self, data: dict[str, Any]) -> None:
        ttl = float(data["expires_in"])
        self.api_key, self.agent_id = str(data["session"]), str(data["agent_id"])
        self.expires_at = time.monotonic() + ttl
        self.refresh_margin = min(60.0, ttl / 4)

    def _ending(self) -> bool:
        return time.monotonic() >= self.expires_at - self.refresh_margin


class AgentSession(_SignedIn, Gateway):
    """A ``Gateway`` whose credential is an agent session. Build it with ``sign_in``."""

    def __init__(self, signing_key: SigningKey | None = None, base_url: str | None = None, *,
                 wallet: Any = None, chain_id: str = DEFAULT_CHAIN_ID, **kwargs: Any) -> None:
        signer = _signer(signing_key, wallet, chain_id)  # before any connection is opened
        super().__init__(api_key=None, base_url=base_url, **kwargs)
        self._start(signer, signing_key)

    @classmethod
    def sign_in(cls, base_url: str | None = None, *, signing_key: SigningKey | None = None,
                wallet: Any = None, chain_id: str = DEFAULT_CHAIN_ID,
                x402_account: Any = None, **kwargs: Any) -> AgentSession:
        """Sign in the agent registered with ``signing_key``'s public key (``agent_pubkey``),
        or with ``wallet`` (an ``eth_account`` account) on ``chain_id`` (``wallet_pubkey``;
        needs the x402 extra). A refused sign-in raises, its connections closed."""
        session = cls(signing_key, base_url, wallet=wallet, chain_id=chain_id, x402_account=x402_account,
                      **kwargs)
        try:
            session.refresh()
        except BaseException:
            session.close()
            raise
        return session

    def refresh(self) -> None:
        """Sign a fresh challenge (a nonce, or the SIWX message) and take the new session."""
        challenge = self.request(self._signer.challenge())
        self._take(self.request(_now(self._signer.answer(challenge, self.base_url))))

    def _token(self) -> str | None:
        if self._ending():
            self.refresh()
        return self.api_key

    def _reauthenticate(self) -> bool:
        self.refresh()
        return True

    def chat_client(self, **kwargs: Any) -> openai.OpenAI:
        """An ``openai.OpenAI`` for the chat host whose key is the session's current token,
        read for every request: the session signs in again shortly before it ends, so the
        chat client lives as long as the ``AgentSession``."""
        kwargs.setdefault("api_key", self._current_token)
        return super().chat_client(**kwargs)

    def _current_token(self) -> str:
        return self._token() or ""


class AsyncAgentSession(_SignedIn, AsyncGateway):
    """An ``AsyncGateway`` whose credential is an agent session: ``AgentSession`` with
    ``await``. Build it with ``await AsyncAgentSession.sign_in(…)``; concurrent requests
    near the session's end sign in again once."""

    def __init__(self, signing_key: SigningKey | None = None, base_url: str | None = None, *,
                 wallet: Any = None, chain_id: str = DEFAULT_CHAIN_ID, **kwargs: Any) -> None:
        signer = _signer(signing_key, wallet, chain_id)  # before any connection is opened
        super().__init__(api_key=None, base_url=base_url, **kwargs)
        self._start(signer, signing_key)
        self._refreshing = asyncio.Lock()

    @classmethod
    async def sign_in(cls, base_url: str | None = None, *, signing_key: SigningKey | None = None,
                      wallet: Any = None, chain_id: str = DEFAULT_CHAIN_ID,
                      x402_account: Any = None, **kwargs: Any) -> AsyncAgentSession:
        """Sign in as ``AgentSession.sign_in`` does (``signing_key`` or ``wallet``); a
        refused sign-in raises, its connections closed."""
        session = cls(signing_key, base_url, wallet=wallet, chain_id=chain_id, x402_account=x402_account,
                      **kwargs)
        try:
            await session.refresh()
        except BaseException:
            await session.aclose()
            raise
        return session

    async def refresh(self) -> None:
        """Sign a fresh challenge (a nonce, or the SIWX message) and take the new session."""
        challenge = await self.request(self._signer.challenge())
        self._take(await self.request(await self._signer.answer(challenge, self.base_url)))

    async def _token(self) -> str | None:
        if self._ending():
            async with self._refreshing:
                if self._ending():  # not signed in again meanwhile by a concurrent request
                    await self.refresh()
        return self.api_key

    async def _reauthenticate(self) -> bool:
        await self.refresh()
        return True

    def chat_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` for the chat host whose key is the session's current
        token, read for every request (as ``AgentSession.chat_client``)."""
        kwargs.setdefault("api_key", self._current_token)
        return super().chat_client(**kwargs)

    async def _current_token(self) -> str:
        return await self._token() or ""

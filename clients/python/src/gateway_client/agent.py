"""Agents: ``AgentSession`` (sync) and ``AsyncAgentSession`` (async) sign in with an ed25519
key (nonce → signature → ``svc_sess_`` session) and sign in again shortly before the
session expires (and once on a 401), so either can be used like a ``Gateway`` /
``AsyncGateway`` for as long as it lives."""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import base58
from nacl.signing import SigningKey

from gateway_client import ops
from gateway_client._async import AsyncGateway
from gateway_client._core import Op
from gateway_client._sync import Gateway

if TYPE_CHECKING:  # pragma: no cover
    import openai


def agent_pubkey(signing_key: SigningKey) -> str:
    """The ``ed25519:<base58>`` public key the gateway registers agents by."""
    return "ed25519:" + base58.b58encode(bytes(signing_key.verify_key)).decode()


def sign_nonce(signing_key: SigningKey, nonce: str) -> str:
    """The ``base58:<signature>`` of a sign-in nonce's UTF-8 bytes."""
    return "base58:" + base58.b58encode(signing_key.sign(nonce.encode("utf-8")).signature).decode()


class _SignedIn:
    """What both sessions keep: the key they sign in with, the session a sign-in answered
    and when to sign in again (``refresh_margin`` before ``expires_at``)."""

    api_key: str | None

    def _start(self, signing_key: SigningKey) -> None:
        self.api_key = None  # never the GATEWAY_API_KEY of the environment
        self.signing_key = signing_key
        self.pubkey = agent_pubkey(signing_key)
        self.agent_id: str | None = None
        self.expires_at = 0.0  # time.monotonic() when the session ends
        self.refresh_margin = 60.0

    def _signin(self, nonce: str) -> Op[dict[str, Any]]:
        return ops.agent_signin(self.pubkey, nonce, sign_nonce(self.signing_key, nonce))

    def _take(self, data: dict[str, Any]) -> None:
        ttl = float(data["expires_in"])
        self.api_key, self.agent_id = str(data["session"]), str(data["agent_id"])
        self.expires_at = time.monotonic() + ttl
        self.refresh_margin = min(60.0, ttl / 4)

    def _ending(self) -> bool:
        return time.monotonic() >= self.expires_at - self.refresh_margin


class AgentSession(_SignedIn, Gateway):
    """A ``Gateway`` whose credential is an agent session. Build it with ``sign_in``."""

    def __init__(self, signing_key: SigningKey, base_url: str | None = None, **kwargs: Any) -> None:
        super().__init__(api_key=None, base_url=base_url, **kwargs)
        self._start(signing_key)

    @classmethod
    def sign_in(cls, base_url: str | None = None, *, signing_key: SigningKey,
                x402_account: Any = None, **kwargs: Any) -> AgentSession:
        """Sign in the agent registered with ``signing_key``'s public key (a refused sign-in
        raises, its connections closed)."""
        session = cls(signing_key, base_url, x402_account=x402_account, **kwargs)
        try:
            session.refresh()
        except BaseException:
            session.close()
            raise
        return session

    def refresh(self) -> None:
        """Sign a fresh nonce and take the new session."""
        self._take(self.request(self._signin(self.request(ops.agent_nonce()))))

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

    def __init__(self, signing_key: SigningKey, base_url: str | None = None, **kwargs: Any) -> None:
        super().__init__(api_key=None, base_url=base_url, **kwargs)
        self._start(signing_key)
        self._refreshing = asyncio.Lock()

    @classmethod
    async def sign_in(cls, base_url: str | None = None, *, signing_key: SigningKey,
                      x402_account: Any = None, **kwargs: Any) -> AsyncAgentSession:
        """Sign in the agent registered with ``signing_key``'s public key (a refused sign-in
        raises, its connections closed)."""
        session = cls(signing_key, base_url, x402_account=x402_account, **kwargs)
        try:
            await session.refresh()
        except BaseException:
            await session.aclose()
            raise
        return session

    async def refresh(self) -> None:
        """Sign a fresh nonce and take the new session."""
        self._take(await self.request(self._signin(await self.request(ops.agent_nonce()))))

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

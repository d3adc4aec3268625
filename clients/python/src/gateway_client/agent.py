"""Agents: ``AgentSession`` signs in with an ed25519 key (nonce → signature → ``svc_sess_``
session) and signs in again shortly before the session expires (and once on a 401), so
it can be used like a ``Gateway`` for as long as it lives."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import base58
from nacl.signing import SigningKey

from gateway_client import ops
from gateway_client._sync import Gateway

if TYPE_CHECKING:  # pragma: no cover
    import openai


def agent_pubkey(signing_key: SigningKey) -> str:
    """The ``ed25519:<base58>`` public key the gateway registers agents by."""
    return "ed25519:" + base58.b58encode(bytes(signing_key.verify_key)).decode()


def sign_nonce(signing_key: SigningKey, nonce: str) -> str:
    """The ``base58:<signature>`` of a sign-in nonce's UTF-8 bytes."""
    return "base58:" + base58.b58encode(signing_key.sign(nonce.encode("utf-8")).signature).decode()


class AgentSession(Gateway):
    """A ``Gateway`` whose credential is an agent session. Build it with ``sign_in``."""

    def __init__(self, signing_key: SigningKey, base_url: str | None = None, **kwargs: Any) -> None:
        super().__init__(api_key=None, base_url=base_url, **kwargs)
        self.api_key = None  # never the GATEWAY_API_KEY of the environment
        self.signing_key = signing_key
        self.pubkey = agent_pubkey(signing_key)
        self.agent_id: str | None = None
        self.expires_at = 0.0  # time.monotonic() when the session ends
        self.refresh_margin = 60.0

    @classmethod
    def sign_in(cls, base_url: str | None = None, *, signing_key: SigningKey,
                x402_account: Any = None, **kwargs: Any) -> AgentSession:
        """Sign in the agent registered with ``signing_key``'s public key."""
        session = cls(signing_key, base_url, x402_account=x402_account, **kwargs)
        session.refresh()
        return session

    def refresh(self) -> None:
        """Sign a fresh nonce and take the new session."""
        nonce = self.request(ops.agent_nonce())
        data = self.request(ops.agent_signin(self.pubkey, nonce, sign_nonce(self.signing_key, nonce)))
        ttl = float(data["expires_in"])
        self.api_key, self.agent_id = str(data["session"]), str(data["agent_id"])
        self.expires_at = time.monotonic() + ttl
        self.refresh_margin = min(60.0, ttl / 4)

    def _token(self) -> str | None:
        if time.monotonic() >= self.expires_at - self.refresh_margin:
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

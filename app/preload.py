"""What the app loads lazily because it is slow, loaded at once before gunicorn forks.

The app imports these where they are first needed, so a ``flask`` command or a test that
never checks a wallet signature, opens the MCP door or counts a chat prompt does not pay for
them. A web worker would pay on its first request of each kind instead: under ``make run``
the first metered call of each worker took 1.0–1.3 s (SQLAlchemy configures its mappers
on first use), the first x402-paid call 2.1 s (``eth_account`` and the x402 EVM types,
~2.3 s of imports), the first chat request 2.2 s (the two BPE tokenizers) and the first MCP
request 0.75 s (the ``mcp`` server). gunicorn's master calls :func:`load` after loading the
app and before the first fork (``deploy/gunicorn.conf.py``, ``on_starting``), so every worker
starts with them and shares one copy of their memory (~210 MiB, most of it the
tokenizers' tables, which are never written after loading and so stay shared). Only
imports and the tokenizers' tables: nothing here opens a connection or starts a thread
(a fork must not inherit either).
"""
from __future__ import annotations

import importlib
import logging

log = logging.getLogger(__name__)

MODULES = (
    "eth_account", "eth_account.messages",         # signatures: SIWX sign-in, EIP-712 (crypto.py)
    "x402.mechanisms.evm.types",                    # x402 payment payloads (billing/x402/payload.py)
    "x402.mechanisms.evm.constants",                # reconciliation (billing/x402/reconcile.py)
    "x402.extensions.sign_in_with_x",               # SIWX (agents/siwx.py)
    "mcp.server", "mcp.shared.exceptions",          # the MCP door (blueprints/mcp/server.py)
    "mcp.server.streamable_http_manager",
    "pypdf",                                        # a PDF document's pages (chat/tokens.py)
)


def load() -> None:
    """Configure the ORM's mappers (SQLAlchemy does it on first use: ~0.2 s of the first
    request of each worker), import :data:`MODULES` and load the chat tokenizers. A module
    that is not installed is skipped (its feature answers its own 503, as without
    preloading)."""
    from sqlalchemy.orm import configure_mappers

    configure_mappers()
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            log.warning("preload: %s not loaded (%s)", name, exc)
    from app.services.chat import tokens

    tokens.load_encodings()

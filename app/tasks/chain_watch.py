"""Periodic job: credit confirmed USDC deposits found on the watched EVM chains."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def watch_usdc_deposits() -> list[dict]:
    """Scan each EVM chain that has a connected wallet (one chain failing does not stop the others)."""
    from app.errors import ServiceUnavailable
    from app.services.billing import wallets

    out = []
    for chain in wallets.chains_to_watch():
        try:
            out.append(wallets.scan_chain(chain))
        except ServiceUnavailable as exc:  # raised outside scan_chain's units of work
            log.warning("usdc watcher: %s skipped: %s", chain, exc.message)
    return out

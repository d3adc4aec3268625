"""Chat jobs: release holds left ``held`` by a process that died mid-completion."""
from __future__ import annotations

from flask import current_app


def release_stale_holds() -> int:
    """Release every chat hold older than ``CHAT_HOLD_TTL_SECONDS`` (full refund)."""
    from app.services.money import holds as chat_billing

    return chat_billing.release_stale_holds(float(current_app.config["CHAT_HOLD_TTL_SECONDS"]))

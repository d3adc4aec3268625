"""Outbox jobs: deliver one message; sweep due messages."""
from __future__ import annotations


def deliver(message_id: str) -> str:
    from app.services.platform import outbox

    return outbox.deliver(message_id)


def sweep() -> int:
    from app.services.platform import outbox

    return outbox.sweep()

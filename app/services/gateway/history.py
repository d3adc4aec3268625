"""Call history reads for the console: an account's recent calls and one call by id
(another account's call is not found). Read-only; the call path owns the writes."""
from __future__ import annotations

from sqlalchemy import select

from app.errors import NotFound
from app.extensions import db
from app.models.calls import ModuleCall


def recent_calls(account_id: str, *, mode: str = "live", limit: int = 20) -> list[ModuleCall]:
    """The account's newest calls of ``mode``, newest first."""
    return list(db.session.execute(
        select(ModuleCall).where(ModuleCall.account_id == account_id, ModuleCall.mode == mode)
        .order_by(ModuleCall.created_at.desc(), ModuleCall.id.desc()).limit(limit)).scalars())


def get_call(account_id: str, call_id: str) -> ModuleCall:
    """One call of the account (404 for an unknown id or another account's call)."""
    row = db.session.get(ModuleCall, call_id) if call_id and len(call_id) <= 32 else None
    if row is None or row.account_id != account_id:
        raise NotFound("No such call.")
    return row

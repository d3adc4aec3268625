"""Call history reads for the console: an account's recent calls, its recent activity
(module calls and chat completions together) and one call by id (another account's call
is not found). Read-only; the call path and the chat path own the writes."""
from __future__ import annotations

from sqlalchemy import select

from app.errors import NotFound
from app.extensions import db
from app.models.calls import ModuleCall
from app.models.chat import ChatCompletion


def recent_calls(account_id: str, *, mode: str = "live", limit: int = 20) -> list[ModuleCall]:
    """The account's newest calls of ``mode``, newest first."""
    return list(db.session.execute(
        select(ModuleCall).where(ModuleCall.account_id == account_id, ModuleCall.mode == mode)
        .order_by(ModuleCall.created_at.desc(), ModuleCall.id.desc()).limit(limit)).scalars())


def recent_activity(account_id: str, *, mode: str = "live", limit: int = 20) -> list[dict]:
    """The account's newest module calls and chat completions of ``mode`` merged, newest
    first: ``{"kind": "module"|"chat", "id", "created_at", "product"`` (``slug/action`` or
    the model), ``"status", "tokens"`` (prompt + completion; None for a module call),
    ``"cost_micros", "receipt"``. A chat completion still held shows its hold as cost 0."""
    calls = [{"kind": "module", "id": c.id, "created_at": c.created_at, "product": f"{c.module_slug}/{c.action}",
              "status": c.status, "tokens": None, "cost_micros": c.price_micros, "receipt": bool(c.receipt)}
             for c in recent_calls(account_id, mode=mode, limit=limit)]
    chats = db.session.execute(
        select(ChatCompletion).where(ChatCompletion.account_id == account_id, ChatCompletion.mode == mode)
        .order_by(ChatCompletion.created_at.desc(), ChatCompletion.id.desc()).limit(limit)).scalars()
    calls += [{"kind": "chat", "id": c.id, "created_at": c.created_at, "product": c.model or c.requested_model,
               "status": c.status, "tokens": (c.prompt_tokens or 0) + (c.completion_tokens or 0),
               "prompt_tokens": c.prompt_tokens or 0, "completion_tokens": c.completion_tokens or 0,
               "cost_micros": c.cost_micros if c.status == "settled" else 0, "receipt": False} for c in chats]
    calls.sort(key=lambda r: (r["created_at"], r["id"]), reverse=True)
    return calls[:limit]


def get_call(account_id: str, call_id: str) -> ModuleCall:
    """One call of the account (404 for an unknown id or another account's call)."""
    row = db.session.get(ModuleCall, call_id) if call_id and len(call_id) <= 32 else None
    if row is None or row.account_id != account_id:
        raise NotFound("No such call.")
    return row

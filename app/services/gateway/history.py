"""Call history reads for the console: an account's recent calls, its recent activity
(module calls and chat completions together) and one call by id (another account's call
is not found). Read-only; the call path and the chat path own the writes."""
from __future__ import annotations

from sqlalchemy import func, select

from app.errors import NotFound
from app.extensions import db
from app.models.calls import ModuleCall
from app.models.chat import ChatCompletion


def recent_activity(account_id: str, *, mode: str = "live", limit: int = 20, filters: dict | None = None,
                    start=None, end=None) -> list[dict]:
    """The account's newest module calls and chat completions of ``mode`` merged, newest
    first: ``{"kind": "module"|"chat", "id", "created_at", "product"`` (``slug/action`` or
    the model), ``"status", "tokens"`` (prompt + completion; None for a module call),
    ``"cost_micros", "receipt", "key_id"`` (the API key that made it, or None), ``"ok"`` (a
    module call's ``ok``: False when the provider refused the input with a 4xx, charged, its
    ``"provider_status"`` given; None for a chat completion or a call not answered) and
    ``"error"`` (a chat completion's: it ended in an error, which the usage reports count as
    one)``}``. A chat completion still held shows its hold as cost 0. ``filters``: the usage filters
    (``key_id``, ``module``, ``model``) and ``status`` (``billing.export.narrowed``);
    ``start``/``end``: created in [start, end)."""
    from app.services.billing.export import narrowed

    f = filters or {}
    out = []
    if not f.get("model"):
        q = (select(ModuleCall).where(ModuleCall.account_id == account_id, ModuleCall.mode == mode,
                                      *narrowed(ModuleCall, ModuleCall.module_slug, f), *_window(ModuleCall, start, end))
             .order_by(ModuleCall.created_at.desc(), ModuleCall.id.desc()).limit(limit))
        out += [{"kind": "module", "id": c.id, "created_at": c.created_at, "product": f"{c.module_slug}/{c.action}",
                 "status": c.status, "tokens": None, "cost_micros": 0 if c.status == "refunded" else c.price_micros,
                 "receipt": bool(c.receipt), "key_id": c.actor, "ok": c.ok, "provider_status": c.provider_status,
                 "error": None} for c in db.session.execute(q).scalars()]
    if not f.get("module"):
        model = func.coalesce(ChatCompletion.model, ChatCompletion.requested_model)
        q = (select(ChatCompletion).where(ChatCompletion.account_id == account_id, ChatCompletion.mode == mode,
                                          *narrowed(ChatCompletion, model, f), *_window(ChatCompletion, start, end))
             .order_by(ChatCompletion.created_at.desc(), ChatCompletion.id.desc()).limit(limit))
        out += [{"kind": "chat", "id": c.id, "created_at": c.created_at, "product": c.model or c.requested_model,
                 "status": c.status, "tokens": (c.prompt_tokens or 0) + (c.completion_tokens or 0),
                 "prompt_tokens": c.prompt_tokens or 0, "completion_tokens": c.completion_tokens or 0,
                 "cost_micros": c.cost_micros if c.status in ("settled", "sandbox") else 0, "receipt": False,
                 "key_id": c.actor, "ok": None, "error": c.error} for c in db.session.execute(q).scalars()]
    out.sort(key=lambda r: (r["created_at"], r["id"]), reverse=True)
    return out[:limit]


def _window(table, start, end) -> list:
    return ([table.created_at >= start] if start else []) + ([table.created_at < end] if end else [])


def get_call(account_id: str, call_id: str) -> ModuleCall:
    """One call of the account (404 for an unknown id or another account's call)."""
    row = db.session.get(ModuleCall, call_id) if call_id and len(call_id) <= 32 else None
    if row is None or row.account_id != account_id:
        raise NotFound("No such call.")
    return row

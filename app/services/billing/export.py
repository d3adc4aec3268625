"""Usage export: every call of an account in a time window, one row per call, as CSV
(with a header row) or NDJSON, produced as a stream (issue 16 item 5; docs/keys.md).

Module calls (``module_calls``) and chat completions (``chat_completions``, module
``chat``, action = the model) are read with ``yield_per`` (a server-side cursor on
PostgreSQL: ``stream_results``), each ordered by ``created_at``, and merged, so memory
stays constant however many rows the window holds. ``rows()`` is the generator the
route wraps in ``stream_with_context``; ``window()`` validates the request first (so a bad
request is a JSON 400 before any byte is streamed). At most ``MAX_WINDOW`` per request.
"""
from __future__ import annotations

import csv
import heapq
import io
from datetime import datetime, timedelta, timezone
from typing import Iterator

import orjson
from sqlalchemy import func, select

from app.errors import Unprocessable
from app.extensions import db
from app.models import ChatCompletion, ModuleCall
from app.services.billing.usage_log import member_keys
from app.services.money.ledger import micros_to_cents

MAX_WINDOW = timedelta(days=31)
BATCH = 1000
COLUMNS = ("call_id", "created_at", "module", "action", "mode", "status", "cost_cents", "cost_micros",
           "idempotency_key", "receipt_hash", "byok_key_id", "provider_cost_micros")
FORMATS = ("csv", "json")


def window(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """[start, end) in UTC (naive = UTC); 422 ``unprocessable`` unless start < end and
    end − start ≤ 31 days (rules relating two query parameters, which a schema cannot state)."""
    start, end = (t if t.tzinfo else t.replace(tzinfo=timezone.utc) for t in (start, end))
    if start >= end:
        raise Unprocessable("from: must be before to.", param="from")
    if end - start > MAX_WINDOW:
        raise Unprocessable("The window from..to may span at most 31 days; export longer ranges in parts.",
                            param="to")
    return start.astimezone(timezone.utc), end.astimezone(timezone.utc)


def _iso(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _calls(account_id: str, start: datetime, end: datetime, f: dict) -> Iterator[tuple]:
    if f.get("model"):  # one chat model: no module call
        return
    q = (select(ModuleCall.id, ModuleCall.created_at, ModuleCall.module_slug, ModuleCall.action,
                ModuleCall.mode, ModuleCall.status, ModuleCall.price_micros, ModuleCall.idempotency_key,
                ModuleCall.receipt["hash"].as_string())  # the hash only, not the whole receipt
         .where(ModuleCall.account_id == account_id, ModuleCall.created_at >= start,
                ModuleCall.created_at < end)
         .order_by(ModuleCall.created_at, ModuleCall.id).execution_options(yield_per=BATCH))
    q = q.where(*narrowed(ModuleCall, ModuleCall.module_slug, f))
    for cid, created, slug, action, mode, status, price, key, receipt_hash in db.session.execute(q):
        cost = 0 if status == "refunded" else int(price)
        yield (created, cid, slug, action, mode, status, cost, key, receipt_hash, None, None)


def _completions(account_id: str, start: datetime, end: datetime, f: dict) -> Iterator[tuple]:
    if f.get("module"):  # one module: no chat completion
        return
    q = (select(ChatCompletion.id, ChatCompletion.created_at, ChatCompletion.model,
                ChatCompletion.requested_model, ChatCompletion.mode, ChatCompletion.status,
                ChatCompletion.cost_micros, ChatCompletion.byok_key_id, ChatCompletion.list_cost_micros)
         .where(ChatCompletion.account_id == account_id, ChatCompletion.created_at >= start,
                ChatCompletion.created_at < end)
         .order_by(ChatCompletion.created_at, ChatCompletion.id).execution_options(yield_per=BATCH))
    q = q.where(*narrowed(ChatCompletion, func.coalesce(ChatCompletion.model, ChatCompletion.requested_model), f))
    for cid, created, model, requested, mode, status, cost, byok_key, listed in db.session.execute(q):
        billed = status in ("settled", "sandbox")
        yield (created, cid, "chat", model or requested, mode, status, int(cost) if billed else 0, None, None,
               byok_key, listed if billed else None)


def narrowed(table, product, f: dict) -> list:
    """The conditions of the usage filters ``f`` (``billing.usage.FILTERS``, ``status``, ``mode``)
    on a call log: ``key_id`` is the key that made the call (``actor``), ``module`` or
    ``model`` the product column given (the caller skips the other log)."""
    cond = []
    if f.get("key_id"):
        cond.append(table.actor == f["key_id"])
    if f.get("member_keys") is not None:  # one member's organisation keys (``records``)
        cond.append(table.actor.in_(f["member_keys"]))
    if f.get("module") or f.get("model"):
        cond.append(product == (f.get("module") or f.get("model")))
    if f.get("status"):
        cond.append(table.status == f["status"])
    if f.get("mode"):
        cond.append(table.mode == f["mode"])
    return cond


def records(account_id: str, start: datetime, end: datetime, filters: dict | None = None,
            member: str | None = None) -> Iterator[dict]:
    """The window's calls and completions, oldest first, as dicts of ``COLUMNS``
    (``cost_cents`` in whole cents, floor as everywhere (DESIGN §3); ``cost_micros`` exact; refunded calls and
    released completions cost 0; a completion served with the caller's own provider key names
    it in ``byok_key_id``, its ``cost_micros`` is the fee and ``provider_cost_micros`` the list
    cost its provider bills). ``filters``: see ``narrowed``; ``member``: only the calls of
    that member's keys in the organisation ``account_id``."""
    f = dict(filters or {})
    if member is not None:
        f["member_keys"] = member_keys(account_id, member)
    merged = heapq.merge(_calls(account_id, start, end, f), _completions(account_id, start, end, f),
                         key=lambda r: (r[0], r[1]))
    for created, cid, module, action, mode, status, micros, key, receipt_hash, byok_key, listed in merged:
        yield {"call_id": cid, "created_at": _iso(created), "module": module, "action": action, "mode": mode,
               "status": status, "cost_cents": micros_to_cents(micros), "cost_micros": micros,
               "idempotency_key": key, "receipt_hash": receipt_hash, "byok_key_id": byok_key,
               "provider_cost_micros": listed}


def rows(account_id: str, start: datetime, end: datetime, fmt: str, filters: dict | None = None,
         member: str | None = None) -> Iterator[bytes]:
    """The export as chunks of bytes: CSV (header row first; empty cells for nulls) or
    NDJSON (one JSON object per line); ``filters``: see ``narrowed``."""
    if fmt == "json":
        for rec in records(account_id, start, end, filters, member):
            yield orjson.dumps(rec) + b"\n"
        return
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\r\n")
    writer.writeheader()
    n = 0
    for rec in records(account_id, start, end, filters, member):
        writer.writerow(rec)
        n += 1
        if n % 200 == 0:
            yield buf.getvalue().encode()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue().encode()

"""Usage export: every call of an account in a time window, one row per call, as CSV
(with a header row) or NDJSON, produced as a stream (issue 16 item 5; docs/keys.md).

Module calls (``module_calls``) and chat completions (``chat_completions``, module
``chat``, action = the model) are read by ONE statement (``UNION ALL`` ordered by
``created_at``, compiled once per filter shape) streamed in one round trip
(``uow.stream``: psycopg's ``Cursor.stream``, rows arriving in chunks of ``BATCH``), so
memory stays constant however many rows the window holds. (Until 2026-11 two server-side
cursors read the two logs: ``BEGIN``, ``DECLARE`` and ``FETCH`` each, 8 statements for an
hour's export, and a merge in Python.) ``rows()`` is the generator the
route wraps in ``stream_with_context``; ``window()`` validates the request first (so a bad
request is a JSON 400 before any byte is streamed). At most ``MAX_WINDOW`` per request.
"""
from __future__ import annotations

import csv
import functools
import io
from datetime import datetime, timedelta, timezone
from typing import Iterator

import orjson
from sqlalchemy import bindparam, case, func, literal_column, null, select, union_all

from app.errors import InvalidRequest, Unprocessable
from app.extensions import db
from app.models import ApiKey, ChatCompletion, ModuleCall
from app.services.billing.usage_log import member_keys
from app.services.money.ledger import micros_to_cents
from app.services.platform import uow

MAX_WINDOW = timedelta(days=31)
BATCH = 1000
COLUMNS = ("call_id", "created_at", "module", "action", "mode", "status", "cost_cents", "cost_micros",
           "idempotency_key", "receipt_hash", "byok_key_id", "provider_cost_micros", "actor", "actor_account_id",
           "ok")  # a new column goes last: a consumer's column positions do not move
FORMATS = ("csv", "json")
_FILTERS = ("key_id", "module", "model", "status", "mode")  # narrowed's, in a fixed order


def window(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """[start, end) in UTC (naive = UTC); 400 ``invalid_request`` for an instant that has no
    UTC date (year 1 with a positive offset, year 9999 with a negative one); 422
    ``unprocessable`` unless start < end and end − start ≤ 31 days (rules relating two query
    parameters, which a schema cannot state)."""
    start, end = (_in_utc(t, name) for t, name in ((start, "from"), (end, "to")))
    if start >= end:
        raise Unprocessable("from: must be before to.", param="from")
    if end - start > MAX_WINDOW:
        raise Unprocessable("The window from..to may span at most 31 days; export longer ranges in parts.",
                            param="to")
    return start, end


def _in_utc(t: datetime, name: str) -> datetime:
    """``t`` in UTC (naive = UTC); 400 when its UTC date is outside years 1–9999."""
    try:
        return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
    except OverflowError:
        raise InvalidRequest(f"{name}: outside the range of dates (years 1 to 9999 in UTC).",
                             param=name) from None


def _iso(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _who(table) -> tuple:
    """``actor`` (the credential that made the call: an API key's or agent session's id) and
    ``actor_account_id`` (the person behind it, as the receipt names it: an organisation
    key's member, else the paying account itself), so an organisation's export says who
    called what. One primary-key lookup of ``api_keys`` per row."""
    member = select(ApiKey.member_account_id).where(ApiKey.id == table.actor).scalar_subquery()
    return table.actor.label("actor"), func.coalesce(member, table.account_id).label("actor_account_id")


def _statement(shape: tuple[str, ...]):
    """The export's ONE statement for a filter shape (which of ``narrowed``'s filters are
    given): module calls and chat completions of the window as one ``UNION ALL`` ordered by
    ``(created_at, call_id)``, costs computed in SQL (a refunded call and a released
    completion cost 0). Filter values are bind parameters named after the filter (the
    member filter: ``org``/``member``), so each shape is compiled once per process
    (``_compiled``)."""
    f = {name: bindparam(name) for name in shape if name != "member_keys"}
    if "member_keys" in shape:
        f["member_keys"] = member_keys(bindparam("org"), bindparam("member"))
    parts = []
    if "model" not in shape:  # one chat model: no module call
        refunded = ModuleCall.status == "refunded"
        parts.append(select(
            ModuleCall.id.label("call_id"), ModuleCall.created_at, ModuleCall.module_slug.label("module"),
            ModuleCall.action, ModuleCall.mode, ModuleCall.status,
            case((refunded, 0), else_=ModuleCall.price_micros).label("cost_micros"),
            ModuleCall.idempotency_key, ModuleCall.receipt["hash"].as_string().label("receipt_hash"),
            null().label("byok_key_id"), null().label("provider_cost_micros"), *_who(ModuleCall), ModuleCall.ok,
        ).where(ModuleCall.account_id == bindparam("account"), ModuleCall.created_at >= bindparam("start"),
                ModuleCall.created_at < bindparam("end"), *narrowed(ModuleCall, ModuleCall.module_slug, f)))
    if "module" not in shape:  # one module: no chat completion
        model = func.coalesce(ChatCompletion.model, ChatCompletion.requested_model)
        billed = ChatCompletion.status.in_([literal_column("'settled'"), literal_column("'sandbox'")])  # inline
        parts.append(select(
            ChatCompletion.id.label("call_id"), ChatCompletion.created_at, literal_column("'chat'").label("module"),
            model.label("action"), ChatCompletion.mode, ChatCompletion.status,
            case((billed, ChatCompletion.cost_micros), else_=0).label("cost_micros"),
            null().label("idempotency_key"), null().label("receipt_hash"), ChatCompletion.byok_key_id,
            case((billed, ChatCompletion.list_cost_micros), else_=null()).label("provider_cost_micros"),
            *_who(ChatCompletion), null().label("ok"),
        ).where(ChatCompletion.account_id == bindparam("account"), ChatCompletion.created_at >= bindparam("start"),
                ChatCompletion.created_at < bindparam("end"), *narrowed(ChatCompletion, model, f)))
    stmt = union_all(*parts) if len(parts) > 1 else parts[0]
    return stmt.order_by(literal_column("created_at"), literal_column("call_id"))


@functools.cache
def _compiled(shape: tuple[str, ...], dialect) -> tuple[str, dict]:
    """``_statement(shape)`` compiled for ``dialect``: its SQL text and its constant
    parameters (the JSON key ``hash``, the literals); no expanding ``IN`` parameter,
    which would need its values at compile time."""
    compiled = _statement(shape).compile(dialect=dialect)
    return compiled.string, dict(compiled.params)


def _rows(account_id: str, start: datetime, end: datetime, f: dict, member: str | None) -> Iterator[tuple]:
    """The window's rows, streamed from ONE statement in one round trip (``uow.stream``)."""
    params = {name: f[name] for name in _FILTERS if f.get(name) is not None}
    if member is not None:
        params.update(member_keys=True, org=account_id, member=member)
    shape = tuple(params)
    if "module" in shape and "model" in shape:  # a module call has no model, a completion no module
        return iter(())
    params.pop("member_keys", None)
    sql, constants = _compiled(shape, db.engine.dialect)
    return uow.stream(sql, {**constants, **params, "account": account_id, "start": start, "end": end},
                      size=BATCH)


def narrowed(table, product, f: dict) -> list:
    """The conditions of the usage filters ``f`` (``billing.usage.FILTERS``, ``status``, ``mode``)
    on a call log: ``key_id`` is the key that made the call (``actor``), ``module`` or
    ``model`` the product column given (the caller skips the other log). A filter is
    given when its value is not None: a value, or a bind parameter (``_statement``); the
    routes and pages drop empty ones."""
    cond = []
    if f.get("key_id") is not None:
        cond.append(table.actor == f["key_id"])
    if f.get("member_keys") is not None:  # one member's organisation keys (``records``)
        cond.append(table.actor.in_(f["member_keys"]))
    if f.get("module") is not None or f.get("model") is not None:
        cond.append(product == (f["module"] if f.get("module") is not None else f["model"]))
    if f.get("status") is not None:
        cond.append(table.status == f["status"])
    if f.get("mode") is not None:
        cond.append(table.mode == f["mode"])
    return cond


def records(account_id: str, start: datetime, end: datetime, filters: dict | None = None,
            member: str | None = None) -> Iterator[dict]:
    """The window's calls and completions, oldest first, as dicts of ``COLUMNS``
    (``cost_cents`` in whole cents, floor as everywhere (DESIGN §3); ``cost_micros`` exact; refunded calls and
    released completions cost 0; a completion served with the caller's own provider key names
    it in ``byok_key_id``, its ``cost_micros`` is the fee and ``provider_cost_micros`` the list
    cost its provider bills; ``actor`` and ``actor_account_id``: who made it, see ``_who``; ``ok``: a
    succeeded module call's provider verdict — false when the provider refused it, its 4xx, charged
    by the documented rule — else None: a call not answered or refunded, a chat completion, whose
    ``status`` says how it ended). ``filters``: see ``narrowed``; ``member``: only the calls of
    that member's keys in the organisation ``account_id``."""
    for cid, created, module, action, mode, status, micros, key, receipt_hash, byok_key, listed, actor, person, ok \
            in _rows(account_id, start, end, filters or {}, member):
        yield {"call_id": cid, "created_at": _iso(created), "module": module, "action": action, "mode": mode,
               "status": status, "cost_cents": micros_to_cents(micros), "cost_micros": micros,
               "idempotency_key": key, "receipt_hash": receipt_hash, "byok_key_id": byok_key,
               "provider_cost_micros": listed, "actor": actor, "actor_account_id": person, "ok": ok}


# A spreadsheet reads a cell that starts with one of these as a formula (CSV injection, OWASP):
# the CSV writes such a text with a leading apostrophe (shown, not evaluated); NDJSON is exact.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value):
    if isinstance(value, bool):  # as the NDJSON and the API spell it, not Python's True
        return "true" if value else "false"
    return "'" + value if isinstance(value, str) and value.startswith(_FORMULA_START) else value


def rows(account_id: str, start: datetime, end: datetime, fmt: str, filters: dict | None = None,
         member: str | None = None) -> Iterator[bytes]:
    """The export as chunks of bytes: CSV (header row first; empty cells for nulls; a text
    that a spreadsheet would run as a formula — a caller's Idempotency-Key such as
    ``=HYPERLINK(…)`` — prefixed with ``'``) or NDJSON (one JSON object per line, exact);
    ``filters``: see ``narrowed``."""
    if fmt == "json":
        for rec in records(account_id, start, end, filters, member):
            yield orjson.dumps(rec) + b"\n"
        return
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\r\n")
    writer.writeheader()
    n = 0
    for rec in records(account_id, start, end, filters, member):
        writer.writerow({k: _csv_cell(v) for k, v in rec.items()})
        n += 1
        if n % 200 == 0:
            yield buf.getvalue().encode()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue().encode()

"""The metered call's two PostgreSQL statements: one to open (charge) a call, one to
finalize it. Everything else on the call path stays in ``gateway.calls``.

* ``open_pg`` runs ``SELECT * FROM gw_open_call(...)`` (the server-side function of
  migration 0011 ``hot_path``): Idempotency-Key reservation, per-key spend plug-in point,
  conditional debit + ledger posting, ``pending`` call row and usage counter in ONE round
  trip; the caller's unit of work commits it (asynchronously, see docs/performance.md).
* ``finalize_pg`` marks the call ``succeeded`` with its receipt AND stores the
  Idempotency-Key's response in ONE data-modifying CTE; the caller's unit of work commits
  it durably before the answer leaves the process.

Neither commits: ``gateway.calls`` owns the units of work. SQLite (the embedded default)
keeps the multi-statement path in ``gateway.calls`` behind the same interface.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from flask import current_app

from sqlalchemy import BigInteger, String, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY

from app.extensions import db
from app.ids import new_id
from app.models.base import JSONType, UTCDateTime, utcnow

_OPEN = text("""
    SELECT outcome, idem_hash, idem_status, idem_body FROM gw_open_call(
        :call_id, :account_id, :module_id, :slug, :action, :mode, :price, :charged,
        :owner_agent_id, :idem_key, :req_hash, :now, :deadline, :idem_expires,
        :codes, :amounts)
""").bindparams(*(bindparam(n, type_=UTCDateTime()) for n in ("now", "deadline", "idem_expires")),
                bindparam("codes", type_=ARRAY(String)), bindparam("amounts", type_=ARRAY(BigInteger)))

class OpenedCall(str):
    """A new call's id (a ``str``, as before) carrying its ``created_at``: the partition
    key of ``module_calls`` on PostgreSQL (migration 0018), so the statements that target
    this one row later (spend-key update, finalize, refund) prune to its month's partition
    instead of probing every month's primary-key index."""

    created_at: datetime

    def __new__(cls, call_id: str, created_at: datetime):
        obj = super().__new__(cls, call_id)
        obj.created_at = created_at
        return obj


def created_at_of(call_id: str) -> datetime | None:
    """The partition key a call id carries (None for a plain id, e.g. from the sweep)."""
    return getattr(call_id, "created_at", None)


_FINALIZE_SQL = """
    WITH c AS (
        UPDATE module_calls
           SET status = 'succeeded', ok = :ok, provider_status = :provider_status,
               receipt = :receipt, finished_at = :finished_at
         WHERE id = :call_id AND status = 'pending'{prune}
        RETURNING id),
    i AS (
        UPDATE idempotency_records SET status = 'done', response_body = :response_body
         WHERE account_id = :account_id AND key = :idem_key AND call_id IN (SELECT id FROM c))
    SELECT count(*) FROM c
"""
_FINALIZE, _FINALIZE_PRUNED = (
    text(_FINALIZE_SQL.format(prune=prune)).bindparams(
        bindparam("receipt", type_=JSONType), bindparam("finished_at", type_=UTCDateTime()),
        *([bindparam("created_at", type_=UTCDateTime())] if prune else []))
    for prune in ("", " AND created_at = :created_at"))


@dataclass(frozen=True)
class Opened:
    """What ``gw_open_call`` answered: ``opened``, ``insufficient`` (roll back: nothing
    may stay), or ``existing`` (the key is taken: its stored hash, status and body)."""

    outcome: str
    idem_hash: str | None = None
    idem_status: str | None = None
    idem_body: str | None = None


def supported() -> bool:
    """True when the session's database runs the one-statement path (PostgreSQL)."""
    return db.session.get_bind().dialect.name == "postgresql"


def open_pg(*, account_id: str, mode: str, mod, act, idem_key: str | None, req_hash: str | None,
            price_micros: int, charged: bool, legs: list[tuple[str, int]]) -> tuple[str, Opened]:
    """One round trip: the whole charging transaction of a new call of ``act`` of ``mod``
    (catalog snapshots). Returns the new call id and the function's answer; does not
    commit (an ``insufficient`` answer must be rolled back)."""
    cfg = current_app.config
    call_id = new_id("call")
    now = utcnow()
    legs = sorted(legs, key=lambda leg: leg[1])  # debits first, as ledger.post orders them
    row = db.session.execute(_OPEN, {
        "call_id": call_id, "account_id": account_id, "module_id": mod.id, "slug": mod.slug,
        "action": act.name, "mode": mode, "price": price_micros, "charged": charged,
        "owner_agent_id": mod.owner_agent_id, "idem_key": idem_key, "req_hash": req_hash,
        "now": now,
        "deadline": now + timedelta(seconds=act.timeout_seconds + cfg["CALL_SWEEP_MARGIN_SECONDS"]),
        "idem_expires": now + timedelta(seconds=cfg["IDEMPOTENCY_TTL_SECONDS"]),
        "codes": [c for c, _ in legs], "amounts": [a for _, a in legs]}).first()
    return OpenedCall(call_id, now), Opened(*row)


def finalize_pg(*, call_id: str, account_id: str, idem_key: str | None, ok: bool,
                provider_status: int, receipt: dict, finished_at, response_body: str) -> bool:
    """One round trip: ``pending → succeeded`` plus the key's stored response. False when
    the call was no longer pending (the sweep refunded it). Does not commit. Pruned to
    the call's partition when ``call_id`` carries its ``created_at`` (``OpenedCall``)."""
    created_at = created_at_of(call_id)
    return db.session.execute(_FINALIZE if created_at is None else _FINALIZE_PRUNED, {
        "call_id": call_id, "account_id": account_id, "idem_key": idem_key, "ok": ok,
        "provider_status": provider_status, "receipt": receipt, "finished_at": finished_at,
        "response_body": response_body, **({"created_at": created_at} if created_at else {})}
    ).scalar_one() == 1

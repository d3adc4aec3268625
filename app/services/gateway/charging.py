"""The metered call's two PostgreSQL statements: one to open (charge) a call, one to
finalize it, each ONE autocommit statement on the request's hot-path connection
(``uow.one_statement``: no BEGIN/COMMIT round trips). Everything else on the call path
stays in ``gateway.calls``.

* ``open_pg`` runs ``SELECT * FROM gw_open_call(...)`` (the server-side function of
  migration 0016 ``hot_path_v2``): Idempotency-Key reservation, the key's spend-limit
  reserve, conditional debit + ledger posting and the ``pending`` call row in ONE round
  trip, committed without waiting for the WAL flush (set inside the function; why that
  is safe: docs/performance.md). A refusal (insufficient funds, key spend limit) RAISEs
  in the function, so the server undoes all of it and no ROLLBACK round trip is needed.
* ``finalize_pg`` marks the call ``succeeded`` with its receipt AND stores the
  Idempotency-Key's response in ONE data-modifying CTE, committed durably before the
  answer leaves the process.

SQLite (the embedded default) keeps the multi-statement path in ``gateway.calls``
behind the same interface.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import orjson
from flask import current_app
from sqlalchemy.exc import DBAPIError

from app.extensions import db
from app.ids import new_id
from app.models.base import utcnow
from app.services.platform.uow import one_statement

# SQLSTATEs gw_open_call raises on a refusal (the statement is undone), and the outcome
REFUSALS = {"GW402": "insufficient", "GWKSL": "key_spend_limit"}

# Driver-level SQL (psycopg placeholders, explicit casts): the statements are fixed, so
# SQLAlchemy's compile and bind processing are skipped; the engine's events (statement
# counters, tracing) still see them.
_OPEN = """
    SELECT outcome, idem_hash, idem_status, idem_body FROM gw_open_call(
        %(call_id)s::varchar, %(account_id)s::varchar, %(module_id)s::integer, %(slug)s::varchar,
        %(action)s::varchar, %(mode)s::varchar, %(price)s::bigint, %(charged)s::boolean,
        %(owner_agent_id)s::varchar, %(idem_key)s::varchar, %(req_hash)s::varchar,
        %(now)s::timestamptz, %(deadline)s::timestamptz, %(idem_expires)s::timestamptz,
        %(codes)s::varchar[], %(amounts)s::bigint[], %(spend_key)s::varchar)
"""

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


_FINALIZE = """
    WITH c AS (
        UPDATE module_calls
           SET status = 'succeeded', ok = %(ok)s::boolean, provider_status = %(provider_status)s::integer,
               receipt = %(receipt)s::jsonb, finished_at = %(finished_at)s::timestamptz
         WHERE id = %(call_id)s::varchar AND status = 'pending'{prune}
        RETURNING id),
    i AS (
        UPDATE idempotency_records SET status = 'done', response_body = %(response_body)s::text
         WHERE account_id = %(account_id)s::varchar AND key = %(idem_key)s::varchar
           AND call_id IN (SELECT id FROM c))
    SELECT count(*) FROM c
"""
_FINALIZE, _FINALIZE_PRUNED = (
    _FINALIZE.format(prune=prune) for prune in ("", " AND created_at = %(created_at)s::timestamptz"))


@dataclass(frozen=True)
class Opened:
    """What ``gw_open_call`` answered: ``opened``, ``insufficient`` / ``key_spend_limit``
    (refused: nothing was written), or ``existing`` (the key is taken: its stored hash,
    status and body)."""

    outcome: str
    idem_hash: str | None = None
    idem_status: str | None = None
    idem_body: str | None = None


def supported() -> bool:
    """True when the app's database runs the one-statement path (PostgreSQL)."""
    return db.engine.dialect.name == "postgresql"


def open_pg(*, account_id: str, mode: str, mod, act, idem_key: str | None, req_hash: str | None,
            price_micros: int, charged: bool, legs: list[tuple[str, int]],
            spend_key: str | None = None) -> tuple[str, Opened]:
    """One round trip, committed by itself: the whole charging transaction of a new call
    of ``act`` of ``mod`` (catalog snapshots); ``spend_key``: the API key whose spend
    limit applies (None: no limit). Returns the new call id and the function's answer."""
    cfg = current_app.config
    call_id = new_id("call")
    now = utcnow()
    legs = sorted(legs, key=lambda leg: leg[1])  # debits first, as ledger.post orders them
    params = {
        "call_id": call_id, "account_id": account_id, "module_id": mod.id, "slug": mod.slug,
        "action": act.name, "mode": mode, "price": price_micros, "charged": charged,
        "owner_agent_id": mod.owner_agent_id, "idem_key": idem_key, "req_hash": req_hash,
        "now": now,
        "deadline": now + timedelta(seconds=act.timeout_seconds + cfg["CALL_SWEEP_MARGIN_SECONDS"]),
        "idem_expires": now + timedelta(seconds=cfg["IDEMPOTENCY_TTL_SECONDS"]),
        "codes": [c for c, _ in legs], "amounts": [a for _, a in legs], "spend_key": spend_key}
    for attempt in (1, 2):
        try:
            with one_statement() as conn:
                return OpenedCall(call_id, now), Opened(*conn.exec_driver_sql(_OPEN, params).first())
        except DBAPIError as exc:
            refusal = REFUSALS.get(getattr(exc.orig, "sqlstate", None))
            if refusal is not None:
                return OpenedCall(call_id, now), Opened(refusal)
            # A stale pooled connection (server restart; no pre-ping on this pool): retry
            # once with the SAME call id, so a first attempt that did commit makes the
            # retry fail (duplicate call id / key in flight) instead of charging twice.
            if not exc.connection_invalidated or attempt == 2:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def finalize_pg(*, call_id: str, account_id: str, idem_key: str | None, ok: bool,
                provider_status: int, receipt: dict, finished_at, response_body: str) -> bool:
    """One round trip, committed durably by itself: ``pending → succeeded`` plus the key's
    stored response. False when the call was no longer pending (the sweep refunded it).
    Pruned to the call's partition when ``call_id`` carries its ``created_at``
    (``OpenedCall``)."""
    created_at = created_at_of(call_id)
    with one_statement() as conn:
        return conn.exec_driver_sql(_FINALIZE if created_at is None else _FINALIZE_PRUNED, {
            "call_id": str(call_id), "account_id": account_id, "idem_key": idem_key, "ok": ok,
            "provider_status": provider_status, "receipt": orjson.dumps(receipt).decode(),
            "finished_at": finished_at, "response_body": response_body,
            **({"created_at": created_at} if created_at is not None else {})}).scalar_one() == 1

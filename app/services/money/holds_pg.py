"""The chat completion's two PostgreSQL statements: the hold (``gw_chat_hold``) and the
settle (``gw_chat_settle``), server-side functions in ``app/services/money/sql/``, each
ONE autocommit statement on a connection of the process's pool (``uow.run_one``: one
pool checkout per statement, held only while it runs, no ``BEGIN``/``COMMIT``), as the metered call's
``money.charging``. ``holds`` owns the release; these only build
and run the two statements.

* ``hold``: the key's spend-limit reservation, the conditional debit, the ``held``
  completion row and the ``chat_hold`` posting in ONE round trip, committed without
  waiting for the WAL flush (set in the function). A refusal RAISEs in the function
  (SQLSTATE ``GWKSL`` key spend limit, ``GWMBR`` member budget, ``GW402`` insufficient funds), so the server
  undoes all of it — the key's counter included — with no ROLLBACK round trip.
* ``settle``: the exact charge (never more than the hold), ``held → settled`` once, the
  customer's change, the ``chat_settle`` posting and the key's unused reservation back in
  ONE round trip, committed durably (the session default) before the answer leaves.

Retry safety (the autocommit pool has no pre-ping): a statement that fails because its
pooled connection was dead (``connection_invalidated``) is retried once on a fresh one
with the SAME parameters. A retried hold whose first attempt did commit (the connection
died after the COMMIT) fails on the completion's primary key ``(id, created_at)``: the
hold is in place, so that answers ``held`` without holding twice. A retried settle whose
first attempt committed finds the row no longer ``held`` and writes nothing.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy.exc import DBAPIError

from app.services.platform.uow import REFUSALS, pg_array, run_one

_UNIQUE_VIOLATION = "23505"

# Driver-level SQL (psycopg placeholders, explicit casts): the statements are fixed, so
# SQLAlchemy's compile and bind processing are skipped; the engine's events (statement
# counters, tracing) still see them.
_HOLD = """
    SELECT gw_chat_hold(%(id)s::varchar, %(account_id)s::varchar, %(actor)s::varchar,
                        %(requested_model)s::varchar,
                        %(stream)s::boolean, %(hold)s::bigint, %(spend_key_id)s::varchar,
                        %(now)s::timestamptz, %(codes)s::varchar[], %(amounts)s::bigint[])
"""

_SETTLE = """
    SELECT charged, spend_key_id, held_at, give_back FROM gw_chat_settle(
        %(id)s::varchar, %(created_at)s::timestamptz, %(account_id)s::varchar, %(customer)s::varchar,
        %(hold_code)s::varchar, %(revenue)s::varchar, %(hold)s::bigint, %(cost)s::bigint,
        %(model)s::varchar, %(provider)s::varchar, %(prompt_tokens)s::integer,
        %(completion_tokens)s::integer, %(estimated)s::boolean, %(attempts)s::integer,
        %(latency_ms)s::integer, %(error)s::varchar, %(now)s::timestamptz)
"""


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None)


def hold(*, completion_id: str, account_id: str, requested_model: str, stream: bool,
         hold_micros: int, key_id: str | None, now: datetime, legs: list[tuple[str, int]],
         actor: str | None = None) -> str:
    """One round trip, committed by itself: ``held``, or the refusal (``insufficient`` /
    ``key_spend_limit`` / ``member_budget``: nothing was written). ``key_id``: the API key whose spend limit
    the hold counts against (the function reserves it when the key has a limit)."""
    legs = sorted(legs, key=lambda leg: leg[1])  # debits first, as ledger.post orders them
    params = {"id": completion_id, "account_id": account_id, "actor": actor,
              "requested_model": requested_model,
              "stream": bool(stream), "hold": int(hold_micros), "spend_key_id": key_id, "now": now,
              "codes": pg_array(c for c, _ in legs), "amounts": pg_array(int(a) for _, a in legs)}
    try:
        (outcome,), = run_one(_HOLD, params)
        return outcome
    except DBAPIError as exc:
        state = _sqlstate(exc)
        if state in REFUSALS:
            return REFUSALS[state]
        if state == _UNIQUE_VIOLATION:
            # the completion id is new (made by the gateway): only run_one's retry of a first
            # attempt that committed before its connection died can find it taken — held
            return "held"
        raise


def settle(*, completion_id: str, created_at, account_id: str, customer: str, hold_code: str,
           revenue: str, hold_micros: int, cost_micros: int, model: str, provider: str,
           prompt_tokens: int, completion_tokens: int, estimated: bool, attempts: int,
           latency_ms: int, error: str | None, now) -> tuple[int, str | None, object, int] | None:
    """One round trip, committed durably by itself: (charged, the hold's spend-limited key,
    the hold's time, micros given back to that key's limit), or None when this completion
    was no longer held (settled or released before; nothing written). ``created_at`` (the
    hold's time, or None) finds the row in one partition."""
    params = {
        "id": completion_id, "created_at": created_at, "account_id": account_id, "customer": customer,
        "hold_code": hold_code, "revenue": revenue, "hold": int(hold_micros), "cost": int(cost_micros),
        "model": model, "provider": provider, "prompt_tokens": int(prompt_tokens),
        "completion_tokens": int(completion_tokens), "estimated": bool(estimated), "attempts": int(attempts),
        "latency_ms": int(latency_ms), "error": error, "now": now}
    # conditional on ``held``: a retry after a committed first attempt writes nothing
    rows = run_one(_SETTLE, params)
    row = rows[0] if rows else None
    return None if row is None else (int(row[0]), row[1], row[2], int(row[3]))

"""The chat completion's two PostgreSQL statements: the hold (``gw_chat_hold``) and the
settle (``gw_chat_settle``), server-side functions of migration 0017
``chat_one_statement``. ``holds`` owns the units of work and the SQLite path; these only
build and run the statements (neither commits).

* ``hold_statement`` / ``hold_params``: conditional debit, the ``held`` completion row and
  the ``chat_hold`` posting in ONE round trip. It writes nothing when it answers
  ``insufficient``, so without a spend-limited key ``holds.hold`` runs it alone in
  autocommit (``uow.single_statement``); with one, in the unit of work that also
  reserves the key's spend.
* ``settle``: the exact charge (capped at hold + balance), ``held → settled`` once, the
  customer's change and the ``chat_settle`` posting in ONE round trip; answers the charge,
  the hold's spend-limited key and what to give back to its limit, or None when the
  completion was already settled or released.
"""
from __future__ import annotations

from sqlalchemy import BigInteger, String, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY

from app.extensions import db
from app.models.base import UTCDateTime

HOLD = text("""
    SELECT gw_chat_hold(:id, :account_id, :requested_model, :stream, :hold, :spend_key_id, :now,
                        :codes, :amounts)
""").bindparams(bindparam("now", type_=UTCDateTime()), bindparam("codes", type_=ARRAY(String)),
                bindparam("amounts", type_=ARRAY(BigInteger)))

_SETTLE = text("""
    SELECT charged, spend_key_id, held_at, give_back FROM gw_chat_settle(
        :id, :created_at, :account_id, :customer, :hold_code, :revenue, :hold, :cost, :model,
        :provider, :prompt_tokens, :completion_tokens, :estimated, :attempts, :latency_ms, :error, :now)
""").bindparams(bindparam("created_at", type_=UTCDateTime()), bindparam("now", type_=UTCDateTime()))


def supported() -> bool:
    """True when the session's database runs the one-statement path (PostgreSQL)."""
    return db.session.get_bind().dialect.name == "postgresql"


def hold_params(*, completion_id: str, account_id: str, requested_model: str, stream: bool,
                hold_micros: int, spend_key_id: str | None, now, legs: list[tuple[str, int]]) -> dict:
    """The parameters of ``HOLD``; ``legs`` the posting (debits first)."""
    legs = sorted(legs, key=lambda leg: leg[1])
    return {"id": completion_id, "account_id": account_id, "requested_model": requested_model,
            "stream": bool(stream), "hold": int(hold_micros), "spend_key_id": spend_key_id, "now": now,
            "codes": [c for c, _ in legs], "amounts": [int(a) for _, a in legs]}


def settle(*, completion_id: str, created_at, account_id: str, customer: str, hold_code: str,
           revenue: str, hold_micros: int, cost_micros: int, model: str, provider: str,
           prompt_tokens: int, completion_tokens: int, estimated: bool, attempts: int,
           latency_ms: int, error: str | None, now) -> tuple[int, str | None, object, int] | None:
    """One round trip: (charged, spend-limited key of the hold, the hold's time, micros to
    give back to that key's limit), or None when this completion was no longer held.
    ``created_at`` (the hold's time, or None) narrows the search. Does not commit."""
    row = db.session.execute(_SETTLE, {
        "id": completion_id, "created_at": created_at, "account_id": account_id, "customer": customer,
        "hold_code": hold_code, "revenue": revenue, "hold": int(hold_micros), "cost": int(cost_micros),
        "model": model, "provider": provider, "prompt_tokens": int(prompt_tokens),
        "completion_tokens": int(completion_tokens), "estimated": bool(estimated), "attempts": int(attempts),
        "latency_ms": int(latency_ms), "error": error, "now": now}).first()
    return None if row is None else (int(row[0]), row[1], row[2], int(row[3]))

"""The chat completion's two PostgreSQL statements: the hold (``gw_chat_holds``) and the
settle (``gw_chat_settles``), server-side functions in ``app/services/money/sql/``, each
ONE autocommit statement on a connection of the process's pool (``uow.run_one``: one
pool checkout per statement, held only while it runs, no ``BEGIN``/``COMMIT``), as the
metered call's ``money.charging``. ``holds`` owns the release; these only build and run
the two statements.

Both are group statements (``charging.GroupStatement``, as the metered call's open): the
holds of this process that arrive while one hold statement is being written share the
next one (``GroupHolder``), and the settles likewise (``GroupSettler``); a completion
alone waits for nothing. Each row gets its own answer; a statement that fails for
anything else is split and each row written alone. One statement for several
completions costs PostgreSQL about half the CPU per completion of one each (bench/
DIARY.md, "Grouped chat holds and settles").

* ``hold``: the key's spend-limit reservation, the conditional debit, the ``chat_hold``
  posting and the ``held`` completion row in ONE round trip, committed without waiting
  for the WAL flush (set in the function). A refusal (key spend limit, member budget,
  insufficient funds) is the row's answer and leaves nothing of the row behind.
* ``settle``: the exact charge (never more than the hold), ``held → settled`` once, the
  customer's change, the ``chat_settle`` posting and the key's unused reservation back in
  ONE round trip, committed durably (the session default) before the answer leaves.

Retry safety (the autocommit pool has no pre-ping): a statement that fails because its
pooled connection was dead (``connection_invalidated``) is retried once on a fresh one
with the SAME parameters. A retried hold whose first attempt did commit (the connection
died after the COMMIT) fails on the hold posting's unique ref (or, for a hold of nothing,
the completion's primary key): the hold is in place, so that answers ``held`` without
holding twice (a group that fails so is split, and each row alone answers the same). A
retried settle whose first attempt committed finds the row no longer ``held`` and writes
nothing.
"""
from __future__ import annotations

from datetime import datetime

import orjson
from flask import current_app
from sqlalchemy.exc import DBAPIError

from app.services.money.charging import GroupStatement, per_app
from app.services.platform.uow import end_reads, run_one

_UNIQUE_VIOLATION = "23505"

# Driver-level SQL (psycopg placeholders, explicit casts): the statements are fixed, so
# SQLAlchemy's compile and bind processing are skipped; the engine's events (statement
# counters, tracing) still see them. One JSON document of rows each, one answer per row;
# each lock wait gives up after lock_wait_ms (0: no limit).
_HOLDS = ("SELECT completion_id, outcome "
          "FROM gw_chat_holds(%(rows)s::jsonb, %(lock_wait_ms)s::integer)")
_SETTLES = ("SELECT completion_id, charged, spend_key_id, held_at, give_back "
            "FROM gw_chat_settles(%(rows)s::jsonb, %(lock_wait_ms)s::integer)")


def _group_statement(sql: str, rows: list[dict], lock_wait: bool) -> list:
    wait = current_app.config["GROUP_LOCK_WAIT_MS"] if lock_wait else 0
    return run_one(sql, {"rows": orjson.dumps(rows).decode(), "lock_wait_ms": wait})


class GroupHolder(GroupStatement):
    """The holds' group statement (``gw_chat_holds``): each completion answered
    ``held``, ``insufficient``, ``key_spend_limit`` or ``member_budget``."""

    statement, key = "chat_hold", "id"

    def _run(self, rows: list[dict], *, lock_wait: bool) -> dict[str, str]:
        return dict(_group_statement(_HOLDS, rows, lock_wait))


class GroupSettler(GroupStatement):
    """The settles' group statement (``gw_chat_settles``): each completion answered
    (charged, the hold's spend-limited key, the hold's time, micros given back), or None
    when it was no longer held (nothing written)."""

    statement, key = "chat_settle", "id"

    def _run(self, rows: list[dict], *, lock_wait: bool) -> dict[str, tuple]:
        return {r[0]: (int(r[1]), r[2], r[3], int(r[4])) for r in _group_statement(_SETTLES, rows, lock_wait)}

    def _answer(self, answers: dict, row: dict):
        return answers.get(row["id"])  # none: no longer held


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None)


def hold(*, completion_id: str, account_id: str, requested_model: str, stream: bool,
         hold_micros: int, key_id: str | None, now: datetime, legs: list[tuple[str, int]],
         actor: str | None = None) -> str:
    """One round trip, committed by itself (possibly with other completions' holds):
    ``held``, or the refusal (``insufficient`` / ``key_spend_limit`` / ``member_budget``:
    nothing was written). ``key_id``: the API key whose spend limit the hold counts
    against (the function reserves it when the key has a limit)."""
    legs = sorted(legs, key=lambda leg: leg[1])  # debits first, as ledger.post orders them
    row = {"id": completion_id, "account_id": account_id, "actor": actor,
           "requested_model": requested_model, "stream": bool(stream), "hold": int(hold_micros),
           "spend_key": key_id, "now": now,
           "codes": [c for c, _ in legs], "amounts": [int(a) for _, a in legs]}
    # no connection held while waiting for the group's leader, nor, the credential
    # lookup's reads, through the provider call that follows
    end_reads()
    try:
        return per_app(current_app, "money.group_holder", GroupHolder).write(row)
    except DBAPIError as exc:
        if _sqlstate(exc) == _UNIQUE_VIOLATION:
            # the completion id is new (made by the gateway): only run_one's retry of a first
            # attempt that committed before its connection died can find it taken — held
            return "held"
        raise


def settle(*, completion_id: str, created_at, account_id: str, customer: str, hold_code: str,
           revenue: str, hold_micros: int, cost_micros: int, model: str, provider: str,
           prompt_tokens: int, completion_tokens: int, estimated: bool, attempts: int,
           latency_ms: int, error: str | None, now) -> tuple[int, str | None, object, int] | None:
    """One round trip, committed durably by itself (possibly with other completions'
    settles): (charged, the hold's spend-limited key, the hold's time, micros given back to
    that key's limit), or None when this completion was no longer held (settled or
    released before; nothing written). ``created_at`` (the hold's time, or None) finds the
    row in one partition."""
    row = {"id": completion_id, "created_at": created_at, "account_id": account_id, "customer": customer,
           "hold_code": hold_code, "revenue": revenue, "hold": int(hold_micros), "cost": int(cost_micros),
           "model": model, "provider": provider, "prompt_tokens": int(prompt_tokens),
           "completion_tokens": int(completion_tokens), "estimated": bool(estimated),
           "attempts": int(attempts), "latency_ms": int(latency_ms), "error": error, "now": now}
    # conditional on ``held``: a retry after a committed first attempt writes nothing
    end_reads()  # no connection held while waiting for the group's leader
    return per_app(current_app, "money.group_settler", GroupSettler).write(row)

"""``Idempotency-Key``: one mechanism, Stripe's semantics, for every POST that moves money
and for creates whose retry would make a second object (``POST /api/alerts``). Not for
``POST /api/keys``: the stored answer would keep the new key's secret in the database.

Records live in ``idempotency_records`` (unique per account and key, kept
``IDEMPOTENCY_TTL_SECONDS``, purged by ``money.refunds.purge_idempotency``). A request
claims its key by inserting the record ``in_flight`` — the unique constraint, not a prior
read, decides who owns the key — and stores its exact answer (``done``) when it
succeeded; a failure releases the key (nothing happened: a retry may do it). Then:

* the same key with the same request (its hash: the operation, the mode and the
  canonical body) answers the stored body — the first answer — and does nothing again;
  one still in flight is waited for up to ``IDEMPOTENCY_IN_FLIGHT_WAIT_MS``, then 409
  ``idempotency_key_in_use`` (retry later);
* the same key with another request is 409 ``idempotency_key_reused``.

The metered module call (``gateway.calls``) claims the key inside its charging statement
(``gw_open_calls``) and answers a replay with ``replay_or_conflict`` below; the other money-moving routes (wallet funding, checkout, agent funding) go through
``claim`` / ``complete`` / ``release``, wired by ``routing.endpoint(idempotent=…)``; so does
``POST /api/alerts``.
"""
from __future__ import annotations

import hashlib
import json
import time
from datetime import timedelta

from flask import current_app
from sqlalchemy import delete, select, text, update
from sqlalchemy.dialects.postgresql import insert

from app.errors import Conflict
from app.extensions import db
from app.ids import new_id
from app.models import IdempotencyRecord
from app.models.base import utcnow
from app.services.platform.uow import read, unit_of_work


class IdempotencyKeyReused(Conflict):
    code, message = "idempotency_key_reused", "The Idempotency-Key was used with a different request."
    description = "The Idempotency-Key was used with a different request."


class IdempotencyKeyInUse(Conflict):
    code, message = "idempotency_key_in_use", "A request with this Idempotency-Key is still in flight."
    description = "A request with this Idempotency-Key is still in flight."


def request_hash(operation: str, mode: str, body) -> str:
    """The hash a replay must match: the operation (method and path), the mode and the
    canonical JSON of the loaded body."""
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{operation}\n{mode}\n{canon}".encode()).hexdigest()


def existing(account_id: str, key: str, req_hash: str) -> str | None:
    """After losing the claim's insert race: the stored body to replay, or None to retry
    the insert (the record expired or was released); 409 otherwise."""
    with unit_of_work():
        row = db.session.execute(select(IdempotencyRecord.id, IdempotencyRecord.request_hash,
                                        IdempotencyRecord.status, IdempotencyRecord.response_body,
                                        IdempotencyRecord.expires_at)
                                 .where(IdempotencyRecord.account_id == account_id,
                                        IdempotencyRecord.key == key)).first()
        if row is None:
            return None
        now = utcnow()
        if row.expires_at <= now:
            db.session.execute(delete(IdempotencyRecord).where(IdempotencyRecord.id == row.id,
                                                               IdempotencyRecord.expires_at <= now))
            return None
    return replay_or_conflict(row.request_hash, row.status, row.response_body, req_hash, account_id, key)


_IN_FLIGHT_POLL_SECONDS = 0.02
_STORED = text("SELECT request_hash, status, response_body FROM idempotency_records "
               "WHERE account_id = :a AND key = :k")


def replay_or_conflict(stored_hash: str, status: str, body: str | None, req_hash: str,
                       account_id: str, key: str) -> str:
    """A live record of the key: its stored body (same request, done), else 409. A request
    still in flight is waited for up to ``IDEMPOTENCY_IN_FLIGHT_WAIT_MS``: the worker that
    answered it may not have stored its answer yet (deferred finalize), and a replay on
    any worker must return the cached response (SPEC part 4 rule 2)."""
    if stored_hash != req_hash:
        raise IdempotencyKeyReused("This Idempotency-Key was already used with a different request.")
    deadline = time.monotonic() + current_app.config["IDEMPOTENCY_IN_FLIGHT_WAIT_MS"] / 1000
    while status != "done" and time.monotonic() < deadline:
        time.sleep(_IN_FLIGHT_POLL_SECONDS)
        rows = read(_STORED, {"a": account_id, "k": key})
        if not rows:  # released (the request failed): the caller may retry it
            break
        stored_hash, status, body = rows[0]
        if stored_hash != req_hash:
            raise IdempotencyKeyReused("This Idempotency-Key was already used with a different request.")
    if status != "done":
        raise IdempotencyKeyInUse("A request with this Idempotency-Key is still in flight; retry later.")
    return body


def claim(account_id: str, key: str, req_hash: str) -> str | None:
    """Own ``key`` for this request (None: go ahead, then ``complete`` or ``release``), or
    the first answer's body to replay; 409 ``idempotency_key_reused`` /
    ``idempotency_key_in_use`` as above. Its own short unit of work, committed before the
    money moves, so a concurrent request with the key sees it at once."""
    for _ in range(3):
        now = utcnow()
        with unit_of_work():
            won = db.session.execute(insert(IdempotencyRecord).values(
                account_id=account_id, key=key, request_hash=req_hash, call_id=new_id("op"),
                status="in_flight", created_at=now,
                expires_at=now + timedelta(seconds=current_app.config["IDEMPOTENCY_TTL_SECONDS"]))
                .on_conflict_do_nothing(constraint="uq_idempotency_records_account_key")
                .returning(IdempotencyRecord.id)).first()
        if won is not None:
            return None
        stored = existing(account_id, key, req_hash)
        if stored is not None:
            return stored
    raise IdempotencyKeyInUse("A request with this Idempotency-Key is still in flight; retry later.")


def complete(account_id: str, key: str, body: str) -> None:
    """Store the answer of the request that owns ``key``: its replays return it."""
    with unit_of_work():
        db.session.execute(update(IdempotencyRecord).where(
            IdempotencyRecord.account_id == account_id, IdempotencyRecord.key == key,
            IdempotencyRecord.status == "in_flight").values(status="done", response_body=body))


def release(account_id: str, key: str) -> None:
    """The request that owns ``key`` failed (nothing happened): free the key for a retry."""
    with unit_of_work():
        db.session.execute(delete(IdempotencyRecord).where(
            IdempotencyRecord.account_id == account_id, IdempotencyRecord.key == key,
            IdempotencyRecord.status == "in_flight"))

"""Refunds of module calls: a provider failure, or the sweep finding a call still
``pending`` after its deadline (its process died between charging and finalizing); and
the purge of expired Idempotency-Key records.

A refund is the reversing ledger posting (unique ref ``call_refund:<id>``), the
conditional ``pending → refunded`` flip (so at most once, whoever gets there first), the
key's spend-limit and member-budget release and the release of the call's Idempotency-Key, in one unit of
work. Usage is not touched: it is read from the call log (``billing.usage_log``), where a
refunded call counts as an error without spend.
"""
from __future__ import annotations

from sqlalchemy import delete, select, update

from app.extensions import db
from app.models import IdempotencyRecord, ModuleCall
from app.models.calls import IS_PENDING
from app.models.base import utcnow
from app.services.money import spend
from app.services.money import revenue_share
from app.services.money import ledger
from app.services.money import charging
from app.services.platform.uow import unit_of_work


def refund(call_id: str, error: str, created_at=None) -> bool:
    """Refund a ``pending`` call exactly once (reversing posting, spend-limit release,
    release of its Idempotency-Key). Returns False when it was no longer pending. The
    call's ``created_at`` (given, or carried by a ``charging.OpenedCall``) prunes the
    update to its month's partition on PostgreSQL."""
    s = db.session
    created_at = created_at or charging.created_at_of(call_id)
    call_id = str(call_id)
    prune = [ModuleCall.created_at == created_at] if created_at is not None else []
    with unit_of_work():
        row = s.execute(update(ModuleCall).where(ModuleCall.id == call_id,
                                                 ModuleCall.status == "pending", *prune)
                        .values(status="refunded", error=error, finished_at=utcnow())
                        .returning(ModuleCall.account_id, ModuleCall.price_micros, ModuleCall.charged,
                                   ModuleCall.owner_agent_id, ModuleCall.idempotency_key,
                                   ModuleCall.created_at, ModuleCall.spend_key_id,
                                   ModuleCall.spend_reserved_from, ModuleCall.actor,
                                   ModuleCall.budget_member_id)
                        .execution_options(synchronize_session=False)).first()
        if row is None:
            return False
        # the key's record, then its counters, then the balance row: the order every money
        # operation takes them in (docs/money.md, "Lock order")
        if row.idempotency_key is not None:
            s.execute(delete(IdempotencyRecord).where(
                IdempotencyRecord.account_id == row.account_id,
                IdempotencyRecord.key == row.idempotency_key,
                IdempotencyRecord.call_id == call_id))
        if row.charged:
            spend.release(row.spend_key_id, row.price_micros, row.spend_reserved_from,
                          org=row.account_id, member=row.budget_member_id, at=row.created_at)
            back = revenue_share.reverse([(code, -amount) for code, amount in
                                          revenue_share.call_legs(row.account_id, row.price_micros,
                                                                  row.owner_agent_id)])
            ledger.post("module_call_refund", back, ref=f"call_refund:{call_id}",
                        account_id=row.account_id, meta={"call_id": call_id, "reason": error},
                        actor=row.actor)
    return True


def sweep_pending(limit: int = 500) -> int:
    """Refund calls still ``pending`` after their deadline (their process died between
    charging and finalizing). Safe to run concurrently; returns how many it refunded."""
    with unit_of_work():  # a read, ended before the refunds
        due = db.session.execute(
            select(ModuleCall.id, ModuleCall.created_at).where(IS_PENDING, ModuleCall.deadline_at < utcnow())
            .order_by(ModuleCall.deadline_at).limit(limit)).all()
    return sum(1 for call_id, created_at in due if refund(call_id, "swept", created_at))


def purge_idempotency(limit: int = 10_000) -> int:
    """Delete expired Idempotency-Key records (in batches); returns how many."""
    s = db.session
    total = 0
    while True:
        with unit_of_work():  # one batch
            ids = s.execute(select(IdempotencyRecord.id).where(IdempotencyRecord.expires_at <= utcnow())
                            .limit(limit)).scalars().all()
            if ids:
                s.execute(delete(IdempotencyRecord).where(IdempotencyRecord.id.in_(ids),
                                                          IdempotencyRecord.expires_at <= utcnow()))
        if not ids:
            return total
        total += len(ids)
        if len(ids) < limit:
            return total

"""Saved payment methods: every method an account saved with a processor (``POST
/api/pay/method`` saves one and makes it the default), listed, made the default again, or
removed (detached at the processor first; removing the default leaves none, so
``/api/wallet/fund`` and auto top-up answer ``no_payment_method`` until another is chosen).
Keyed like the billing profile: by the processor of the credential's mode."""
from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from app.errors import NotFound
from app.extensions import db
from app.models import SavedMethod
from app.models.base import utcnow
from app.services.billing import payments
from app.services.billing.processors import MethodInfo, for_mode
from app.services.orgs import audit
from app.services.platform.uow import unit_of_work


def remember(account_id: str, processor: str, info: MethodInfo) -> None:
    """Record a saved method (in the caller's unit of work; a second save changes nothing)."""
    db.session.execute(pg_insert(SavedMethod).values(
        account_id=account_id, processor=processor, payment_method_id=info.id, payment_method_type=info.type,
        brand=info.brand, last4=info.last4, created_at=utcnow()).on_conflict_do_nothing())


def list_methods(account_id: str, mode: str) -> list[dict]:
    """The saved methods of the mode's processor, oldest first, with ``default``."""
    processor = for_mode(mode).name
    profile = payments.saved_method(account_id, mode)
    default = profile.payment_method_id if profile else None
    rows = db.session.execute(select(SavedMethod).where(
        SavedMethod.account_id == account_id, SavedMethod.processor == processor)
        .order_by(SavedMethod.created_at, SavedMethod.id)).scalars().all()
    return [{"payment_method_id": r.payment_method_id, "payment_method_type": r.payment_method_type,
             "brand": r.brand, "last4": r.last4, "processor": r.processor,
             "default": r.payment_method_id == default, "created_at": r.created_at} for r in rows]


def _find(account_id: str, mode: str, pm_id: str) -> SavedMethod | None:
    return db.session.execute(select(SavedMethod).where(
        SavedMethod.account_id == account_id, SavedMethod.processor == for_mode(mode).name,
        SavedMethod.payment_method_id == pm_id)).scalar_one_or_none()


def _saved(account_id: str, mode: str, pm_id: str) -> SavedMethod:
    row = _find(account_id, mode, pm_id)
    if row is None:
        raise NotFound("No such saved payment method.")
    return row


def make_default(account_id: str, mode: str, pm_id: str):
    """Make a saved method the default again."""
    _saved(account_id, mode, pm_id)
    return payments.set_default_method(account_id, mode, pm_id)


def remove(account_id: str, mode: str, pm_id: str) -> None:
    """Detach the method at the processor, then forget it (and the default, if it was).
    Idempotent, as deleting an alert: removing one already removed changes nothing (no
    processor call, no second audit entry) and answers as the first time (its ``method.remove``
    entry is the record). Never saved, another account's or the other mode's → 404."""
    row = _find(account_id, mode, pm_id)
    if row is None:
        if audit.last_removal(account_id, "method.remove", target=pm_id, mode=mode) is None:
            raise NotFound("No such saved payment method.")
        return
    for_mode(mode).detach(pm_id)
    with unit_of_work():
        res = db.session.execute(delete(SavedMethod).where(SavedMethod.id == row.id))
        if res.rowcount == 0:
            return  # a concurrent removal committed it first
        profile = payments.saved_method(account_id, mode)
        if profile is not None and profile.payment_method_id == pm_id:
            profile.payment_method_id = profile.payment_method_type = profile.brand = profile.last4 = None
        audit.record(account_id, None, "method.remove", pm_id, before={"mode": mode})

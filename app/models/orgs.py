"""Organisations (teams, issue 37). An organisation is an ``accounts`` row of kind ``org``:
a payer with its own live and test balances in the one ledger, funded by every rail by its
id. These tables say who belongs to it, what each member may do, who was invited, and what
was changed (the append-only audit log)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import BigIntPK, JSONType, UTCDateTime, utcnow

ROLES = ("owner", "admin", "billing", "developer", "viewer")


class OrgMember(db.Model):
    """One person's membership: ``account_id`` (their own account) in ``org_id`` (the
    organisation's account) with a ``role`` and an optional ``monthly_budget_micros``: the
    most the member's organisation keys together may spend per UTC month (NULL: no
    budget), counted in ``member_spend`` by the money engine (``gw_spend_reserve``)."""

    __tablename__ = "org_members"
    __table_args__ = (
        CheckConstraint("role IN ('owner', 'admin', 'billing', 'developer', 'viewer')", name="org_member_role"),
        CheckConstraint("monthly_budget_micros >= 0", name="budget_nonnegative"),
    )

    org_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True, index=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    monthly_budget_micros: Mapped[int | None] = mapped_column(BigInteger)


class MemberSpend(db.Model):
    """What one member's organisation keys spent in one UTC month (``period_start``: the
    1st, 00:00 UTC) of one organisation. Changed only by the money engine
    (``gw_spend_reserve`` / ``gw_spend_release``), one conditional statement per reserve
    or release, in the statement of the charge itself."""

    __tablename__ = "member_spend"
    __table_args__ = (CheckConstraint("spent_micros >= 0", name="spent_nonnegative"),)

    org_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    member_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    period_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    spent_micros: Mapped[int] = mapped_column(BigInteger, default=0)


class OrgAuditEntry(db.Model):
    """One change in an organisation, written in the same transaction as the change and
    never updated or deleted: who (``actor_account_id``, the member), with which credential
    (``credential_id``), what (``action``, ``target``), the state before and after, the
    request id and the client's IP."""

    __tablename__ = "org_audit"
    __table_args__ = (Index("ix_org_audit_org_id_id", "org_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    org_id: Mapped[str] = mapped_column(String(32))
    actor_account_id: Mapped[str | None] = mapped_column(String(32))
    credential_id: Mapped[str | None] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(40))
    target: Mapped[str | None] = mapped_column(String(320))
    before: Mapped[dict | None] = mapped_column(JSONType)
    after: Mapped[dict | None] = mapped_column(JSONType)
    request_id: Mapped[str | None] = mapped_column(String(64))
    ip: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class OrgInvite(db.Model):
    """An invitation by e-mail to join ``org_id`` with ``role``. Its link's token is a
    platform single-use token (purpose ``org_invite``, subject = this id; 7 days); this row
    says what it is for and how it ended (accepted by whom, or revoked)."""

    __tablename__ = "org_invites"
    __table_args__ = (
        CheckConstraint("role IN ('owner', 'admin', 'billing', 'developer', 'viewer')", name="org_invite_role"),
        Index("ix_org_invites_org_id_email", "org_id", "email"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    org_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    email: Mapped[str] = mapped_column(String(320))
    role: Mapped[str] = mapped_column(String(16))
    invited_by: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    accepted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    accepted_by: Mapped[str | None] = mapped_column(String(32))
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

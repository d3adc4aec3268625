"""member budgets: a member's monthly spend cap over all their organisation keys

* ``org_members.monthly_budget_micros``: the member's monthly budget in the organisation
  (NULL: none; ``>= 0``).
* ``member_spend``: what a member's organisation keys spent per UTC month (one row per
  organisation, member and month), the counter the engine's ``gw_spend_reserve`` moves in
  the same statement as the debit (``app/services/money/sql/``).
* ``module_calls.budget_member_id`` / ``chat_completions.budget_member_id``: the member
  whose monthly counter the charge was counted in (NULL: none), so a refund, release or
  settle gives the room back to the month of the row's ``created_at`` (the reservation's
  time).
* ``gw_spend_reserve`` gains an output column (a changed result type, which CREATE OR
  REPLACE refuses): the old one is dropped here and the file installs the new one after
  the upgrade (``app/sqlfunctions.py``).

Revision ID: member_budgets
Revises: billing
"""
import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime

revision = "member_budgets"
down_revision = "billing"
branch_labels = None
depends_on = None


def upgrade():
    op.execute("DROP FUNCTION IF EXISTS gw_spend_reserve(varchar, bigint, timestamptz)")
    op.add_column("org_members", sa.Column("monthly_budget_micros", sa.BigInteger(), nullable=True))
    op.create_check_constraint(op.f("ck_org_members_budget_nonnegative"), "org_members",
                               "monthly_budget_micros >= 0")
    op.create_table(
        "member_spend",
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("member_id", sa.String(length=32), nullable=False),
        sa.Column("period_start", UTCDateTime(), nullable=False),
        sa.Column("spent_micros", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("spent_micros >= 0", name=op.f("ck_member_spend_spent_nonnegative")),
        sa.PrimaryKeyConstraint("org_id", "member_id", "period_start", name=op.f("pk_member_spend")),
    )
    op.add_column("module_calls", sa.Column("budget_member_id", sa.String(length=32), nullable=True))
    op.add_column("chat_completions", sa.Column("budget_member_id", sa.String(length=32), nullable=True))


def downgrade():
    # gw_spend_reserve stays as its file defines it (the baseline's downgrade drops every
    # gw_ function; an upgrade to head installs the files again)
    op.drop_column("chat_completions", "budget_member_id")
    op.drop_column("module_calls", "budget_member_id")
    op.drop_table("member_spend")
    op.drop_constraint(op.f("ck_org_members_budget_nonnegative"), "org_members", type_="check")
    op.drop_column("org_members", "monthly_budget_micros")

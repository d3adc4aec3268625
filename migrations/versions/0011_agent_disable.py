"""agent disable: who registered an agent, and when its owner disabled it

* ``agents.registered_by``: the person whose credential registered the agent (for an
  organisation's agent, the member); removing that member from the organisation disables
  the agent like it revokes the member's organisation keys. NULL for agents registered
  before this revision.
* ``agents.disabled_at``: set once by ``DELETE /api/agent/{id}`` (or the member's
  removal); a partial index finds the disabled agents whose balance the
  ``agent-balances-return`` job returns to their owner.

Revision ID: agent_disable
Revises: usdc_payouts
"""
import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime

revision = "agent_disable"
down_revision = "usdc_payouts"
branch_labels = None
depends_on = None


def upgrade():
    op.add_column("agents", sa.Column("registered_by", sa.String(32), nullable=True))
    op.add_column("agents", sa.Column("disabled_at", UTCDateTime(), nullable=True))
    op.create_index("ix_agents_registered_by", "agents", ["owner_account_id", "registered_by"],
                    postgresql_where=sa.text("registered_by IS NOT NULL AND disabled_at IS NULL"))
    op.create_index("ix_agents_disabled", "agents", ["disabled_at"],
                    postgresql_where=sa.text("disabled_at IS NOT NULL"))


def downgrade():
    op.drop_index("ix_agents_disabled", table_name="agents")
    op.drop_index("ix_agents_registered_by", table_name="agents")
    op.drop_column("agents", "disabled_at")
    op.drop_column("agents", "registered_by")

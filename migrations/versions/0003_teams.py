"""teams: organisations that share one balance (issue 37)

* An organisation is an ``accounts`` row of kind ``org`` (its balances are the account's
  live and test balances in the one ledger); ``accounts.name`` is its name.
* ``api_keys.member_account_id``: on an organisation key (``account_id`` = the
  organisation, which pays), the member who owns it.
* ``org_members`` (role), ``org_invites`` (e-mail invitations; the link's
  token is a platform single-use token), ``org_audit`` (append-only like the ledger: the
  ledger's trigger function ``gw_ledger_append_only`` refuses any UPDATE or DELETE).

Revision ID: teams
Revises: money_engine
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from app.models.base import UTCDateTime
from migrations.helpers import create_append_only_trigger, drop_append_only_trigger

revision = "teams"
down_revision = "money_engine"
branch_labels = None
depends_on = None

_ROLE_CHECK = "role IN ('owner', 'admin', 'billing', 'developer', 'viewer')"


def upgrade():
    op.create_table(
        "org_audit",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("actor_account_id", sa.String(length=32), nullable=True),
        sa.Column("credential_id", sa.String(length=64), nullable=True),
        sa.Column("action", sa.String(length=40), nullable=False),
        sa.Column("target", sa.String(length=320), nullable=True),
        sa.Column("before", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("after", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("ip", sa.String(length=64), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_org_audit")),
    )
    op.create_index("ix_org_audit_org_id_id", "org_audit", ["org_id", "id"], unique=False)
    op.create_table(
        "org_invites",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("invited_by", sa.String(length=32), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("accepted_at", UTCDateTime(), nullable=True),
        sa.Column("accepted_by", sa.String(length=32), nullable=True),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.CheckConstraint(_ROLE_CHECK, name=op.f("ck_org_invites_org_invite_role")),
        sa.ForeignKeyConstraint(["org_id"], ["accounts.id"], name=op.f("fk_org_invites_org_id_accounts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_org_invites")),
    )
    op.create_index("ix_org_invites_org_id_email", "org_invites", ["org_id", "email"], unique=False)
    op.create_table(
        "org_members",
        sa.Column("org_id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint(_ROLE_CHECK, name=op.f("ck_org_members_org_member_role")),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"], name=op.f("fk_org_members_account_id_accounts")),
        sa.ForeignKeyConstraint(["org_id"], ["accounts.id"], name=op.f("fk_org_members_org_id_accounts")),
        sa.PrimaryKeyConstraint("org_id", "account_id", name=op.f("pk_org_members")),
    )
    op.create_index(op.f("ix_org_members_account_id"), "org_members", ["account_id"], unique=False)
    op.add_column("accounts", sa.Column("name", sa.String(length=100), nullable=True))
    op.add_column("api_keys", sa.Column("member_account_id", sa.String(length=32), nullable=True))
    op.create_index(op.f("ix_api_keys_member_account_id"), "api_keys", ["member_account_id"], unique=False)
    create_append_only_trigger("org_audit")


def downgrade():
    drop_append_only_trigger("org_audit")
    op.drop_index(op.f("ix_api_keys_member_account_id"), table_name="api_keys")
    op.drop_column("api_keys", "member_account_id")
    op.drop_column("accounts", "name")
    op.drop_index(op.f("ix_org_members_account_id"), table_name="org_members")
    op.drop_table("org_members")
    op.drop_index("ix_org_invites_org_id_email", table_name="org_invites")
    op.drop_table("org_invites")
    op.drop_index("ix_org_audit_org_id_id", table_name="org_audit")
    op.drop_table("org_audit")

"""bring your own key and per-key controls (issue 39 items 4 and 5)

* ``provider_keys``: an owner's own chat-provider keys, encrypted at rest (SecretBox), one
  per owner and provider; ``owner_kind`` is ``account`` (organisations later).
* ``accounts.byok_only`` / ``accounts.byok_fallback``: route only to own keys; may a
  failing own key fall back to the platform's keys.
* ``chat_completions.byok_key_id`` / ``list_cost_micros``: the completion used this own
  key; its cost at the model's price (the charge is the platform fee).
* ``api_keys.allowed_models`` / ``allowed_modules`` / ``rpm_limit`` / ``tpm_limit``: the
  key's allow-lists and per-minute limits.
* ``key_rate_windows``: those per-minute counters when the rate-limit storage is not Redis.

Revision ID: byok_key_controls
Revises: teams
"""
import sqlalchemy as sa
from alembic import op

from app.models.base import JSONType, UTCDateTime
from migrations.helpers import create_key_rate_windows

revision = "byok_key_controls"
down_revision = "teams"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "provider_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner_kind", sa.String(8), nullable=False),
        sa.Column("owner_id", sa.String(32), nullable=False),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("checked_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("owner_kind", "owner_id", "provider", name="uq_provider_keys_owner"),
    )
    op.create_index("ix_provider_keys_owner_id", "provider_keys", ["owner_id"])
    create_key_rate_windows()
    op.add_column("accounts", sa.Column("byok_only", sa.Boolean(), server_default="false", nullable=False))
    op.add_column("accounts", sa.Column("byok_fallback", sa.Boolean(), server_default="false", nullable=False))
    op.add_column("chat_completions", sa.Column("byok_key_id", sa.String(32), nullable=True))
    op.add_column("chat_completions", sa.Column("list_cost_micros", sa.BigInteger(), nullable=True))
    op.add_column("api_keys", sa.Column("allowed_models", JSONType, nullable=True))
    op.add_column("api_keys", sa.Column("allowed_modules", JSONType, nullable=True))
    op.add_column("api_keys", sa.Column("rpm_limit", sa.Integer(), nullable=True))
    op.add_column("api_keys", sa.Column("tpm_limit", sa.Integer(), nullable=True))


def downgrade():
    for column in ("tpm_limit", "rpm_limit", "allowed_modules", "allowed_models"):
        op.drop_column("api_keys", column)
    for column in ("list_cost_micros", "byok_key_id"):
        op.drop_column("chat_completions", column)
    for column in ("byok_fallback", "byok_only"):
        op.drop_column("accounts", column)
    op.drop_table("key_rate_windows")
    op.drop_index("ix_provider_keys_owner_id", table_name="provider_keys")
    op.drop_table("provider_keys")

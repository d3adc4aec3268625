"""billing: auto top-up

* ``auto_topups``: an account's auto top-up rule per mode (threshold, amount, monthly cap,
  consecutive failures, disabled reason).
* ``auto_topup_runs``: one row per threshold crossing's top-up; at most one open (queued or
  processing) per account and mode (unique partial index).
* ``accounts.topup_below_micros`` / ``test_topup_below_micros``: the thresholds cached on
  the balance row (NULL: off) and the row trigger ``gw_accounts_autotopup`` whose WHEN
  clause compares them with the old and new balance, so only a crossing calls
  ``gw_autotopup_crossed`` (``app/services/billing/sql/``), which queues the run.

Revision ID: billing
Revises: money_engine
"""
import sqlalchemy as sa
from alembic import op

from app.models.base import UTCDateTime

revision = "billing"
down_revision = "money_engine"
branch_labels = None
depends_on = None

_OPEN = sa.text("status IN ('queued', 'processing')")
_WHEN = ("(NEW.topup_below_micros IS NOT NULL AND NEW.balance_micros < NEW.topup_below_micros "
         "AND OLD.balance_micros >= NEW.topup_below_micros) "
         "OR (NEW.test_topup_below_micros IS NOT NULL AND NEW.test_balance_micros < NEW.test_topup_below_micros "
         "AND OLD.test_balance_micros >= NEW.test_topup_below_micros)")


def upgrade():
    op.add_column("accounts", sa.Column("topup_below_micros", sa.BigInteger(), nullable=True))
    op.add_column("accounts", sa.Column("test_topup_below_micros", sa.BigInteger(), nullable=True))
    op.create_table(
        "auto_topups",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("account_id", sa.String(32), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("threshold_micros", sa.BigInteger(), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("monthly_cap_micros", sa.BigInteger(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("disabled_reason", sa.String(300), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("account_id", "mode", name="uq_auto_topups_account_mode"),
    )
    op.create_table(
        "auto_topup_runs",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("account_id", sa.String(32), sa.ForeignKey("accounts.id"), nullable=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(300), nullable=True),
        sa.Column("balance_micros", sa.BigInteger(), nullable=True),
        sa.Column("amount_micros", sa.BigInteger(), nullable=True),
        sa.Column("payment_id", sa.String(32), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("due_at", UTCDateTime(), nullable=False),
        sa.Column("lease_until", UTCDateTime(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_index("uq_auto_topup_runs_open", "auto_topup_runs", ["account_id", "mode"], unique=True,
                    postgresql_where=_OPEN)
    op.create_index("ix_auto_topup_runs_due", "auto_topup_runs", ["due_at"], postgresql_where=_OPEN)
    op.create_index("ix_auto_topup_runs_account", "auto_topup_runs", ["account_id", "mode", "created_at"])
    from app import sqlfunctions

    sqlfunctions.install(op.get_bind(), ["gw_autotopup_crossed"])
    op.execute("CREATE TRIGGER gw_accounts_autotopup AFTER UPDATE OF balance_micros, test_balance_micros "
               f"ON accounts FOR EACH ROW WHEN ({_WHEN}) EXECUTE FUNCTION gw_autotopup_crossed()")


def downgrade():
    op.execute("DROP TRIGGER IF EXISTS gw_accounts_autotopup ON accounts")
    op.drop_table("auto_topup_runs")
    op.drop_table("auto_topups")
    op.drop_column("accounts", "test_topup_below_micros")
    op.drop_column("accounts", "topup_below_micros")

"""alert target verification: alerts.status

``active`` (every existing alert: they keep sending as before) or
``pending_verification`` (an e-mail target other than the account's own address, until
its owner follows the confirmation link: app/services/billing/alert_targets.py).

Revision ID: alert_status
Revises: keys
Create Date: 2026-11-29 10:00:00.000000

"""
from alembic import op
import sqlalchemy as sa

# revision identifiers, used by Alembic.
revision = 'alert_status'
down_revision = 'keys'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('alerts') as batch:
        batch.add_column(sa.Column('status', sa.String(length=24), nullable=False,
                                   server_default='active'))


def downgrade():
    with op.batch_alter_table('alerts') as batch:
        batch.drop_column('status')

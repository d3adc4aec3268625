"""subscription mailbox: one subscription per inbox and list

* ``subscriptions.mailbox``: the canonical mailbox of ``email``
  (``app.services.accounts.mailbox.canonical``: lower-cased, ``+tag`` dropped, Gmail's
  dots and ``googlemail.com`` folded), unique with ``list``; subscribe and unsubscribe
  find a row by it, so every spelling of one inbox reaches the same row. ``email`` stays:
  it is where list mail is delivered.
* Rows stored before this revision get their mailbox from that same ``canonical()``,
  called here rather than repeated in SQL: a second copy of the fold could drift from the
  one the application looks rows up with, and a row folded differently would be out of
  reach of unsubscribe (the defect this revision fixes). On a fresh database the table is
  empty, so a later replay running a later ``canonical()`` changes nothing; a changed fold
  needs a migration that refolds the stored mailboxes anyway (``accounts.mailbox`` too).
* Several rows of one mailbox on one list (two spellings subscribed before): the most
  relevant stays — subscribed over pending over unsubscribed, then the newest — and the
  others go with their confirmation tokens. A downgrade does not bring them back.
* The unique (email, list) and the index on ``email`` go: the new constraint implies the
  first, and no query looks rows up by ``email`` any more.

Revision ID: subscription_mailbox
Revises: agent_disable
"""
import sqlalchemy as sa
from alembic import op

from app.services.accounts.mailbox import canonical

revision = "subscription_mailbox"
down_revision = "agent_disable"
branch_labels = None
depends_on = None

# Which row of one mailbox on one list is kept: the first in this order.
_KEEP_ORDER = ("CASE status WHEN 'subscribed' THEN 0 WHEN 'pending' THEN 1 ELSE 2 END, "
               "created_at DESC, id DESC")


def upgrade():
    op.add_column("subscriptions", sa.Column("mailbox", sa.String(320), nullable=True))
    conn = op.get_bind()
    emails = conn.execute(sa.text("SELECT DISTINCT email FROM subscriptions")).scalars().all()
    if emails:
        conn.execute(sa.text("UPDATE subscriptions SET mailbox = :mailbox WHERE email = :email"),
                     [{"email": email, "mailbox": canonical(email)} for email in emails])
    conn.execute(sa.text(
        "WITH ranked AS (SELECT id, row_number() OVER (PARTITION BY mailbox, list "
        f"ORDER BY {_KEEP_ORDER}) AS n FROM subscriptions), "
        "gone AS (DELETE FROM subscriptions s USING ranked r WHERE s.id = r.id AND r.n > 1 "
        "RETURNING s.id) "
        "DELETE FROM single_use_tokens WHERE purpose = 'newsletter_confirm' "
        "AND subject IN (SELECT id FROM gone)"))
    op.alter_column("subscriptions", "mailbox", nullable=False)
    op.drop_constraint("uq_subscriptions_email_list", "subscriptions", type_="unique")
    op.drop_index("ix_subscriptions_email", table_name="subscriptions")
    op.create_unique_constraint("uq_subscriptions_mailbox_list", "subscriptions", ["mailbox", "list"])


def downgrade():
    op.drop_constraint("uq_subscriptions_mailbox_list", "subscriptions", type_="unique")
    op.create_index("ix_subscriptions_email", "subscriptions", ["email"])
    op.create_unique_constraint("uq_subscriptions_email_list", "subscriptions", ["email", "list"])
    op.drop_column("subscriptions", "mailbox")

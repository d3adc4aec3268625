"""gw_open_calls(rows, lock_wait_ms): a group of opens waits for a row lock only briefly

The grouped open (migration 0027) takes its rows in account order, which keeps two groups
from deadlocking with each other on account rows — but not with everything else. A
review found three ways a group could still deadlock, each reproduced against the
function (tests/services/test_group_opener.py):

* the same Idempotency-Key in two groups (a duplicate request in another process): per
  row the key is locked before the account, across rows the account is taken by the
  account's first row, so one group holds the account and waits for the key the other
  inserted, which waits for the account;
* a row answered ``existing`` keeps the key's record locked (``ON CONFLICT DO UPDATE``
  locks the conflicting row even when its WHERE is false) while a later row of the same
  account waits for the account row — which a refund of that key's call holds while it
  waits to delete the record;
* writers that lock two accounts in another order (an agent's funding: the owner's
  account, then the agent's) against a group holding calls of both.

And one account's locked row held up every open of the process queued behind the
statement that waited for it, whatever their accounts. A call opened alone holds one
account and blocks nobody else's open. So each lock wait of a group's statement (also of
one row) now lasts at most ``p_lock_wait_ms`` (PostgreSQL's ``lock_timeout`` for the
statement's transaction, below ``deadlock_timeout``, so a wait in a deadlock is given up
before the deadlock is even looked for; it is per wait: a statement meeting several
short waits in turn takes several limits); the statement then fails with nothing
committed and
``charging.GroupOpener`` opens its calls one by one outside the queue, each waiting as
long as it takes, as before grouping (``CALL_OPEN_GROUP_LOCK_WAIT_MS``, 100 ms).
``p_lock_wait_ms`` 0: no limit.

Replaces 0027's ``gw_open_calls(jsonb)`` (dropped); downgrade restores it.

Revision ID: grouped_open_lock_wait
Revises: grouped_open
Create Date: 2026-11-24 17:30:00.000000
"""
import importlib.util
import os

from alembic import op

revision = "grouped_open_lock_wait"
down_revision = "grouped_open"
branch_labels = None
depends_on = None


def _previous_function() -> str:
    """0027's function text (its module's FUNCTION): downgrade's, and this one's base."""
    path = os.path.join(os.path.dirname(__file__), "0027_grouped_open.py")
    spec = importlib.util.spec_from_file_location("_grouped_open_0027", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FUNCTION


_SIGNATURE = ("gw_open_calls(p_rows jsonb)", "gw_open_calls(p_rows jsonb, p_lock_wait_ms integer)")
_SYNC = "    PERFORM set_config('synchronous_commit', 'off', true);\n"
_LOCK_WAIT = _SYNC + """    -- a group waits for a row lock at most this long (then its rows go one by one)
    IF p_lock_wait_ms > 0 THEN
        PERFORM set_config('lock_timeout', p_lock_wait_ms || 'ms', true);
    END IF;
"""


def _function() -> str:
    """0027's function with the lock-wait argument: the same per-row body."""
    text = _previous_function()
    assert text.count(_SIGNATURE[0]) == 1 and text.count(_SYNC) == 1
    return text.replace(*_SIGNATURE).replace(_SYNC, _LOCK_WAIT)


def upgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS gw_open_calls(jsonb)")
        op.execute(_function())


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS gw_open_calls(jsonb, integer)")
        op.execute(_previous_function())

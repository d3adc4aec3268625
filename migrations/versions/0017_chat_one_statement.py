"""chat path: gw_chat_hold() and gw_chat_settle(), a chat completion's hold and settle in
ONE statement each (PostgreSQL only)

``app/services/billing/holds_pg.py`` calls them; docs/performance.md ("The chat
completion, step by step") explains the path.

``gw_chat_hold`` — before the first upstream call:

1. ``synchronous_commit = off`` for this transaction (settle/release commit durably
   before the answer is sent; see docs/performance.md);
2. the conditional debit of every ``acct:`` leg (``balance + delta >= 0``); an uncovered
   one answers ``insufficient`` having written nothing (so the statement may run in
   autocommit);
3. the ``held`` completion row, then the ``chat_hold`` posting and its entries.

``gw_chat_settle`` — after the upstream answered:

1. the exact charge: the cost, or when it exceeds the hold, the hold plus what the
   balance can still give (the account row locked; the rest is the ``shortfall``);
2. ``held → settled`` (by id and ``created_at``, looked up when not given, so a table
   partitioned by time is searched in one partition; conditional: zero rows answered when the completion was already
   settled or released, nothing written);
3. the customer's balance gets back ``hold − charge`` (or pays the difference);
4. the ``chat_settle`` posting (its non-zero legs; meta as ``ledger.post`` wrote it);
5. answers the charge, the spend-limited key of the hold, the hold's time and the micros
   to give back to that key's limit (Python releases them: the limit period rules live in
   ``app.services.accounts.spend``).

The ledger account codes come from Python (``ledger.customer``, ``holds.HOLD``,
``ledger.REVENUE``); only the cached-balance branch (``acct:`` → ``balance_micros``)
knows their shape. SQLite keeps the multi-statement path behind the same interface.

Revision ID: chat_one_statement
Revises: hot_path_v2
Create Date: 2026-11-22 23:10:00.000000
"""
from alembic import op

revision = "chat_one_statement"
down_revision = "hot_path_v2"
branch_labels = None
depends_on = None

HOLD = r"""
CREATE OR REPLACE FUNCTION gw_chat_hold(
    p_id varchar, p_account_id varchar, p_requested_model varchar, p_stream boolean,
    p_hold bigint, p_spend_key_id varchar, p_now timestamptz,
    p_codes varchar[], p_amounts bigint[])
RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    v_txn bigint;
    i integer;
BEGIN
    -- 1. settle/release (durable) flush this transaction's WAL before any answer
    PERFORM set_config('synchronous_commit', 'off', true);

    -- 2. debits first, each conditional; nothing is written before they all passed
    IF p_hold > 0 THEN
        FOR i IN 1 .. array_length(p_codes, 1) LOOP
            IF p_codes[i] LIKE 'acct:%' THEN
                UPDATE accounts SET balance_micros = balance_micros + p_amounts[i]
                 WHERE id = substr(p_codes[i], 6)
                   AND balance_micros + p_amounts[i] >= 0;
                IF NOT FOUND THEN
                    RETURN 'insufficient';
                END IF;
            END IF;
        END LOOP;
    END IF;

    -- 3. the held completion, then the posting
    INSERT INTO chat_completions (id, account_id, mode, requested_model, status, stream,
                                  hold_micros, spend_key_id, cost_micros, prompt_tokens,
                                  completion_tokens, usage_estimated, attempts, latency_ms,
                                  created_at)
    VALUES (p_id, p_account_id, 'live', p_requested_model, 'held', p_stream, p_hold,
            p_spend_key_id, 0, 0, 0, false, 0, 0, p_now);
    IF p_hold > 0 THEN
        INSERT INTO ledger_transactions (kind, ref, account_id, meta, created_at)
        VALUES ('chat_hold', 'chat_hold:' || p_id, p_account_id, NULL, p_now)
        RETURNING id INTO v_txn;
        INSERT INTO ledger_entries (txn_id, ledger_account, amount_micros, created_at)
        SELECT v_txn, leg.code, leg.amount, p_now
          FROM unnest(p_codes, p_amounts) AS leg(code, amount)
         WHERE leg.amount <> 0;
    END IF;
    RETURN 'held';
END
$fn$;
"""

SETTLE = r"""
CREATE OR REPLACE FUNCTION gw_chat_settle(
    p_id varchar, p_created timestamptz, p_account_id varchar,
    p_customer varchar, p_hold_code varchar, p_revenue varchar,
    p_hold bigint, p_cost bigint, p_model varchar, p_provider varchar,
    p_prompt_tokens integer, p_completion_tokens integer, p_estimated boolean,
    p_attempts integer, p_latency_ms integer, p_error varchar, p_now timestamptz)
RETURNS TABLE (charged bigint, spend_key_id varchar, held_at timestamptz, give_back bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_charge bigint := p_cost;
    v_balance bigint;
    v_key varchar;
    v_held_at timestamptz;
    v_txn bigint;
    v_meta jsonb;
BEGIN
    -- 1. the exact charge; above the hold only what the balance can still give
    IF p_cost > p_hold THEN
        SELECT a.balance_micros INTO v_balance FROM accounts a WHERE a.id = p_account_id FOR UPDATE;
        v_charge := p_hold + least(p_cost - p_hold, greatest(coalesce(v_balance, 0), 0));
    END IF;

    -- 2. held -> settled, once (by id and creation time: one partition of a partitioned table)
    v_held_at := p_created;
    IF v_held_at IS NULL THEN
        SELECT c.created_at INTO v_held_at FROM chat_completions c WHERE c.id = p_id;
    END IF;
    UPDATE chat_completions c
       SET status = 'settled', model = p_model, provider = p_provider, cost_micros = v_charge,
           prompt_tokens = p_prompt_tokens, completion_tokens = p_completion_tokens,
           usage_estimated = p_estimated, attempts = p_attempts, latency_ms = p_latency_ms,
           error = p_error, settled_at = p_now
     WHERE c.id = p_id AND c.created_at = v_held_at AND c.status = 'held'
    RETURNING c.spend_key_id INTO v_key;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    -- 3. the customer's part of the hold back (or the difference paid, capped above)
    IF p_hold <> v_charge AND p_customer LIKE 'acct:%' THEN
        UPDATE accounts SET balance_micros = balance_micros + (p_hold - v_charge)
         WHERE id = substr(p_customer, 6);
    END IF;

    -- 4. the posting: hold -H, customer +(H - C), revenue +C (non-zero legs)
    IF p_hold <> 0 OR v_charge <> 0 THEN
        v_meta := jsonb_build_object('model', p_model, 'provider', p_provider,
                                     'prompt_tokens', p_prompt_tokens,
                                     'completion_tokens', p_completion_tokens,
                                     'estimated', p_estimated);
        IF p_cost > v_charge THEN
            v_meta := v_meta || jsonb_build_object('shortfall_micros', p_cost - v_charge);
        END IF;
        INSERT INTO ledger_transactions (kind, ref, account_id, meta, created_at)
        VALUES ('chat_settle', 'chat_settle:' || p_id, p_account_id, v_meta, p_now)
        RETURNING id INTO v_txn;
        INSERT INTO ledger_entries (txn_id, ledger_account, amount_micros, created_at)
        SELECT v_txn, leg.code, leg.amount, p_now
          FROM (VALUES (1, p_hold_code, -p_hold), (2, p_customer, p_hold - v_charge),
                       (3, p_revenue, v_charge)) AS leg(n, code, amount)
         WHERE leg.amount <> 0
         ORDER BY leg.n;
    END IF;

    -- 5. what Python gives back to the key's spend limit
    RETURN QUERY SELECT v_charge, v_key, v_held_at, greatest(p_hold - v_charge, 0);
END
$fn$;
"""


def upgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute(HOLD)
        op.execute(SETTLE)


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS gw_chat_settle(varchar, timestamptz, varchar, varchar, varchar, "
                   "varchar, bigint, bigint, varchar, varchar, integer, integer, boolean, integer, integer, "
                   "varchar, timestamptz)")
        op.execute("DROP FUNCTION IF EXISTS gw_chat_hold(varchar, varchar, varchar, boolean, bigint, varchar, "
                   "timestamptz, varchar[], bigint[])")

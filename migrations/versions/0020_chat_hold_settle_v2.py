"""chat path v2: gw_chat_hold() reserves a limited key's spend and RAISEs on a refusal;
gw_chat_settle() gives the key's unused reservation back (PostgreSQL only)

Both run as ONE autocommit statement each on the request's hot-path connection
(``uow.one_statement``, ``app/services/billing/holds_pg.py``), like the metered call's
``gw_open_call`` (migration 0016): so a completion costs 2 PostgreSQL round trips and no
``BEGIN``/``COMMIT``, for a spend-limited key too.

``gw_chat_hold`` (same signature; ``p_spend_key_id`` is now the request's API key, whose
limit the function applies itself):

1. ``synchronous_commit = off`` for this transaction (settle/release commit durably
   before the answer is sent; docs/performance.md);
2. the key's spend limit (``app/services/accounts/spend.py``: same periods, same
   conditional upsert of ``key_spend``) — a hold that does not fit RAISEs SQLSTATE
   ``GWKSL``;
3. the conditional debit of every ``acct:`` leg (``balance + delta >= 0``) — an uncovered
   one RAISEs SQLSTATE ``GW402`` (it used to answer ``insufficient``: now a reservation
   may precede it, and only a RAISE makes the server undo it);
4. the ``held`` completion row (``spend_key_id`` set only when a counter was charged),
   then the ``chat_hold`` posting. Answers ``held``.

``gw_chat_settle`` (same signature and columns) also gives ``give_back`` (the unused part
of the hold) back to the counter of the hold's key for the period containing the hold's
time (``spend.release``: the key's current period, never below zero), so the settle is
one statement for every key. ``give_back`` now reports what was given back.

Downgrade: migration 0017's functions.

Revision ID: chat_hold_settle_v2
Revises: usage_daily
Create Date: 2026-11-23 02:30:00.000000
"""
import importlib.util
import os

from alembic import op

revision = "chat_hold_settle_v2"
down_revision = "usage_daily"
branch_labels = None
depends_on = None

# the start of the limit period containing a time (spend.period_bounds), as SQL
_PERIOD_START = """CASE {period}
                    WHEN 'day' THEN date_trunc('day', {utc}) AT TIME ZONE 'UTC'
                    WHEN 'week' THEN date_trunc('week', {utc}) AT TIME ZONE 'UTC'
                    WHEN 'month' THEN date_trunc('month', {utc}) AT TIME ZONE 'UTC'
                    ELSE timestamptz '1970-01-01 00:00:00+00' END"""

HOLD = r"""
CREATE OR REPLACE FUNCTION gw_chat_hold(
    p_id varchar, p_account_id varchar, p_requested_model varchar, p_stream boolean,
    p_hold bigint, p_spend_key_id varchar, p_now timestamptz,
    p_codes varchar[], p_amounts bigint[])
RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    v_txn bigint;
    v_n integer;
    v_limit bigint;
    v_period varchar;
    v_start timestamptz;
    v_spend_key varchar;
    i integer;
BEGIN
    -- 1. settle/release (durable) flush this transaction's WAL before any answer
    PERFORM set_config('synchronous_commit', 'off', true);

    -- 2. the key's spend limit, before any debit; a refusal undoes the whole statement
    IF p_spend_key_id IS NOT NULL AND p_hold > 0 THEN
        SELECT k.spend_limit_micros, k.spend_limit_period INTO v_limit, v_period
          FROM api_keys k WHERE k.id = p_spend_key_id;
        IF v_limit IS NOT NULL AND v_period IS NOT NULL THEN
            v_start := """ + _PERIOD_START.format(period="v_period", utc="(p_now AT TIME ZONE 'UTC')") + r""";
            v_n := 0;
            IF p_hold <= v_limit THEN
                INSERT INTO key_spend AS s (key_id, period_start, spent_micros)
                VALUES (p_spend_key_id, v_start, p_hold)
                ON CONFLICT (key_id, period_start) DO UPDATE
                   SET spent_micros = s.spent_micros + EXCLUDED.spent_micros
                 WHERE s.spent_micros + EXCLUDED.spent_micros <= v_limit;
                GET DIAGNOSTICS v_n = ROW_COUNT;
            END IF;
            IF v_n = 0 THEN
                RAISE EXCEPTION 'key spend limit' USING ERRCODE = 'GWKSL';
            END IF;
            v_spend_key := p_spend_key_id;
        END IF;
    END IF;

    -- 3. debits, each conditional; an uncovered one undoes the whole statement
    IF p_hold > 0 THEN
        FOR i IN 1 .. array_length(p_codes, 1) LOOP
            IF p_codes[i] LIKE 'acct:%' THEN
                UPDATE accounts SET balance_micros = balance_micros + p_amounts[i]
                 WHERE id = substr(p_codes[i], 6)
                   AND balance_micros + p_amounts[i] >= 0;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'insufficient funds' USING ERRCODE = 'GW402';
                END IF;
            END IF;
        END LOOP;
    END IF;

    -- 4. the held completion, then the posting
    INSERT INTO chat_completions (id, account_id, mode, requested_model, status, stream,
                                  hold_micros, spend_key_id, cost_micros, prompt_tokens,
                                  completion_tokens, usage_estimated, attempts, latency_ms,
                                  created_at)
    VALUES (p_id, p_account_id, 'live', p_requested_model, 'held', p_stream, p_hold,
            v_spend_key, 0, 0, 0, false, 0, 0, p_now);
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
    v_period varchar;
    v_held_at timestamptz;
    v_txn bigint;
    v_meta jsonb;
    v_back bigint;
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

    -- 5. the unused part of the hold back to the key's limit (spend.release: the period
    --    containing the hold's time, under the key's current period; never below zero;
    --    a charge above the hold is not counted)
    v_back := greatest(p_hold - v_charge, 0);
    IF v_key IS NOT NULL AND v_back > 0 THEN
        SELECT k.spend_limit_period INTO v_period FROM api_keys k WHERE k.id = v_key;
        IF v_period IS NOT NULL THEN
            UPDATE key_spend s SET spent_micros = greatest(s.spent_micros - v_back, 0)
             WHERE s.key_id = v_key
               AND s.period_start = """ + _PERIOD_START.format(period="v_period", utc="(v_held_at AT TIME ZONE 'UTC')") + r""";
        END IF;
    END IF;

    RETURN QUERY SELECT v_charge, v_key, v_held_at, v_back;
END
$fn$;
"""


def _v0017():
    path = os.path.join(os.path.dirname(__file__), "0017_chat_one_statement.py")
    spec = importlib.util.spec_from_file_location("_m0017", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def upgrade():
    if op.get_bind().dialect.name == "postgresql":
        op.execute(HOLD)
        op.execute(SETTLE)


def downgrade():
    if op.get_bind().dialect.name == "postgresql":
        old = _v0017()
        op.execute(old.HOLD)
        op.execute(old.SETTLE)

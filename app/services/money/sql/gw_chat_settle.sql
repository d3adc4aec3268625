-- gw_chat_settle(...): a chat completion's settle in ONE statement, after the upstream
-- answered: the exact charge (above the hold only what the balance can still give, the
-- rest recorded as shortfall), held -> settled once, the customer's part of the hold
-- back, the chat_settle posting, and the unused part of the hold given back to the key's
-- spend limit. Answers the charge, the key, the hold's time and what was given back;
-- no row when the completion was already settled or released.
-- Called by app/services/billing/holds_pg.py (settle).

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
               AND s.period_start = CASE v_period
                    WHEN 'day' THEN date_trunc('day', (v_held_at AT TIME ZONE 'UTC')) AT TIME ZONE 'UTC'
                    WHEN 'week' THEN date_trunc('week', (v_held_at AT TIME ZONE 'UTC')) AT TIME ZONE 'UTC'
                    WHEN 'month' THEN date_trunc('month', (v_held_at AT TIME ZONE 'UTC')) AT TIME ZONE 'UTC'
                    ELSE timestamptz '1970-01-01 00:00:00+00' END;
        END IF;
    END IF;

    RETURN QUERY SELECT v_charge, v_key, v_held_at, v_back;
END
$fn$;

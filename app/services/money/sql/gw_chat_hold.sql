-- gw_chat_hold(...): a chat completion's hold in ONE statement, before the first upstream
-- call: the key's spend limit (RAISEs SQLSTATE GWKSL when the hold does not fit), the
-- conditional debit of every acct: leg (RAISEs GW402 when uncovered; the statement is
-- undone), the 'held' completion row and the chat_hold posting. Answers 'held'.
-- Called by app/services/billing/holds_pg.py (hold).

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
            v_start := CASE v_period
                    WHEN 'day' THEN date_trunc('day', (p_now AT TIME ZONE 'UTC')) AT TIME ZONE 'UTC'
                    WHEN 'week' THEN date_trunc('week', (p_now AT TIME ZONE 'UTC')) AT TIME ZONE 'UTC'
                    WHEN 'month' THEN date_trunc('month', (p_now AT TIME ZONE 'UTC')) AT TIME ZONE 'UTC'
                    ELSE timestamptz '1970-01-01 00:00:00+00' END;
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

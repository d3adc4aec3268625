-- Per-key spend limits (issue 16 item 3) and members' monthly budgets (issue 37 item 4):
-- the period rule and the counters of key_spend and member_spend, written once. Called by
-- gw_open_calls, gw_chat_holds, gw_chat_settle and Python's money.spend (refunds, chat
-- releases, refusal details, key rotation).
--
-- A key with spend_limit_micros counts what it spends per spend_limit_period: day (UTC
-- midnight), week (ISO week, Monday 00:00 UTC), month (the 1st, 00:00 UTC) or total (one
-- period since 1970-01-01), in the key_spend row (key_id, period_start).
-- An organisation key (member_account_id set) also counts what it spends in its member's
-- month, in the member_spend row (org, member, month start): every organisation key of
-- the member together, whether the member has a budget or not (so a budget set or lowered
-- mid-month sees the month's spend), refused past org_members.monthly_budget_micros.
--
-- Count p_micros against the key's limit, then against its member's budget, for the
-- periods of p_now: one conditional upsert each (concurrent reserves serialize on the
-- counter rows). outcome: 'none' (no key, nothing to count: nothing written), 'reserved'
-- (counted: reserved_from is the start of the key's limit period when the key's counter
-- counted it, budget_member the member when the member's counter did — keep them: the
-- release goes back to THOSE periods, whatever the key's period is by then; the member's
-- month is the month of p_now), 'refused' (the key's limit) or 'budget_refused' (the
-- member's budget); a refusal leaves both counters as they were.
CREATE OR REPLACE FUNCTION gw_spend_reserve(p_key varchar, p_micros bigint, p_now timestamptz,
                                            OUT outcome text, OUT reserved_from timestamptz,
                                            OUT budget_member varchar)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_limit bigint;
    v_period varchar;
    v_org varchar;
    v_member varchar;
    v_budget bigint;
    v_from timestamptz;
    v_n integer;
BEGIN
    outcome := 'none';
    IF p_key IS NULL OR p_micros <= 0 THEN
        RETURN;
    END IF;
    SELECT k.spend_limit_micros, k.spend_limit_period, k.account_id, k.member_account_id,
           m.monthly_budget_micros
      INTO v_limit, v_period, v_org, v_member, v_budget
      FROM api_keys k
      LEFT JOIN org_members m ON m.org_id = k.account_id AND m.account_id = k.member_account_id
     WHERE k.id = p_key;

    -- 1. the key's own limit
    IF v_limit IS NOT NULL AND v_period IS NOT NULL THEN
        v_n := 0;
        v_from := (gw_period_bounds(v_period, p_now)).period_from;
        IF p_micros <= v_limit THEN
            INSERT INTO key_spend AS s (key_id, period_start, spent_micros)
            VALUES (p_key, v_from, p_micros)
            ON CONFLICT (key_id, period_start) DO UPDATE
               SET spent_micros = s.spent_micros + EXCLUDED.spent_micros
             WHERE s.spent_micros + EXCLUDED.spent_micros <= v_limit;
            GET DIAGNOSTICS v_n = ROW_COUNT;
        END IF;
        IF v_n = 0 THEN
            outcome := 'refused';
            RETURN;
        END IF;
        outcome := 'reserved';
        reserved_from := v_from;
    END IF;

    -- 2. the member's month (an organisation key): counted always, refused past a budget
    IF v_member IS NOT NULL THEN
        v_n := 0;
        IF v_budget IS NULL OR p_micros <= v_budget THEN
            INSERT INTO member_spend AS s (org_id, member_id, period_start, spent_micros)
            VALUES (v_org, v_member, (gw_period_bounds('month', p_now)).period_from, p_micros)
            ON CONFLICT (org_id, member_id, period_start) DO UPDATE
               SET spent_micros = s.spent_micros + EXCLUDED.spent_micros
             WHERE v_budget IS NULL OR s.spent_micros + EXCLUDED.spent_micros <= v_budget;
            GET DIAGNOSTICS v_n = ROW_COUNT;
        END IF;
        IF v_n = 0 THEN  -- the key's count of 1. back: a refusal counts nothing
            UPDATE key_spend s SET spent_micros = greatest(s.spent_micros - p_micros, 0)
             WHERE s.key_id = p_key AND s.period_start = reserved_from;
            outcome := 'budget_refused';
            reserved_from := NULL;
            RETURN;
        END IF;
        outcome := 'reserved';
        budget_member := v_member;
    END IF;
END
$fn$;

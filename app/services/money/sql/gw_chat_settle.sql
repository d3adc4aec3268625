-- gw_chat_settle: one chat completion's settle, the rule written once. Called by
-- gw_chat_settles for each row of its group (ONE autocommit statement, committed durably
-- before the answers leave; app/services/money/holds_pg.py).
--   1. the exact charge, never more than the hold (issue 39 item 7: what was held is the
--      most a completion costs the customer; a cost above it is recorded as shortfall);
--   2. held -> settled, once (by id and creation time: one partition); not held: no row;
--   3. the unused part of the hold back to the key's limit and the member's budget, in the
--      periods the hold was counted in (gw_spend_release; a charge above the hold is not
--      counted);
--   4. the posting through gw_post: hold:chat -H, customer +(H - C), revenue +C.
-- Returns (charged, the hold's spend-limited key, the hold's time, micros given back).
-- plan_cache_mode = force_generic_plan: the UPDATE targets one partition of
-- chat_completions, which a generic plan cannot know, so the plan cache built a custom
-- plan (planned again) on every call; the generic plan, pruned when it runs, costs the
-- backend about 9 per cent less CPU per hold+settle (BENCH_PG_AB=chat bench/pg_ab.py,
-- 41 partitions; bench/DIARY.md "Generic plans").
CREATE OR REPLACE FUNCTION gw_chat_settle(
    p_id varchar, p_created timestamptz, p_account_id varchar,
    p_customer varchar, p_hold_code varchar, p_revenue varchar,
    p_hold bigint, p_cost bigint, p_model varchar, p_provider varchar,
    p_prompt_tokens integer, p_completion_tokens integer, p_estimated boolean,
    p_attempts integer, p_latency_ms integer, p_error varchar, p_now timestamptz)
RETURNS TABLE (charged bigint, spend_key_id varchar, held_at timestamptz, give_back bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    v_charge bigint;
    v_key varchar;
    v_from timestamptz;
    v_actor varchar;
    v_member varchar;
    v_held_at timestamptz;
    v_meta jsonb;
    v_back bigint;
BEGIN
    v_charge := least(p_cost, p_hold);

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
    RETURNING c.spend_key_id, c.spend_reserved_from, c.actor, c.budget_member_id
         INTO v_key, v_from, v_actor, v_member;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    -- the unused part back to the key's counters first: every operation takes a key's
    -- spend counters before its account's balance row (docs/money.md, "Lock order")
    v_back := greatest(p_hold - v_charge, 0);
    IF v_key IS NOT NULL OR v_member IS NOT NULL THEN
        PERFORM gw_spend_release(v_key, v_back, v_from, p_account_id, v_member, v_held_at);
    END IF;

    IF p_hold <> 0 OR v_charge <> 0 THEN
        v_meta := jsonb_build_object('model', p_model, 'provider', p_provider,
                                     'prompt_tokens', p_prompt_tokens,
                                     'completion_tokens', p_completion_tokens,
                                     'estimated', p_estimated);
        IF p_cost > v_charge THEN
            v_meta := v_meta || jsonb_build_object('shortfall_micros', p_cost - v_charge);
        END IF;
        PERFORM gw_post('chat_settle', 'chat_settle:' || p_id, p_account_id, v_actor, v_meta,
                        ARRAY[p_hold_code, p_customer, p_revenue]::varchar[],
                        ARRAY[-p_hold, p_hold - v_charge, v_charge]::bigint[], p_now);
    END IF;

    RETURN QUERY SELECT v_charge, v_key, v_held_at, v_back;
END
$fn$;
